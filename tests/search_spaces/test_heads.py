"""The ``cnn_s`` / ``cnn_l`` / ``mbconv`` head (issue 40): flatten (default) or the papers'
GAP, by hand."""

from dataclasses import replace

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
    with pytest.raises(ValueError, match=r"'space.head' = 'avg'.*one of auto, flatten, gap"):
        parse_run_config({**pyproject_run_config(), "space.head": "avg"})
    with pytest.raises(ValueError, match=r"'space.head' = 'gap'.*only the cnn_s, cnn_l, mbconv"):
        parse_run_config({**pyproject_run_config(), "space.name": "rnn", "space.head": "gap"})
    # "auto" (the default): flatten for cnn_s / cnn_l / mbconv (since issue 40's FDNAS
    # check), also when FDNAS's runner sets the name after parsing
    assert default.space.head == "auto"
    mbconv = parse_run_config({**pyproject_run_config(), "space.name": "mbconv"})
    assert space_kwargs(mbconv.space, dataset_info(mbconv.data))["head"] == "flatten"
    fdnas = replace(default.space, name="mbconv")
    assert space_kwargs(fdnas, dataset_info(default.data))["head"] == "flatten"
    gap = parse_run_config({**pyproject_run_config(), "space.head": "gap"})
    assert space_kwargs(replace(gap.space, name="mbconv"), dataset_info(gap.data)) == {
        **space_kwargs(fdnas, dataset_info(default.data)),
        "head": "gap",
    }
    cnn_l = parse_run_config({**pyproject_run_config(), "space.name": "cnn_l"})
    assert space_kwargs(cnn_l.space, dataset_info(cnn_l.data))["head"] == "flatten"
    assert replace(default.space, name="rnn").resolved_head() == "flatten"  # unused there


@pytest.mark.parametrize(
    # width 0.25: the 1x1 head has 128 x 0.25 = 32 channels; the stem and the stages' first
    # layers stride 2, 2, 2, 1: 28 -> 14 -> 7 -> 4 -> 4, 32x32 -> 4x4, 40x51 -> 5x7
    ("image", "side"),
    [(MNIST, (4, 4)), ({**MNIST, "input_height": 32, "input_width": 32}, (4, 4)), (SPEECH, (5, 7))],
)
def test_mbconv_flatten_head_reads_the_head_feature_map(image, side):
    space = build_space("mbconv", **image, width=0.25, layers_per_stage=1, head="flatten")
    features = 32 * side[0] * side[1]
    assert space.net.classifier.in_features == features
    gap = build_space("mbconv", **image, width=0.25, layers_per_stage=1)
    assert gap.spec["head"] == "gap"  # the paper's, the space's default
    assert gap.net.classifier.in_features == 32
    extra = (features - 32) * image["num_classes"]
    assert space.fixed_cost.params - gap.fixed_cost.params == extra
    assert space.fixed_cost.flops - gap.fixed_cost.flops == 2 * extra
    x = torch.randn(3, 1, image["input_height"], image["input_width"])
    for arch in ((0,) * 3, tuple(n - 1 for n in space.num_options())):
        assert space.subnet(arch).eval()(x).shape == (3, image["num_classes"])
    with pytest.raises(ValueError, match="head must be one of flatten, gap, got 'max'"):
        build_space("mbconv", **image, head="max")


@pytest.mark.parametrize(
    ("name", "options", "dropped"),
    [
        # fedorasflwr 0.2 named neither the head nor the reduction: GAP and the paper's
        ("cnn_s", {"head": "gap", "reduction": PAPER_REDUCTION}, ("head", "reduction")),
        # 0.4.0's mbconv had no head choice: GAP
        ("mbconv", {"head": "gap", "layers_per_stage": 1}, ("head",)),
        # today's file names its flatten head
        ("mbconv", {"head": "flatten", "layers_per_stage": 1}, ()),
    ],
)
def test_a_model_file_loads_with_the_head_it_was_written_with(tmp_path, name, options, dropped):
    space = build_space(name, **MNIST, width=0.25, **options)
    arch = tuple(n - 2 for n in space.num_options())
    subnet = space.subnet(arch).eval()
    spec = {k: v for k, v in space.spec.items() if k not in dropped}
    path = save_checkpoint(
        tmp_path / "model.pt",
        space_spec=spec,
        arrays=ArrayRecord(subnet.state_dict()),
        stage="finetune",
        arch=list(arch),
    )
    x = torch.randn(2, 1, 28, 28)
    torch.testing.assert_close(load_model(path)(x), subnet(x))


def test_checkpoints_written_before_auto_bind_the_same_head_settings():
    """0.4.0 bound ``space.head = "flatten"`` (its default) into every checkpoint; "auto",
    today's default, is bound so, so those resume; an explicit GAP stays apart."""
    from fedorasflwr.checkpoints import check_bound_settings
    from fedorasflwr.config import bound_settings

    def bound(method: str, **overrides) -> dict:
        settings = parse_run_config({**pyproject_run_config(), "method": method, **overrides})
        return bound_settings(method, settings.values)

    for method in ("fedoras", "fdnas"):
        current = bound(method)
        assert current["space.head"] == "flatten"
        old = {**current, "space.head": "flatten"}  # as 0.4.0 wrote it
        check_bound_settings("here", old, current, method)
        with pytest.raises(ValueError, match="'space.head' = 'flatten' there, 'gap' here"):
            check_bound_settings("here", old, bound(method, **{"space.head": "gap"}), method)


@pytest.mark.parametrize(
    # width 0.5 (C = 4), 4 cells, reductions at cells 1 and 2 (C 4 -> 8 -> 16, the last cell
    # 4 x 16 = 64 channels); stem stride 2: 28 -> 14 -> 7 -> 4, 32x32 -> 4x4; stride 1 on
    # 40x51: 40 -> 20 -> 10, 51 -> 26 -> 13 ((n - 1) // 2 + 1 per reduction)
    ("image", "stem_stride", "side"),
    [
        (MNIST, 2, (4, 4)),
        ({**MNIST, "input_height": 32, "input_width": 32}, 2, (4, 4)),
        (SPEECH, 1, (10, 13)),
    ],
)
def test_darts_flatten_head_reads_the_last_cells_map(image, stem_stride, side):
    """The supernet and its derived nets take the head the spec names; GAP (DARTS's) is the
    class's default (``space.head = "auto"`` gives the darts space flatten)."""
    options = {"channels": 4, "cells": 4, "stem_stride": stem_stride}
    space = build_space("darts", **image, **options, head="flatten")
    assert space.spec["head"] == "flatten"
    features = 64 * side[0] * side[1]
    assert space.net.classifier.in_features == features
    gap = build_space("darts", **image, **options)
    assert gap.spec["head"] == "gap" and gap.net.classifier.in_features == 64
    extra = (features - 64) * image["num_classes"]
    assert space.fixed_cost.params - gap.fixed_cost.params == extra
    assert space.fixed_cost.flops - gap.fixed_cost.flops == 2 * extra
    x = torch.randn(3, 1, image["input_height"], image["input_width"])
    assert space(x).shape == (3, image["num_classes"])
    spec = {k: v for k, v in space.spec.items() if k != "name"}
    derived = type(space).derived_network(space.genotype().to_text(), **spec)
    assert derived.classifier.in_features == features
    assert derived.eval()(x).shape == (3, image["num_classes"])
    with pytest.raises(ValueError, match="head must be one of flatten, gap, got 'max'"):
        build_space("darts", **image, head="max")


def test_the_darts_run_config_head_reaches_the_space():
    darts = {**pyproject_run_config(), "space.name": "darts"}
    default = parse_run_config(darts)  # "auto": flatten (issue 40)
    kwargs = space_kwargs(default.space, dataset_info(default.data))
    assert build_space(**kwargs).spec["head"] == "flatten"
    gap = parse_run_config({**darts, "space.head": "gap"})
    assert space_kwargs(gap.space, dataset_info(gap.data))["head"] == "gap"


@pytest.mark.parametrize(("head", "dropped"), [("gap", True), ("flatten", False)])
def test_a_derived_model_file_loads_with_its_head(tmp_path, head, dropped):
    """A derived net's file written before the darts space had a head (no ``head`` in its
    spec) loads with GAP, the only head there was; today's files name theirs."""
    from fedorasflwr import save_model

    space = build_space("darts", **MNIST, channels=2, cells=1, stem_stride=2, head=head)
    genotype = space.genotype()
    spec = {k: v for k, v in space.spec.items() if not (dropped and k == "head")}
    derived = type(space).derived_network(genotype.to_text(), **spec).eval()
    path = save_model(tmp_path / "derived.pt", derived, space=spec, genotype=genotype)
    x = torch.randn(2, 1, 28, 28)
    loaded = load_model(path)
    assert loaded.head == head
    torch.testing.assert_close(loaded(x), derived(x))
