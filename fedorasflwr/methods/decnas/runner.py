"""DecNAS's runner: run config -> starting net, ``DecNAS.start``, the frontier's models, plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord
from flwr.serverapp import Grid

from ...checkpoints import Checkpointer
from ...config import RunSettings
from ...data import dataset_info
from ...model_files import PRUNABLE
from ...runs import (
    RunFiles,
    latency_document,
    resume_checkpoint,
    start,
    strategy_options,
)
from ...search_spaces.prunable import PrunableNet, build_prunable
from ...seeding import seed_torch
from .plots import plot_frontier
from .stages import GM0, ITERATIONS, GlobalModel
from .strategy import DecNAS

__all__ = ["build_decnas_net", "model_file", "run_decnas"]


def build_decnas_net(settings: RunSettings) -> PrunableNet:
    """DecNAS's starting net (``decnas.model`` at ``space.width``), initialised from the seed."""
    info = dataset_info(settings.data)
    if info.kind != "image":
        raise ValueError(f"DecNAS prunes image nets; 'data.dataset' = {info.name!r} is {info.kind}")
    seed_torch(settings.seed, "init")
    channels, height, width = info.input_shape
    return build_prunable(
        settings.method_settings.model,
        num_classes=info.num_classes,
        in_channels=channels,
        input_height=height,
        input_width=width,
        width=settings.space.width,
    )


def run_decnas(
    grid: Grid, settings: RunSettings, out_dir: Path, progress: Checkpointer | None = None
) -> dict[str, Any]:
    """DecNAS: GM_0, NetAdapt iterations with client groups, tuning; frontier and models."""
    net = build_decnas_net(settings)
    # GM_t's widths differ from GM_0's: the strategy checks each saved GM against its own
    stages = {
        GM0: settings.method_settings.train.rounds,
        ITERATIONS: settings.method_settings.max_iterations,
    }
    resume = resume_checkpoint(settings, None, stages)
    strategy = DecNAS(
        net=net,
        settings=settings.method_settings,
        latency=settings.latency.request(settings.seed),
        **strategy_options(settings, resume),
    )
    run = RunFiles(out_dir, settings, net.spec, progress)
    initial = ArrayRecord(net.state_dict())
    result = start(strategy, grid, settings, run, initial, settings.method_settings.max_iterations)
    for model in result.frontier:
        extra = {"iteration": model.iteration, "macs": model.macs}
        saved = [(model.arrays, "iterations", False), (model.tuned_arrays, "final", True)]
        for arrays, stage, tuned in saved:
            if arrays is not None:
                net = build_prunable(**model.spec)
                run.save(
                    model_file(model, tuned),
                    arrays,
                    stage=stage,
                    builder=PRUNABLE,
                    model=net,
                    space_spec=model.spec,
                    **extra,
                )
    run.add(
        plot_frontier(out_dir / "frontier.png", result.summary(), settings.method_settings.variant)
    )
    summary = result.summary()
    if "latency" in summary:  # every target node's table, without its entries
        nodes = latency_document(strategy.profiles, strategy.target_tables)["nodes"]
        summary["latency"]["nodes"] = [
            {k: v for k, v in node.items() if k != "option-ms"} for node in nodes
        ]
    # result.arrays: GM_T as tuned when it was (what a user deploys), else as searched
    final = result.frontier[-1]
    summary["final-model"] = f"{model_file(final, final.tuned_arrays is not None)}.pt"
    return {**summary, **run.document()}


def model_file(model: GlobalModel, tuned: bool) -> str:
    """The name (without ``.pt``) of GM_t's file: ``gm<t>``, as tuned ``gm<t>-tuned``."""
    return f"gm{model.iteration}" + ("-tuned" if tuned else "")
