"""FedorAS's runner: run config -> supernet, ``FedorAS.start``, tier models, plots, ONNX."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord
from flwr.serverapp import Grid
from torch.utils.data import TensorDataset

from ...artifacts import check_state, load_checkpoint
from ...checkpoints import Checkpointer, Resume
from ...config import RunSettings
from ...data import load_server_data
from ...latency import table_document
from ...plots import (
    plot_finetune,
    plot_history,
    plot_tiers,
)
from ...runs import (
    RunFiles,
    build_supernet,
    describe_space,
    latency_document,
    resume_checkpoint,
    start,
    strategy_options,
)
from ...search_spaces import SearchSpace
from .finetune import SUPERNET_INIT
from .strategy import FedorAS, FedorASResult

__all__ = ["build_fedoras", "fedoras_plots", "latency_entries", "resume_supernet", "run_fedoras"]


def run_fedoras(
    grid: Grid, settings: RunSettings, out_dir: Path, progress: Checkpointer | None = None
) -> dict[str, Any]:
    """FedorAS, all three stages (or from a checkpoint, run config ``resume-from``);
    returns the result document and writes checkpoints and plots to ``out_dir``."""
    space = build_supernet(settings)
    # Stage 1 is counted in rounds; the search and fine-tuning in tiers and models
    stages = {"supernet": settings.fedoras.train.rounds, "search": None, "finetune": None}
    resume = resume_checkpoint(settings, space, stages)
    trained = resume is not None and not resume.within("supernet")
    # Stage 1 is validated on the server's slice by the strategy's default evaluate_fn
    server_data = load_server_data(settings.data)
    strategy = build_fedoras(settings, space=space, server_data=server_data, resume=resume)
    run = RunFiles(out_dir, settings, space.spec, progress)
    initial, rounds = ArrayRecord(space.state_dict()), settings.fedoras.train.rounds
    result = start(
        strategy,
        grid,
        settings,
        run,
        initial,
        rounds,
        supernet="supernet.pt",
    )
    if not trained:
        run.add(out_dir / "supernet.pt")
    for model in result.models:
        suffix = "" if model.init == SUPERNET_INIT else f"-{model.init}-init"
        run.save(
            f"tier-{model.tier + 1}{suffix}",
            model.arrays,
            stage="finetune",
            model=space.subnet(model.arch),
            arch=list(model.arch),
            options=model.names,
            init=model.init,
        )
    run.add(*fedoras_plots(out_dir, result))
    return {
        "space": describe_space(space),
        "resumed-from": settings.resume_from or None,
        "tiers": result.tiers,
        "tier-of-partition": result.tier_of_partition,
        "history": result.history,
        "search": [s.summary() for s in result.searches],
        "kendall-tau": {str(t + 1): tau for t, tau in result.kendall_tau.items()},
        "models": [m.summary() for m in result.models],
        "ledger": result.ledger,
        **latency_entries(strategy, result),
        **run.document(),
    }


def build_fedoras(
    settings: RunSettings,
    *,
    space: SearchSpace | None = None,
    server_data: TensorDataset | None = None,
    resume: Resume | None = None,
) -> FedorAS:
    """FedorAS from a run config, as the ServerApp builds it: the run's supernet and the
    server's held-out slice (built and loaded here unless given; an empty slice: none),
    the nodes' latency request, and the options every strategy takes (seed, partition
    check, ``min-nodes``, ``resume``)."""
    space = build_supernet(settings) if space is None else space
    server_data = load_server_data(settings.data) if server_data is None else server_data
    return FedorAS(
        space=space,
        settings=settings.fedoras,
        server_data=server_data if len(server_data) else None,
        latency=settings.latency.request(settings.seed),
        **strategy_options(settings, resume),
    )


def latency_entries(strategy: FedorAS, result: FedorASResult) -> dict[str, Any]:
    """``result.json``'s latency entries of a run with ``fedoras.resource = "latency"``:
    the resource, the nodes' tables and each tier's table (the median of its nodes')."""
    if result.resource != "latency":
        return {}
    return {
        "resource": result.resource,
        "latency-tables": latency_document(strategy.profiles, result.latency_tables),
        "tier-latency-tables": {
            str(t + 1): table_document(table) for t, table in sorted(result.tier_tables.items())
        },
    }


def resume_supernet(path: str, space: SearchSpace) -> ArrayRecord:
    """The supernet weights of a Stage-1 checkpoint, checked against the run's space."""
    key = "fedoras.resume-from"
    checkpoint = load_checkpoint(path, key=key)
    if checkpoint["stage"] != "supernet" or dict(checkpoint["space"]) != space.spec:
        raise ValueError(
            f"run config {key!r} = {path!r}: not a Stage-1 checkpoint of this "
            f"run's space {space.spec} (it holds {checkpoint['stage']!r} of "
            f"{checkpoint['space']})"
        )
    reason = check_state(checkpoint["state_dict"], space.state_dict())
    if reason is not None:
        raise ValueError(
            f"run config {key!r} = {path!r}: its weights do not fit the space: {reason}"
        )
    return ArrayRecord(checkpoint["state_dict"])


def fedoras_plots(out_dir: Path, result: FedorASResult) -> list[Path | None]:
    """Accuracy against FLOPs per tier (FedorAS and rand-init), the supernet's curve,
    and the fine-tuning curves."""
    models = [m.summary() for m in result.models]
    return [
        plot_tiers(out_dir / "tiers_accuracy_flops.png", models),
        plot_history(
            out_dir / "supernet_accuracy.png",
            result.history,
            "val-accuracy",
            title="Supernet: mean accuracy of random paths",
            ylabel="accuracy",
        ),
        plot_finetune(out_dir / "finetune_curves.png", models),
    ]
