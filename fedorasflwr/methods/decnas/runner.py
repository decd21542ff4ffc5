"""DecNAS's runner: run config -> starting net, ``DecNAS.start``, the frontier's models, plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord
from flwr.serverapp import Grid

from ...artifacts import save_checkpoint
from ...checkpoints import Checkpointer, read_resume
from ...config import RunSettings
from ...data import dataset_info
from ...export import OnnxExports
from ...plots import (
    plot_frontier,
)
from ...runs import (
    aggregation_of,
    check_partitions,
    checkpointer,
)
from ...search_spaces.prunable import PrunableNet, build_prunable
from ...seeding import seed_torch
from .strategy import DecNAS

__all__ = ["build_decnas_net", "run_decnas"]


def build_decnas_net(settings: RunSettings) -> PrunableNet:
    """DecNAS's starting net (``decnas.model`` at ``space.width``), initialised from the seed."""
    info = dataset_info(settings.data)
    if info.kind != "image":
        raise ValueError(f"DecNAS prunes image nets; 'data.dataset' = {info.name!r} is {info.kind}")
    seed_torch(settings.seed, "init")
    channels, height, width = info.input_shape
    return build_prunable(
        settings.decnas.model,
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
    resume = None
    if settings.resume_from:
        # GM_t's widths differ from GM_0's: the strategy checks each saved GM against its own
        resume = read_resume(
            settings.resume_from,
            method=settings.method,
            seed=settings.seed,
            reference=None,
            space=None,
        )
    strategy = DecNAS(
        net=net,
        settings=settings.decnas,
        seed=settings.seed,
        validate_profiles=lambda profiles: check_partitions(settings, profiles),
        resume=resume,
        min_nodes=settings.min_nodes,
    )
    strategy.aggregation = aggregation_of(settings)
    strategy.on_progress = checkpointer(progress, settings, out_dir, net.spec)
    result = strategy.start(
        grid,
        ArrayRecord(net.state_dict()),
        num_rounds=settings.decnas.max_iterations,
        timeout=settings.reply_timeout,
    )
    onnx = OnnxExports(out_dir, settings.data)
    files = []
    for model in result.frontier:
        name, extra = f"gm{model.iteration}", {"iteration": model.iteration, "macs": model.macs}
        files.append(
            save_checkpoint(
                out_dir / f"{name}.pt",
                space_spec=model.spec,
                arrays=model.arrays,
                stage="iterations",
                **extra,
            )
        )
        onnx.add(name, build_prunable(**model.spec), model.arrays)
        if model.tuned_arrays is not None:
            files.append(
                save_checkpoint(
                    out_dir / f"{name}-tuned.pt",
                    space_spec=model.spec,
                    arrays=model.tuned_arrays,
                    stage="final",
                    **extra,
                )
            )
            onnx.add(f"{name}-tuned", build_prunable(**model.spec), model.tuned_arrays)
    plot = plot_frontier(out_dir / "frontier.png", result.summary(), settings.decnas.variant)
    files_written = [p.name for p in (*files, plot) if p is not None] + onnx.files()
    return {**result.summary(), "onnx": onnx.summary(), "files": files_written}
