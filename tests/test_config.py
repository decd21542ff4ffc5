"""Run config parsing: defaults from pyproject, clear errors before any training."""

import re

import pytest
import torch

from fedorasflwr.artifacts import plain
from fedorasflwr.config import RunSettings, bound_settings, parse_run_config
from tests.runconfig import pyproject_run_config


def test_pyproject_defaults_parse():
    settings = parse_run_config(pyproject_run_config())
    assert settings.method == "fedoras"
    assert settings.data.dataset == "mnist5k"
    assert settings.data.seed == settings.seed
    assert settings.method_settings.num_tiers == 4
    assert settings.output_path.is_absolute()


@pytest.mark.parametrize(
    ("name", "kwarg", "depth"),
    [("cnn_l", "layers_per_block", 2), ("mbconv", "layers_per_stage", 2), ("darts", "cells", 4)],
)
def test_layers_per_block_auto_gives_each_space_its_own_depth(name, kwarg, depth):
    from dataclasses import replace

    from fedorasflwr.config import space_kwargs
    from fedorasflwr.data import dataset_info

    default = parse_run_config(pyproject_run_config())
    assert default.space.layers_per_block == "auto"
    info = dataset_info(default.data)
    # "auto" also when FDNAS's runner sets the name after parsing
    assert space_kwargs(replace(default.space, name=name), info)[kwarg] == depth
    chosen = parse_run_config({**pyproject_run_config(), "space.layers-per-block": 3})
    assert space_kwargs(replace(chosen.space, name=name), info)[kwarg] == 3
    # a checkpoint binds "auto" as 4, the default before it (darts checkpoints resume; an
    # mbconv or cnn_l one of 4 layers is told apart by its space spec)
    assert bound_settings("fdnas", default.values)["space.layers-per-block"] == 4
    for bad, fragment in ((0, "allowed: auto or 1..8"), ("deep", "expected a int (auto or 1..8")):
        message = re.escape(f"'space.layers-per-block' = {bad!r}: {fragment}")
        with pytest.raises(ValueError, match=message):
            parse_run_config({**pyproject_run_config(), "space.layers-per-block": bad})


def _fdnas(**overrides):
    """FDNAS's settings over the pyproject defaults, and the ``mbconv`` space they build."""
    from dataclasses import replace

    from fedorasflwr.config import space_kwargs
    from fedorasflwr.data import dataset_info
    from fedorasflwr.search_spaces import build_space

    settings = parse_run_config({**pyproject_run_config(), "method": "fdnas", **overrides})
    space = build_space(
        **space_kwargs(replace(settings.space, name="mbconv"), dataset_info(settings.data))
    )
    return settings, space


def _fdnas_checkpoint(tmp_path, settings, space):
    """A search-stage checkpoint of an FDNAS run of ``settings`` (one step done)."""
    from fedorasflwr.checkpoints import FORMAT

    path = tmp_path / "checkpoint.pt"
    torch.save(
        {
            "format": FORMAT,
            "method": "fdnas",
            "seed": settings.seed,
            "space": dict(space.spec),
            "state_dict": {k: v.clone() for k, v in space.state_dict().items()},
            "stage": "search",
            "step": 1,
            "stage-done": False,
            "settings": bound_settings("fdnas", settings.values),
        },
        path,
    )
    return path, {"search": settings.method_settings.train.rounds}


def test_an_fdnas_checkpoint_of_the_old_default_depth_is_refused_then_resumes_with_it(tmp_path):
    """0.4.0's FDNAS searched 4 ``mbconv`` layers a stage and bound the depth as 4, as
    "auto" binds today (settings alike); its checkpoint is refused by today's default space
    (2 layers a stage), naming both spaces, and resumes with ``space.layers-per-block = 4``."""
    from fedorasflwr.runs import resume_checkpoint

    old_settings, old_space = _fdnas(**{"space.layers-per-block": 4})
    assert old_space.spec["layers_per_stage"] == 4
    path, stages = _fdnas_checkpoint(tmp_path, old_settings, old_space)
    today, space = _fdnas(**{"resume-from": str(path)})
    assert space.spec["layers_per_stage"] == 2
    # the settings agree ("auto" binds as 4), so the space spec is what tells them apart
    assert bound_settings("fdnas", today.values) == bound_settings("fdnas", old_settings.values)
    with pytest.raises(ValueError, match="holds weights of the space .*'layers_per_stage': 4"):
        resume_checkpoint(today, space, stages)
    chosen, four = _fdnas(**{"resume-from": str(path), "space.layers-per-block": 4})
    resumed = resume_checkpoint(chosen, four, stages)
    assert resumed is not None and resumed.step == 1


def test_an_fdnas_checkpoint_of_the_gap_head_is_refused_then_resumes_with_it(tmp_path):
    """Before issue 40's switch FDNAS built ``mbconv`` with GAP and clipped nothing; its
    checkpoint is refused by today's defaults (flatten head, clip 5) and resumes with
    ``space.head = "gap"`` and ``fdnas.grad-clip = 0``."""
    from fedorasflwr.runs import resume_checkpoint

    paper = {"space.head": "gap", "fdnas.grad-clip": 0.0}
    old_settings, old_space = _fdnas(**paper)
    assert old_space.spec["head"] == "gap"
    path, stages = _fdnas_checkpoint(tmp_path, old_settings, old_space)
    today, space = _fdnas(**{"resume-from": str(path)})
    assert space.spec["head"] == "flatten" and today.method_settings.train.grad_clip == 5.0
    with pytest.raises(ValueError, match="holds weights of the space .*'head': 'gap'"):
        resume_checkpoint(today, space, stages)
    # the clip alone (the GAP space kept) is a setting the checkpoint is bound to
    assert bound_settings("fdnas", old_settings.values)["fdnas.grad-clip"] == 0.0
    gap_only, gap_space = _fdnas(**{"resume-from": str(path), "space.head": "gap"})
    with pytest.raises(ValueError, match="grad-clip"):
        resume_checkpoint(gap_only, gap_space, stages)
    chosen, gap = _fdnas(**{"resume-from": str(path), **paper})
    resumed = resume_checkpoint(chosen, gap, stages)
    assert resumed is not None and resumed.step == 1


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("method", "fednope", "method"),
        ("seed", -1, "seed"),
        ("space.name", "resnet", "space.name"),
        ("space.width", 0.0, "space.width"),
        ("fedoras.rounds", -3, "fedoras.rounds"),
        ("fedoras.lr", 0.0, "fedoras.lr"),
        ("fedoras.lr", "fast", "fedoras.lr"),
        ("fedoras.comm-budget", 1.5, "fedoras.comm-budget"),
        ("fedoras.tier-proportions", "0.5,0.5", "fedoras.tier-proportions"),
        ("fedoras.tier-proportions", "0.5,0.5,0.5,x", "fedoras.tier-proportions"),
        ("fedoras.rho-low", 0.99, "fedoras.rho-low"),
        ("fedoras.min-replies", 50, "fedoras.min-replies"),
        ("fedoras.aggregation", "median", "fedoras.aggregation"),
        ("fedoras.search-scoring", "oracle", "fedoras.search-scoring"),
        ("fedoras.search-objective", "latency", "fedoras.search-objective"),
        ("fedoras.search-population", 1, "fedoras.search-population"),
        ("fedoras.search-evaluations", 4, "fedoras.search-evaluations"),
        ("fedoras.search-clients", 0, "fedoras.search-clients"),
        ("fedoras.finetune-rounds", -1, "fedoras.finetune-rounds"),
        ("fedoras.finetune-lr-decay", 2.0, "fedoras.finetune-lr-decay"),
        ("fedoras.finetune-momentum", 1.0, "fedoras.finetune-momentum"),
        ("fedoras.stop-after", "deploy", "fedoras.stop-after"),
        ("fedoras.rand-init-rounds", -2, "fedoras.rand-init-rounds"),
        ("fedoras.rand-init-lr", -0.1, "fedoras.rand-init-lr"),
        ("fedoras.rand-init-clients-per-round", -1, "fedoras.rand-init-clients-per-round"),
        ("fedoras.rand-init-clients-per-round", 2.5, "fedoras.rand-init-clients-per-round"),
        ("fdnas.max-flops", 0.0, "fdnas.max-flops"),
        ("fdnas.warmup-rounds", 10, "fdnas.rounds = 10"),  # no round would update alpha
        ("data.dataset", "imagenet", "data.dataset"),
        ("data.alpha", -1.0, "data.alpha"),
    ],
)
def test_bad_values_name_the_key_and_value(key, value, fragment):
    config = pyproject_run_config()
    config[key] = value
    with pytest.raises(ValueError) as info:
        parse_run_config(config)
    message = str(info.value)
    assert fragment in message
    assert str(value) in message


def test_a_fresh_cluster_supernet_warms_up_for_the_global_searchs_share_of_its_rounds():
    config = {
        **pyproject_run_config(),
        "method": "cfdnas",
        "fdnas.rounds": 10,
        "fdnas.cluster-rounds": 5,
    }
    for warmup, fresh in ((0, 0), (2, 1), (8, 4), (9, 4)):
        settings = parse_run_config({**config, "fdnas.warmup-rounds": warmup}).method_settings
        assert settings.fresh_cluster_warmup() == fresh
    # the paper presets: 8 of 125 search rounds, 25 cluster rounds -> 1 (8 * 25 // 125)
    paper = {**config, "fdnas.rounds": 125, "fdnas.cluster-rounds": 25, "fdnas.warmup-rounds": 8}
    assert parse_run_config(paper).method_settings.fresh_cluster_warmup() == 1


def test_ints_are_accepted_for_floats():
    config = pyproject_run_config()
    config["fedoras.lr"] = 1
    assert parse_run_config(config).method_settings.train.lr == 1.0


def test_proportions_parse():
    config = pyproject_run_config()
    config["fedoras.tier-proportions"] = "0.8,0.0125,0.0125,0.175"
    assert parse_run_config(config).method_settings.tier_proportions == (0.8, 0.0125, 0.0125, 0.175)


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("decnas.model", "vgg", "convnet, mobilenet"),
        ("decnas.variant", "lazy", "no-dynamic-rounds"),
        ("decnas.target", 1.0, "0 < t < 1"),
        ("decnas.balance-ratio", 0.9, ">= 1"),
        ("decnas.drop-ratio", 1.5, "0 <= alpha <= 1"),
        ("decnas.rounds", "2,x", "comma-separated"),
        ("decnas.rounds", "2,0", "comma-separated"),
    ],
)
def test_bad_decnas_values_name_the_key_and_what_is_allowed(key, value, fragment):
    config = pyproject_run_config()
    config[key] = value
    with pytest.raises(ValueError, match=key.replace(".", r"\.")) as info:
        parse_run_config(config)
    assert fragment in str(info.value) and str(value) in str(info.value)


def test_decnas_variants_switch_one_optimisation_off_each():
    config = pyproject_run_config()
    flags = {}
    for variant in ("decnas", "naive", "no-groups", "no-drop", "no-dynamic-rounds"):
        variant_config = {**config, "method": "decnas", "decnas.variant": variant}
        settings = parse_run_config(variant_config).method_settings
        flags[variant] = (settings.grouping, settings.dropping, settings.dynamic_rounds)
    assert flags == {
        "decnas": (True, True, True),
        "naive": (False, False, False),
        "no-groups": (False, True, True),
        "no-drop": (True, False, True),
        "no-dynamic-rounds": (True, True, False),
    }
    rounds = {**config, "method": "decnas", "decnas.rounds": "1,3"}
    assert parse_run_config(rounds).method_settings.rounds == (1, 3)


def test_a_method_table_refuses_its_misspelled_keys_but_not_the_apps_own():
    # a library user parses its own run config (keys of its own app beside fedoras.*)
    from fedorasflwr.strategies import DecNASSettings, FedorASSettings

    settings = FedorASSettings.from_config({"num-server-rounds": 3, "fedoras.num-tiers": 2})
    assert settings.num_tiers == 2
    with pytest.raises(
        ValueError, match="'fedoras.round' is unknown; did you mean 'fedoras.rounds'"
    ):
        FedorASSettings.from_config({"fedoras.round": 3})
    with pytest.raises(ValueError, match="'decnas.lrr' is unknown"):
        DecNASSettings.from_config({"decnas.lrr": 0.1})


@pytest.mark.parametrize(
    "method", ["fedoras", "fdnas", "cfdnas", "dpfnas", "decnas", "fednas", "heterofl", "fjord"]
)
def test_a_runs_settings_hold_only_the_running_methods_table(method):
    """``RunSettings.method_settings`` is the running method's; result.json's ``settings``
    (``document``) hold it under its table's name and no other method's table."""
    from fedorasflwr.methods import settings_class

    settings = parse_run_config({**pyproject_run_config(), "method": method})
    assert type(settings.method_settings) is settings_class(method)
    document = settings.document()
    table = "fdnas" if method == "cfdnas" else method
    assert document[table] == plain(settings.method_settings)
    others = {"fedoras", "fdnas", "dpfnas", "decnas", "fednas", "heterofl", "fjord"} - {table}
    assert not others & set(document)
    assert all("-" not in key for key in document)  # snake_case, as the rest of result.json
    with pytest.raises(ValueError, match="method_settings of method 'decnas' must be a"):
        RunSettings(method="decnas", method_settings=settings_class("fedoras")())
