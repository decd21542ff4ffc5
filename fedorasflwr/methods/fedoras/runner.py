"""FedorAS's runner: run config -> supernet, ``FedorAS.start``, tier models, plots, ONNX."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord
from flwr.serverapp import Grid

from ...artifacts import check_state, load_checkpoint, save_checkpoint
from ...checkpoints import Checkpointer
from ...config import RunSettings
from ...data import load_server_data
from ...export import OnnxExports
from ...plots import (
    plot_finetune,
    plot_history,
    plot_tiers,
)
from ...runs import (
    aggregation_of,
    build_supernet,
    check_partitions,
    checkpointer,
    describe_space,
    resume_checkpoint,
)
from ...search_spaces import SearchSpace
from .evaluation import SupernetEvaluator
from .finetune import SUPERNET_INIT
from .strategy import FedorAS, FedorASResult

__all__ = ["fedoras_plots", "resume_supernet", "run_fedoras"]


def run_fedoras(
    grid: Grid, settings: RunSettings, out_dir: Path, progress: Checkpointer | None = None
) -> dict[str, Any]:
    """FedorAS, all three stages (or from a checkpoint, run config ``resume-from``);
    returns the result document and writes checkpoints and plots to ``out_dir``."""
    space = build_supernet(settings)
    resume = resume_checkpoint(settings, space)
    trained = resume is not None and not resume.within("supernet")
    server_data = load_server_data(settings.data)
    evaluator = None
    if len(server_data) >= 2 and not trained:
        evaluator = SupernetEvaluator(
            space=build_supernet(settings),
            dataset=server_data,
            num_paths=settings.fedoras.eval_paths,
            seed=settings.seed,
        )
    strategy = FedorAS(
        space=space,
        settings=settings.fedoras,
        seed=settings.seed,
        validate_profiles=lambda profiles: check_partitions(settings, profiles),
        server_data=server_data if len(server_data) else None,
        resume=resume,
        min_nodes=settings.min_nodes,
    )
    strategy.aggregation = aggregation_of(settings)
    strategy.on_progress = checkpointer(
        progress, settings, out_dir, space.spec, supernet="supernet.pt"
    )
    result = strategy.start(
        grid,
        ArrayRecord(space.state_dict()),
        num_rounds=settings.fedoras.train.rounds,
        timeout=settings.reply_timeout,
        evaluate_fn=evaluator,
    )
    files: list[Path | None] = [out_dir / "supernet.pt"] if not trained else []
    onnx = OnnxExports(out_dir, settings.data)
    for model in result.models:
        suffix = "" if model.init == SUPERNET_INIT else f"-{model.init}-init"
        files.append(
            save_checkpoint(
                out_dir / f"tier-{model.tier + 1}{suffix}.pt",
                space_spec=space.spec,
                arrays=model.arrays,
                arch=list(model.arch),
                options=model.names,
                stage="finetune",
                init=model.init,
            )
        )
        onnx.add(f"tier-{model.tier + 1}{suffix}", space.subnet(model.arch), model.arrays)
    files += fedoras_plots(out_dir, result)
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
        "onnx": onnx.summary(),
        "files": [str(p.name) for p in files if p is not None] + onnx.files(),
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
