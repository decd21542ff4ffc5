"""The ``cnn_s`` reduction (issue 40): max pooling then the conv1x1 (the default since 0.5.0),
or the paper's conv1x1 then average pooling; by hand, in the run config, and in files of
earlier versions (all the paper's)."""

import math

import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord

from fedorasflwr import load_model
from fedorasflwr.artifacts import save_checkpoint
from fedorasflwr.checkpoints import FORMAT, read_resume
from fedorasflwr.config import bound_settings, parse_run_config, space_kwargs
from fedorasflwr.data.catalog import dataset_info
from fedorasflwr.methods.fedoras.runner import resume_supernet
from fedorasflwr.search_spaces import build_space
from fedorasflwr.search_spaces.cnn import (
    DEFAULT_REDUCTION,
    PAPER_REDUCTION,
    PoolReduction,
    as_written,
)
from tests.runconfig import pyproject_run_config

MAXPOOL = "maxpool-conv1x1"
MNIST = {"num_classes": 10, "in_channels": 1, "input_height": 28, "input_width": 28}


def _unit_reduction(order: str) -> PoolReduction:
    """One channel in and out, conv weight 2, BatchNorm at its init (eval: x / sqrt(1 + eps))."""
    reduction = PoolReduction(1, 1, order=order).eval()
    with torch.no_grad():
        reduction.conv.conv.weight.fill_(2.0)
    return reduction


def test_max_pooling_first_by_hand():
    x = (torch.arange(16.0) - 8).reshape(1, 1, 4, 4)
    # 3x3 windows, stride 2, padding 1 over rows / columns {-1..1, 1..3}: the maxima are
    # x[1,1] = -3, x[1,3] = -1, x[3,1] = 5, x[3,3] = 7; then 2x, BN, ReLU
    scale = 1 / math.sqrt(1 + 1e-5)
    expected = torch.tensor([[0.0, 0.0], [10 * scale, 14 * scale]]).reshape(1, 1, 2, 2)
    torch.testing.assert_close(_unit_reduction("maxpool-conv1x1")(x), expected)


def test_the_papers_order_averages_after_the_conv():
    x = (torch.arange(16.0) - 8).reshape(1, 1, 4, 4)
    features = F.relu(2 * x / math.sqrt(1 + 1e-5))
    # top-left window: rows and columns -1..1 (padding counts as zero, 9 cells):
    # the positive cells of x[0:2, 0:2] = [[-8, -7], [-4, -3]]: none
    expected = F.avg_pool2d(features, 3, stride=2, padding=1)
    out = _unit_reduction("conv1x1-avgpool")(x)
    torch.testing.assert_close(out, expected)
    assert out[0, 0, 0, 0] == 0
    # bottom-right window: rows and columns 1..3; its positive cells are 1, 2, 3, 5, 6, 7
    hand = 2 * (1 + 2 + 3 + 5 + 6 + 7) / 9 / math.sqrt(1 + 1e-5)
    assert out[0, 0, 1, 1].item() == pytest.approx(hand)


def test_both_orders_hold_the_same_weights_and_pooling_first_costs_a_quarter():
    maxpool = build_space("cnn_s", **MNIST, width=0.5)
    paper = build_space("cnn_s", **MNIST, width=0.5, reduction=PAPER_REDUCTION)
    assert paper.spec["reduction"] == PAPER_REDUCTION == "conv1x1-avgpool"
    assert maxpool.spec["reduction"] == DEFAULT_REDUCTION == MAXPOOL
    assert {k: v.shape for k, v in maxpool.state_dict().items()} == {
        k: v.shape for k, v in paper.state_dict().items()
    }
    # stem 8 -> 12 -> 18 -> 28 channels; the conv1x1s run at 28, 14, 7 px (paper) or at
    # 14, 7, 4 px (pooled first: (n - 1) // 2 + 1)
    paper_macs = 28 * 28 * 8 * 12 + 14 * 14 * 12 * 18 + 7 * 7 * 18 * 28
    pooled_macs = 14 * 14 * 8 * 12 + 7 * 7 * 12 * 18 + 4 * 4 * 18 * 28
    assert paper.fixed_cost.flops - maxpool.fixed_cost.flops == 2 * (paper_macs - pooled_macs)
    assert paper.fixed_cost.params == maxpool.fixed_cost.params
    arch = tuple(n - 1 for n in maxpool.num_options())
    x = torch.randn(2, 1, 28, 28)
    assert maxpool.subnet(arch).eval()(x).shape == paper.subnet(arch).eval()(x).shape


def test_a_bad_reduction_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="reduction must be one of conv1x1-avgpool, maxpool-"):
        build_space("cnn_s", **MNIST, reduction="maxpool")


def test_the_run_config_key_reaches_the_space_and_is_checked():
    settings = parse_run_config({**pyproject_run_config(), "space.reduction": PAPER_REDUCTION})
    info = dataset_info(settings.data)
    assert space_kwargs(settings.space, info)["reduction"] == PAPER_REDUCTION
    default = parse_run_config(pyproject_run_config())
    assert default.space.reduction == "auto"
    assert space_kwargs(default.space, info)["reduction"] == MAXPOOL
    with pytest.raises(ValueError, match=r"'space.reduction' = 'max'.*one of auto, conv1x1-"):
        parse_run_config({**pyproject_run_config(), "space.reduction": "max"})
    for other in (MAXPOOL, PAPER_REDUCTION):
        with pytest.raises(ValueError, match=r"'space.reduction' = .*only the cnn_s space"):
            parse_run_config(
                {**pyproject_run_config(), "space.name": "cnn_l", "space.reduction": other}
            )
    cnn_l = parse_run_config({**pyproject_run_config(), "space.name": "cnn_l"})
    assert "reduction" not in space_kwargs(cnn_l.space, info)


def test_a_file_written_before_the_choice_holds_the_papers_reduction(tmp_path):
    space = build_space("cnn_s", **MNIST, width=0.25, reduction=PAPER_REDUCTION)
    arch = tuple(n - 2 for n in space.num_options())
    subnet = space.subnet(arch).eval()
    old_spec = {k: v for k, v in space.spec.items() if k != "reduction"}  # fedorasflwr 0.4.0
    assert as_written(old_spec) == space.spec
    path = save_checkpoint(
        tmp_path / "tier-1.pt",
        space_spec=old_spec,
        arrays=ArrayRecord(subnet.state_dict()),
        stage="finetune",
        arch=list(arch),
    )
    x = torch.randn(2, 1, 28, 28)
    loaded = load_model(path)
    # read as the paper's by as_written (above), not as the default: its reductions
    assert [m.pool_first for m in loaded.modules() if isinstance(m, PoolReduction)] == [False] * 3
    torch.testing.assert_close(loaded(x), subnet(x))
    # the same weights under the other reduction compute something else
    pooled = build_space("cnn_s", **MNIST, width=0.25, reduction=MAXPOOL).subnet(arch).eval()
    pooled.load_state_dict(subnet.state_dict())
    assert not torch.allclose(pooled(x), subnet(x))


def _bound(**overrides) -> tuple[dict, object]:
    settings = parse_run_config({**pyproject_run_config(), "seed": 3, **overrides})
    return bound_settings(settings.method, settings.values), settings


def test_a_checkpoint_of_an_earlier_version_resumes_with_the_papers_reduction(tmp_path):
    """A FedorAS checkpoint written before ``space.reduction`` (its space spec and settings
    name no reduction) resumes under ``space.reduction = "conv1x1-avgpool"``, the paper's
    reduction it was trained with, and is refused, naming the space, under the default
    (max pooling first since 0.5.0; bound as a checkpoint that set it names it)."""
    paper_settings, settings = _bound(**{"space.reduction": PAPER_REDUCTION})
    assert "space.reduction" not in paper_settings  # bound as before the key existed
    maxpool_settings, _ = _bound()
    assert maxpool_settings["space.reduction"] == MAXPOOL
    assert _bound(**{"space.reduction": MAXPOOL})[0] == maxpool_settings
    space = build_space(**space_kwargs(settings.space, dataset_info(settings.data)))
    old_spec = {k: v for k, v in space.spec.items() if k != "reduction"}
    path = tmp_path / "checkpoint.pt"
    torch.save(
        {
            "format": FORMAT,
            "method": "fedoras",
            "seed": 3,
            "space": old_spec,
            "state_dict": {k: v.clone() for k, v in space.state_dict().items()},
            "stage": "supernet",
            "step": 1,
            "stage-done": False,
            "settings": paper_settings,
        },
        path,
    )

    def resume(spec, bound):
        return read_resume(
            str(path),
            method="fedoras",
            seed=3,
            reference=space.state_dict(),
            space=spec,
            settings=bound,
        )

    assert resume(space.spec, paper_settings).step == 1
    maxpool_space = build_space(**{**space.spec, "reduction": MAXPOOL})
    with pytest.raises(ValueError, match="holds weights of the space"):
        resume(maxpool_space.spec, maxpool_settings)


def test_only_fedoras_on_cnn_s_binds_the_reduction():
    """The other methods build their own spaces (FDNAS mbconv, DP-FNAS / FedNAS darts,
    DecNAS and the width baselines their nets), and FedorAS on cnn_l or rnn has no reduction:
    their checkpoints bind none, as before the key, so those of earlier versions resume."""
    for method in ("fdnas", "cfdnas", "dpfnas", "fednas", "decnas", "heterofl", "fjord"):
        assert "space.reduction" not in _bound(method=method)[0], method
    assert "space.reduction" not in _bound(**{"space.name": "cnn_l"})[0]
    assert _bound()[0]["space.reduction"] == MAXPOOL


def test_a_stage_1_supernet_of_an_earlier_version_is_resumed_as_the_papers(tmp_path):
    """``fedoras.resume-from`` (``resume_supernet``): a 0.4 ``supernet.pt`` names no
    reduction; it resumes into the paper's space and is refused by the default, max pooling."""
    space = build_space("cnn_s", **MNIST, width=0.25, reduction=PAPER_REDUCTION)
    old_spec = {k: v for k, v in space.spec.items() if k != "reduction"}
    path = save_checkpoint(
        tmp_path / "supernet.pt",
        space_spec=old_spec,
        arrays=ArrayRecord(space.state_dict()),
        stage="supernet",
    )
    arrays = resume_supernet(str(path), space).to_torch_state_dict()
    assert all(torch.equal(arrays[k], v) for k, v in space.state_dict().items())
    maxpool = build_space("cnn_s", **MNIST, width=0.25)
    with pytest.raises(ValueError, match="not a Stage-1 checkpoint of this run's space"):
        resume_supernet(str(path), maxpool)
