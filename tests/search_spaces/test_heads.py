"""The ``cnn_s`` / ``cnn_l`` head (issue 40): flatten (default) or the paper's GAP, by hand."""

import pytest
import torch
from flwr.app import ArrayRecord

from fedorasflwr import load_model
from fedorasflwr.artifacts import save_checkpoint
from fedorasflwr.config import parse_run_config, space_kwargs
from fedorasflwr.data.catalog import dataset_info
from fedorasflwr.search_spaces import build_space
from fedorasflwr.search_spaces.cnn import PAPER_REDUCTION
from tests.runconfig import pyproject_run_config

MNIST = {"num_classes": 10, "in_channels": 1, "input_height": 28, "input_width": 28}
SPEECH = {"num_classes": 12, "in_channels": 1, "input_height": 40, "input_width": 51}


@pytest.mark.parametrize(
    # channels after three reductions at width 0.5 (stem 8 -> 12 -> 18 -> 28, even), and the
    # size: 28 -> 14 -> 7 -> 4 ((n - 1) // 2 + 1 per reduction); 40x51 -> 5x7
    ("image", "stem_stride", "features"),
    [(MNIST, 1, 28 * 4 * 4), (MNIST, 2, 28 * 2 * 2), (SPEECH, 1, 28 * 5 * 7)],
)
def test_the_flatten_head_reads_the_whole_last_feature_map(image, stem_stride, features):
    space = build_space("cnn_s", **image, width=0.5, stem_stride=stem_stride)
    assert space.spec["head"] == "flatten"
    assert space.net.classifier.in_features == features
    gap = build_space("cnn_s", **image, width=0.5, stem_stride=stem_stride, head="gap")
    assert gap.net.classifier.in_features == 28
    # only the classifier differs: (features - 28) more weights per class, and its MACs
    extra = (features - 28) * image["num_classes"]
    assert space.fixed_cost.params - gap.fixed_cost.params == extra
    assert space.fixed_cost.flops - gap.fixed_cost.flops == 2 * extra
    arch = tuple(n - 1 for n in space.num_options())
    x = torch.randn(3, 1, image["input_height"], image["input_width"])
    assert space.subnet(arch).eval()(x).shape == (3, image["num_classes"])


def test_cnn_l_takes_the_head_too():
    cifar = {"num_classes": 10, "in_channels": 3, "input_height": 32, "input_width": 32}
    space = build_space("cnn_l", **cifar, width=0.125, layers_per_block=1)
    # stem 8 -> 12 -> 18 -> 28 channels (even), 32 -> 16 -> 8 -> 4
    assert space.net.classifier.in_features == 28 * 4 * 4


def test_a_bad_head_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="head must be one of flatten, gap, got 'max'"):
        build_space("cnn_s", **MNIST, head="max")


def test_the_run_config_key_reaches_the_space_and_is_checked():
    settings = parse_run_config({**pyproject_run_config(), "space.head": "gap"})
    assert settings.space.head == "gap"
    assert space_kwargs(settings.space, dataset_info(settings.data))["head"] == "gap"
    default = parse_run_config(pyproject_run_config())
    assert space_kwargs(default.space, dataset_info(default.data))["head"] == "flatten"
    with pytest.raises(ValueError, match=r"'space.head' = 'avg'.*one of flatten, gap"):
        parse_run_config({**pyproject_run_config(), "space.head": "avg"})
    with pytest.raises(ValueError, match=r"'space.head' = 'gap'.*only the cnn_s and cnn_l"):
        parse_run_config({**pyproject_run_config(), "space.name": "rnn", "space.head": "gap"})


def test_a_file_written_before_the_head_was_a_choice_loads_as_gap(tmp_path):
    space = build_space("cnn_s", **MNIST, width=0.25, head="gap", reduction=PAPER_REDUCTION)
    arch = tuple(n - 2 for n in space.num_options())
    subnet = space.subnet(arch).eval()
    # fedorasflwr 0.2 named neither the head nor the reduction
    old_spec = {k: v for k, v in space.spec.items() if k not in ("head", "reduction")}
    path = save_checkpoint(
        tmp_path / "tier-1.pt",
        space_spec=old_spec,
        arrays=ArrayRecord(subnet.state_dict()),
        stage="finetune",
        arch=list(arch),
    )
    x = torch.randn(2, 1, 28, 28)
    torch.testing.assert_close(load_model(path)(x), subnet(x))
