"""ServerApp: run config -> data spec, search space, strategy -> start() -> artifacts."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log
from torch.utils.data import DataLoader

from .artifacts import check_state, load_checkpoint, run_directory, save_checkpoint
from .checkpoints import Checkpointer, Resume, read_resume
from .config import RunSettings, parse_run_config, space_kwargs
from .data import dataset_info, load_server_data
from .data.groups import even_sizes
from .export import OnnxExports
from .federation.aggregation import Aggregation
from .federation.base import NodeProfile
from .methods.decnas.strategy import DecNAS
from .methods.dpfnas.strategy import DPFNAS, json_safe, privacy_report
from .methods.fdnas.cfdnas import CFDNAS
from .methods.fdnas.strategy import FDNAS
from .methods.fedoras.evaluation import SupernetEvaluator
from .methods.fedoras.finetune import SUPERNET_INIT
from .methods.fedoras.strategy import FedorAS, FedorASResult
from .plots import (
    plot_alpha_entropy,
    plot_dpfnas,
    plot_fdnas_nets,
    plot_finetune,
    plot_frontier,
    plot_history,
    plot_tiers,
)
from .progress import format_seconds, setup_logging, summary_lines
from .search_spaces import DerivedNetwork, SearchSpace, build_space
from .search_spaces.prunable import PrunableNet, build_prunable
from .seeding import seed_torch
from .training import evaluate, resolve_device, torch_device, using_device

app = ServerApp()


def build_supernet(settings: RunSettings) -> SearchSpace:
    """The run's search space, initialised from the run seed."""
    seed_torch(settings.seed, "init")
    return build_space(**space_kwargs(settings.space, dataset_info(settings.data)))


def _check_partitions(settings: RunSettings, profiles: Sequence[NodeProfile]) -> None:
    counts = {p.num_partitions for p in profiles}
    if len(counts) != 1:
        raise ValueError(f"nodes disagree on num-partitions: {sorted(counts)}")
    settings.data.check_partitionable(counts.pop())


def aggregation_of(settings: RunSettings) -> Aggregation:
    """The run's choice of aggregation (run config ``aggregation``, ``aggregation-trim``)."""
    return Aggregation(settings.aggregation, settings.aggregation_trim)


def describe_space(space: SearchSpace) -> dict[str, Any]:
    return {
        "spec": space.spec,
        "choices": [{"name": c.name, "options": list(c.options)} for c in space.choices],
        "total-size": space.total_size,
        "fixed-flops": space.fixed_cost.flops,
        "min-flops": space.min_flops(),
        "max-flops": space.max_flops(),
        "flops-convention": "FLOPs = 2 x MACs per sample (torch.utils.flop_counter)",
    }


def checkpointer(
    progress: Checkpointer | None,
    settings: RunSettings,
    out_dir: Path,
    space: dict[str, Any],
    **stage_files: str,
) -> Checkpointer:
    """The run's ``Checkpointer`` (a new one if the caller gave none), set to ``space``."""
    if progress is None:
        progress = Checkpointer(
            out_dir, method=settings.method, seed=settings.seed, every=settings.checkpoint_every
        )
    progress.space = dict(space)
    progress.stage_files.update(stage_files)
    return progress


def resume_checkpoint(settings: RunSettings, space: SearchSpace | PrunableNet) -> Resume | None:
    """The checkpoint of run config ``resume-from`` (``None``: none given), checked
    against this run's method, seed and space."""
    if not settings.resume_from:
        return None
    return read_resume(
        settings.resume_from,
        method=settings.method,
        seed=settings.seed,
        reference=space.state_dict(),
        space=space.spec,
    )


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
        validate_profiles=lambda profiles: _check_partitions(settings, profiles),
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


def cluster_tagger(settings: RunSettings) -> Callable[[NodeProfile], int]:
    """The CFDNAS tag of a node that declares no ``cluster``, from its partition id.

    With the class-groups partitioner: the node's class group (the paper's data tag);
    otherwise ``fdnas.num-clusters`` contiguous ranges of partition ids.
    """
    spec = settings.data

    def tag(profile: NodeProfile) -> int:
        pid, total = profile.partition_id, profile.num_partitions
        if spec.partitioner == "class-groups":
            groups = len(spec.class_group_layout())
            ends = np.cumsum(even_sizes(total, min(groups, total)))
            return int(np.searchsorted(ends, pid, side="right"))
        return pid * min(settings.fdnas.num_clusters, total) // total

    return tag


def _run_fdnas(
    strategy_class: type[FDNAS],
    grid: Grid,
    settings: RunSettings,
    out_dir: Path,
    progress: Checkpointer | None = None,
) -> dict[str, Any]:
    space_settings = replace(settings.space, name="mbconv")
    seed_torch(settings.seed, "init")
    space = build_space(**space_kwargs(space_settings, dataset_info(settings.data)))
    strategy = strategy_class(
        space=space,
        settings=settings.fdnas,
        seed=settings.seed,
        cluster_of=cluster_tagger(settings),
        validate_profiles=lambda profiles: _check_partitions(settings, profiles),
        resume=resume_checkpoint(settings, space),
        min_nodes=settings.min_nodes,
    )
    strategy.aggregation = aggregation_of(settings)
    strategy.on_progress = checkpointer(progress, settings, out_dir, space.spec)
    result = strategy.start(
        grid,
        ArrayRecord(space.state_dict()),
        num_rounds=settings.fdnas.train.rounds,
        timeout=settings.reply_timeout,
    )
    onnx = OnnxExports(out_dir, settings.data)
    files: list[Path | None] = [
        save_checkpoint(
            out_dir / "supernet.pt", space_spec=space.spec, arrays=result.supernet, stage="search"
        )
    ]
    for net in result.nets:
        files.append(
            save_checkpoint(
                out_dir / f"{net.name}.pt",
                space_spec=space.spec,
                arrays=net.arrays,
                arch=list(net.arch),
                stage="final",
            )
        )
        onnx.add(net.name, space.subnet(net.arch), net.arrays)
    document = {
        "space": describe_space(space),
        "flops-convention": "FLOPs = 2 x MACs per sample (torch.utils.flop_counter)",
        "cluster-of-partition": result.cluster_of_partition,
        "nets": [net.summary() for net in result.nets],
        "search-history": result.search_history,
        "cluster-history": result.cluster_history,
        "ledger": result.ledger,
        "onnx": onnx.summary(),
    }
    files += fdnas_plots(out_dir, document, strategy_class.__name__)
    return {**document, "files": [p.name for p in files if p is not None] + onnx.files()}


def fdnas_plots(out_dir: Path, document: dict[str, Any], method: str) -> list[Path | None]:
    """The derived nets' accuracy against FLOPs and the alpha entropy per search round."""
    return [
        plot_fdnas_nets(out_dir / "nets_accuracy_flops.png", document["nets"], method=method),
        plot_alpha_entropy(
            out_dir / "alpha_entropy.png",
            document["search-history"],
            document["cluster-history"],
            options=[len(c["options"]) for c in document["space"]["choices"]],
            method=method,
        ),
    ]


def run_fdnas(
    grid: Grid, settings: RunSettings, out_dir: Path, progress: Checkpointer | None = None
) -> dict[str, Any]:
    """FDNAS: federated search on the mbconv space, derive, FedAvg-train the net."""
    return _run_fdnas(FDNAS, grid, settings, out_dir, progress)


def run_cfdnas(
    grid: Grid, settings: RunSettings, out_dir: Path, progress: Checkpointer | None = None
) -> dict[str, Any]:
    """CFDNAS: FDNAS, then per-cluster search and one trained net per cluster."""
    return _run_fdnas(CFDNAS, grid, settings, out_dir, progress)


def run_dpfnas(
    grid: Grid, settings: RunSettings, out_dir: Path, progress: Checkpointer | None = None
) -> dict[str, Any]:
    """DP-FNAS: private federated DARTS search, derivation, FedAvg training, privacy report."""
    if settings.space.name != "darts":
        log(INFO, "DP-FNAS searches the darts space (run config 'space.name' ignored)")
        settings = replace(settings, space=replace(settings.space, name="darts"))
    space = build_supernet(settings)
    server_data = load_server_data(settings.data)
    probe = build_supernet(settings)

    def evaluate_supernet(_iteration: int, arrays: Any) -> MetricRecord:
        probe.load_state_dict(arrays.to_torch_state_dict())
        probe.to(torch_device()).eval()
        result = evaluate(probe, DataLoader(server_data, batch_size=256), torch_device())
        return MetricRecord({"accuracy": result.accuracy, "loss": result.loss})

    strategy = DPFNAS(
        space=space,  # type: ignore[arg-type]
        settings=settings.dpfnas,
        seed=settings.seed,
        validate_profiles=lambda profiles: _check_partitions(settings, profiles),
        resume=resume_checkpoint(settings, space),
        min_nodes=settings.min_nodes,
    )
    strategy.aggregation = aggregation_of(settings)
    strategy.on_progress = checkpointer(progress, settings, out_dir, space.spec)
    result = strategy.start(
        grid,
        ArrayRecord(space.state_dict()),
        num_rounds=settings.dpfnas.iterations,
        timeout=settings.reply_timeout,
        evaluate_fn=evaluate_supernet if len(server_data) else None,
    )
    onnx = OnnxExports(out_dir, settings.data)
    files = [
        save_checkpoint(
            out_dir / "supernet.pt",
            space_spec=space.spec,
            arrays=result.arrays,
            stage="search",
            genotype=result.genotype.to_text(),
        )
    ]
    if result.final_arrays is not None:
        files.append(
            save_checkpoint(
                out_dir / "derived.pt",
                space_spec=space.spec,
                arrays=result.final_arrays,
                stage="final",
                genotype=result.genotype.to_text(),
            )
        )
        onnx.add("derived", DerivedNetwork(result.genotype, **space.spec), result.final_arrays)
    plot = plot_dpfnas(
        out_dir / "privacy_accuracy.png", result.history, settings.dpfnas.target_epsilon
    )
    return {
        "space": describe_space(space),
        "mode": settings.dpfnas.mode,
        "genotype": result.genotype.to_text(),
        "iterations": result.iterations,
        "stopped": result.stopped,
        "privacy": privacy_report(result.privacy),
        "noise": result.noise,
        "test-accuracy": result.test_accuracy,
        "final-privacy": json_safe(result.final_privacy),
        "history": json_safe(result.history),
        "final-history": result.final_history,
        "ledger": result.ledger,
        "onnx": onnx.summary(),
        "files": [p.name for p in (*files, plot) if p is not None] + onnx.files(),
    }


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
        validate_profiles=lambda profiles: _check_partitions(settings, profiles),
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


#: method name (run config ``method``) -> runner returning the result document.
RUNNERS: dict[str, Callable[[Grid, RunSettings, Path, Checkpointer], dict[str, Any]]] = {
    "fedoras": run_fedoras,
    "fdnas": run_fdnas,
    "cfdnas": run_cfdnas,
    "dpfnas": run_dpfnas,
    "decnas": run_decnas,
}


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Parse the run config (fail before any training), run the method, write artifacts.

    ``result.json`` is written at every checkpoint (unfinished), when the run fails
    (with the error, keeping what was finished) and at the end (``status.finished``)."""
    started = time.time()
    setup_logging()
    settings = parse_run_config(context.run_config)
    out_dir = run_directory(settings.output_path, settings.method, context.run_id)
    log(INFO, "fedorasflwr: method %s, results in %s", settings.method, out_dir)
    progress = Checkpointer(
        out_dir,
        method=settings.method,
        seed=settings.seed,
        every=settings.checkpoint_every,
        header={
            "method": settings.method,
            "settings": settings,
            "run-id": context.run_id,
            "resumed-from": settings.resume_from or None,
        },
    )
    try:
        with using_device(resolve_device(settings.device)):  # the server's scoring loops
            document = RUNNERS[settings.method](grid, settings, out_dir, progress)
    except Exception as exc:
        seconds = round(time.time() - started, 2)
        progress.write_result(error=exc, seconds=seconds)
        log(ERROR, "fedorasflwr: run stopped in %s: %r", progress.stage or "setup", exc)
        raise
    seconds = round(time.time() - started, 2)
    progress.write_result(document, finished=True, seconds=seconds)
    delta = settings.dpfnas.delta if settings.method == "dpfnas" else None
    for line in summary_lines(settings.method, document, delta=delta):
        log(INFO, "%s", line)
    log(
        INFO,
        "fedorasflwr: finished in %s, wrote %s",
        format_seconds(seconds),
        out_dir / "result.json",
    )
