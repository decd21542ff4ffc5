"""``cnn_l``'s block layout: the paper's 4 x 4 CIFAR supernet beside the default 3 x 4, its
size and cost (the numbers docs/fedoras.md states), and a model file that rebuilds it."""

import pytest
import torch
from flwr.app import ArrayRecord

from fedorasflwr import load_model
from fedorasflwr.artifacts import save_checkpoint
from fedorasflwr.config import parse_run_config
from fedorasflwr.search_spaces import build_space
from tests.runconfig import pyproject_run_config

CIFAR = {"num_classes": 10, "in_channels": 3, "input_height": 32, "input_width": 32}


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(
    # blocks, searchable layers, supernet parameters, MACs of the cheapest and dearest path
    # (FLOPs / 2: FlopCounterMode counts a multiply-add as 2), the values docs/fedoras.md states
    # for the paper's space (its GAP head; the default flatten head adds a few parameters)
    ("blocks", "layers", "params", "min_macs", "max_macs"),
    [(3, 12, 8.807e6, 16.77e6, 648.3e6), (4, 16, 20.80e6, 18.18e6, 710.9e6)],
)
def test_the_cifar_supernet_at_full_width_has_the_size_and_cost_the_docs_state(
    blocks, layers, params, min_macs, max_macs
):
    space = build_space("cnn_l", **CIFAR, width=1.0, blocks=blocks, head="gap")
    assert len(space.choices) == layers
    assert _params(space) == pytest.approx(params, rel=1e-3)
    assert space.min_flops() / 2 == pytest.approx(min_macs, rel=1e-3)
    assert space.max_flops() / 2 == pytest.approx(max_macs, rel=1e-3)


def test_the_paper_layout_is_within_7_percent_of_its_22_3m_parameters_and_716m_macs():
    # Sec. 4.5: the whole CIFAR-10 supernet is 22.3M parameters; Table 8: its dearest path
    # 716.0M "FLOPs" (multiply-adds: 2x that in FLOPs would be 1432M)
    space = build_space("cnn_l", **CIFAR, width=1.0, blocks=4, head="gap")
    assert _params(space) == pytest.approx(22.3e6, rel=0.07)
    assert space.max_flops() / 2 == pytest.approx(716.0e6, rel=0.01)


def test_the_block_count_is_in_the_spec_and_a_model_file_rebuilds_it(tmp_path):
    space = build_space("cnn_l", **CIFAR, width=0.125, layers_per_block=1, blocks=5)
    assert space.spec["blocks"] == 5 and len(space.choices) == 5
    arch = tuple(n - 2 for n in space.num_options())
    subnet = space.subnet(arch).eval()
    path = save_checkpoint(
        tmp_path / "tier-1.pt",
        space_spec=space.spec,
        arrays=ArrayRecord(subnet.state_dict()),
        stage="finetune",
        arch=list(arch),
    )
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(load_model(path)(x), subnet(x))


def test_the_default_keeps_three_blocks_and_bad_counts_are_refused():
    assert build_space("cnn_l", **CIFAR, width=0.125).spec["blocks"] == 3
    with pytest.raises(ValueError, match="blocks must be an integer >= 1, got 0"):
        build_space("cnn_l", **CIFAR, width=0.125, blocks=0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"space.name": "cnn_l", "space.blocks": 0}, r"'space.blocks' = 0.*1\.\.6"),
        ({"space.name": "cnn_l", "space.blocks": 7}, r"'space.blocks' = 7.*1\.\.6"),
        ({"space.name": "cnn_s", "space.blocks": 4}, r"'space.blocks' = 4.*only the cnn_l"),
    ],
)
def test_the_run_config_key_is_checked(overrides, message):
    with pytest.raises(ValueError, match=message):
        parse_run_config({**pyproject_run_config(), **overrides})


def test_the_run_config_key_reaches_the_space():
    settings = parse_run_config(
        {**pyproject_run_config(), "space.name": "cnn_l", "space.blocks": 4, "space.width": 0.125}
    )
    assert settings.space.blocks == 4
