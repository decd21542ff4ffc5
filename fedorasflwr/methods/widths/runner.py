"""The width baselines' runner: run config -> ``HeteroFL`` / ``FjORD`` ``start`` -> each
tier's model scored on the global test set -> the result document."""

from __future__ import annotations

from dataclasses import replace
from logging import INFO
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from ...arrays import record_of, state_dict_of
from ...checkpoints import Checkpointer
from ...config import RunSettings
from ...data import dataset_info
from ...model_files import PRUNABLE, WIDTHS_NET
from ...runs import (
    FinalModel,
    RunFiles,
    chance_accuracy,
    probed_recipe,
    resume_checkpoint,
    start,
    strategy_options,
)
from ...search_spaces.prunable import build_prunable, load_prunable
from ...search_spaces.widths import width_net
from ...seeding import seed_torch
from ...training import LrProbe
from .plots import plot_tiers
from .strategy import STAGE, FjORD, HeteroFL, WidthStrategy

__all__ = ["head_hint", "run_fjord", "run_heterofl", "run_widths"]


def image_spec(settings: RunSettings) -> dict[str, int]:
    """The fixed architecture's input and classes for the run's (image) dataset."""
    info = dataset_info(settings.data)
    if info.kind != "image":
        raise ValueError(
            f"run config 'data.dataset' = {info.name!r} is {info.kind}: the width baselines "
            "widen an image ConvNet; use an image dataset"
        )
    channels, height, width = info.input_shape
    return {
        "num_classes": info.num_classes,
        "in_channels": channels,
        "input_height": height,
        "input_width": width,
    }


def run_widths(
    strategy_class: type[WidthStrategy],
    grid: Grid,
    settings: RunSettings,
    out_dir: Path,
    progress: Checkpointer | None = None,
) -> dict[str, Any]:
    """Train, test each tier's model on its nodes and on the global test set, report."""
    image = image_spec(settings)
    rounds = settings.method_settings.train.rounds
    resume = resume_checkpoint(settings, None, {STAGE: rounds})
    seed_torch(settings.seed, "init")
    head = settings.method_settings.head
    net = width_net(image, 1.0, head)
    probe = None
    if settings.method_settings.lr_probe:
        train, probe = probed_recipe(settings, settings.method_settings.train, net, STAGE)
        if (hint := head_hint(settings.method, head, probe)) is not None:
            log(INFO, "[%s] %s", STAGE, hint)
        method_settings = replace(settings.method_settings, train=train)
        settings = replace(settings, method_settings=method_settings)
    strategy = strategy_class(
        image=image, settings=settings.method_settings, **strategy_options(settings, resume)
    )
    spec = {"name": WIDTHS_NET, **image, "head": head}
    run = RunFiles(out_dir, settings, spec, progress)
    initial = record_of(net.state_dict())
    result = start(strategy, grid, settings, run, initial, rounds)
    held = run.global_test
    for tier in result.tiers:  # scored on the server as written (RunFiles.save_final)
        arrays = strategy.tier_arrays(tier.tier)
        final = save_tier(run, image, tier.tier + 1, tier.width, arrays, head)
        if final.score is not None:
            tier.global_test_accuracy = final.score.accuracy
    summary = {"mode": strategy.mode, **result.summary()}
    run.add(plot_tiers(out_dir / "tiers_accuracy.png", summary, chance_accuracy(settings)))
    return {
        "architecture": spec,
        **summary,
        **({} if probe is None else {"lr-probe": probe.summary()}),
        **({} if held is None else {"global-test-count": len(held.data)}),
        **run.document(),
    }


def head_hint(method: str, head: str, probe: LrProbe | None) -> str | None:
    """What the console says when the lr probe had to lower the rate for the ConvNet's
    flatten head: the scaled head (``<method>.head``) keeps the configured rate (issue 40);
    ``None`` otherwise."""
    if probe is None or probe.lr >= probe.configured or head != "flatten":
        return None
    return (
        f"the ConvNet's flatten head blows up at lr {probe.configured:g} on these images; "
        f'{method}.head = "flatten-scaled" keeps its first steps bounded there (docs/baselines.md)'
    )


def save_tier(
    run: RunFiles,
    image: dict[str, int],
    tier: int,
    width: float,
    arrays: ArrayRecord,
    head: str,
) -> FinalModel:
    """``tier-<t>.pt`` (and ``.onnx``; ``tier`` 1-based, named as FedorAS's tier models;
    ``tier<t>.pt`` before issue 41): the tier's model as a DecNAS
    prunable ConvNet at its width (``model_files.load_model`` rebuilds it; its keys gain the
    ``model.`` prefix), scored as written (``runs.RunFiles.save_final``)."""
    keys = {f"model.{k}": v for k, v in state_dict_of(arrays).items()}
    spec = build_prunable("convnet", width=width, head=head, **image).spec
    net = load_prunable(spec, keys)
    return run.save_final(
        f"tier-{tier}",
        net,
        record_of(net.state_dict()),
        stage="final",
        builder=PRUNABLE,
        space_spec=spec,
    )


def run_heterofl(
    grid: Grid, settings: RunSettings, out_dir: Path, progress: Checkpointer | None = None
) -> dict[str, Any]:
    """HeteroFL (``run_widths``)."""
    return run_widths(HeteroFL, grid, settings, out_dir, progress)


def run_fjord(
    grid: Grid, settings: RunSettings, out_dir: Path, progress: Checkpointer | None = None
) -> dict[str, Any]:
    """FjORD (``run_widths``)."""
    return run_widths(FjORD, grid, settings, out_dir, progress)
