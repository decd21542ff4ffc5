"""FedorAS's runner: run config -> supernet, ``FedorAS.start``, tier models, plots, ONNX."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord
from flwr.serverapp import Grid
from torch.utils.data import TensorDataset

from ...arrays import record_of
from ...artifacts import check_state, load_checkpoint
from ...checkpoints import Checkpointer, Resume
from ...config import RunSettings
from ...costs import flops_to_macs
from ...data import load_server_data
from ...latency import table_document
from ...model_files import SUBNET
from ...plots import plot_history
from ...progress import PlannedStage, RunEstimate
from ...runs import (
    RunFiles,
    build_supernet,
    chance_accuracy,
    describe_space,
    latency_document,
    probed_recipe,
    resume_checkpoint,
    start,
    strategy_options,
)
from ...search_spaces import SampledPaths, SearchSpace
from ...search_spaces.cnn import as_written
from ...seeding import numpy_generator, stream_words
from ...training import LrProbe
from .finetune import SUPERNET_INIT
from .plots import plot_finetune, plot_tiers
from .strategy import FedorAS, FedorASResult

__all__ = [
    "build_fedoras",
    "fedoras_plan",
    "fedoras_plots",
    "latency_entries",
    "probed_supernet_recipe",
    "resume_supernet",
    "run_fedoras",
]

#: one path scored in the search, in client-epochs (the plan's unit of work): a forward pass
#: over the server's slice with BatchNorm recalibrated, against a client's forward and
#: backward passes over its partition; a rough guide until the first tier's search is timed
SCORE_WORK = 0.1


def run_fedoras(
    grid: Grid, settings: RunSettings, out_dir: Path, progress: Checkpointer | None = None
) -> dict[str, Any]:
    """FedorAS, all three stages (or from a checkpoint, run config ``resume-from``);
    returns the result document and writes checkpoints and plots to ``out_dir``."""
    space = build_supernet(settings)
    # Stage 1 is validated on the server's slice by the strategy's default evaluate_fn
    server_data = load_server_data(settings.data)
    settings, probe = probed_supernet_recipe(settings, space, server_data)
    # Stage 1 is counted in rounds; the search and fine-tuning in tiers and models
    stages = {"supernet": settings.method_settings.train.rounds, "search": None, "finetune": None}
    resume = resume_checkpoint(settings, space, stages)
    trained = resume is not None and not resume.within("supernet")
    strategy = build_fedoras(settings, space=space, server_data=server_data, resume=resume)
    run = RunFiles(out_dir, settings, space.spec, progress)
    initial, rounds = record_of(space.state_dict()), settings.method_settings.train.rounds
    with fedoras_plan(settings.method_settings, settings.min_nodes).active():
        result = start(strategy, grid, settings, run, initial, rounds, supernet="supernet.pt")
    if not trained:
        run.add(out_dir / "supernet.pt")
    for model in result.models:  # scored on the server as written (runs.RunFiles.save_final)
        suffix = "" if model.init == SUPERNET_INIT else f"-{model.init}-init"
        final = run.save_final(
            f"tier-{model.tier + 1}{suffix}",
            space.subnet(model.arch),
            model.arrays,
            stage="finetune",
            builder=SUBNET,
            arch=list(model.arch),
            options=model.names,
            init=model.init,
        )
        if final.score is not None:
            model.global_test_accuracy = final.score.accuracy
            model.global_test_count = final.score.count
    run.add(*fedoras_plots(out_dir, result, chance_accuracy(settings)))
    return {
        "space": describe_space(space),
        "tiers": tier_entries(result),
        "tier-of-partition": {p: t + 1 for p, t in sorted(result.tier_of_partition.items())},
        "history": result.history,
        "search": [s.summary() for s in result.searches],
        "kendall-tau": {str(t + 1): tau for t, tau in result.kendall_tau.items()},
        "models": [m.summary() for m in result.models],
        "ledger": result.ledger,
        **({} if probe is None else {"lr-probe": probe.summary()}),
        **latency_entries(strategy, result),
        **run.document(),
    }


def probed_supernet_recipe(
    settings: RunSettings, space: SearchSpace, server_data: TensorDataset | None = None
) -> tuple[RunSettings, LrProbe | None]:
    """``settings`` with Stage 1's ``lr`` lowered by the server's lr probe
    (``runs.probed_recipe``) where ``fedoras.lr-probe`` is on, and what the probe found
    (``None``: off, or no server slice). The probe steps the initial supernet ``space``
    (left untouched) on a fresh uniformly drawn path per step (``search_spaces.SampledPaths``,
    stream ``lr-probe-paths``), as a Stage-1 client steps a path per batch, with Stage 1's
    batch, momentum, weight decay and gradient clipping, on ``server_data`` (the server's
    slice; default: loaded here). Call it before any training: a resumed run probes the
    same initial net again and finds the same rate."""
    method = settings.method_settings
    if not method.lr_probe:
        return settings, None
    net = SampledPaths(space, numpy_generator(stream_words(settings.seed, "lr-probe-paths")))
    train, probe = probed_recipe(
        settings, method.train, net, "supernet", method.grad_clip, server_data
    )
    return replace(settings, method_settings=replace(method, train=train)), probe


def tier_entries(result: FedorASResult) -> list[dict[str, Any]]:
    """``result.json``'s tiers: ``index`` 1-based, as users see them (file names, logs,
    ``models[].tier``), the bounds in the resource's unit, named with it (``low-flops`` /
    ``high-flops`` and, beside them, ``low-macs`` / ``high-macs``; for latency tiers
    ``low-ms`` / ``high-ms``), and the same bounds as ``low`` / ``high`` (deprecated: kept
    for readers of earlier result files)."""
    entries = []
    for tier in result.tiers:
        entry: dict[str, Any] = {**asdict(tier), "index": tier.index + 1}
        if result.resource == "flops":
            entry.update({"low-flops": tier.low, "high-flops": tier.high})
            entry["low-macs"] = flops_to_macs(tier.low)
            entry["high-macs"] = flops_to_macs(tier.high)
        else:
            entry.update({"low-ms": tier.low, "high-ms": tier.high})
        entries.append(entry)
    return entries


def fedoras_plan(settings: Any, nodes: int) -> RunEstimate:
    """The whole run's estimate (``progress.RunEstimate``) of FedorAS's three stages, in
    client-epochs (a round: clients per round times local epochs; ``nodes`` stands for a
    recipe's 0, every node): Stage 1's rounds; the search, a step per tier of
    ``search-evaluations`` paths at ``SCORE_WORK`` each; per tier the fine-tuning, the
    rand-init training and the random search as configured. ``stop-after`` ends the plan
    early."""

    def per_round(recipe: Any) -> float:
        return float((recipe.clients_per_round or nodes) * recipe.local_epochs)

    tiers, finetune = settings.num_tiers, settings.finetune
    stages = [PlannedStage("supernet", settings.train.rounds, per_round(settings.train))]
    if settings.stop_after != "supernet":
        stages.append(PlannedStage("search", tiers, settings.search_evaluations * SCORE_WORK))
    if settings.stop_after == "finetune":
        stages.append(
            PlannedStage("finetune-t*-supernet", tiers * finetune.rounds, per_round(finetune))
        )
        if settings.compare_rand_init:
            rounds = settings.rand_init_rounds or finetune.rounds
            clients = settings.rand_init_clients_per_round or finetune.clients_per_round
            rand_init = replace(finetune, clients_per_round=clients)
            stages.append(PlannedStage("finetune-t*-random", tiers * rounds, per_round(rand_init)))
        if settings.compare_random_search:  # the fine-tuning's client compute, split
            stages.append(
                PlannedStage(
                    "finetune-t*-random-search-*", tiers * finetune.rounds, per_round(finetune)
                )
            )
    return RunEstimate(stages, replan=lambda count: fedoras_plan(settings, count).stages)


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
        settings=settings.method_settings,
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
    # a file of an earlier version names fewer of the space's choices: read with their values
    if checkpoint["stage"] != "supernet" or as_written(checkpoint["space"]) != space.spec:
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


def fedoras_plots(
    out_dir: Path, result: FedorASResult, chance: float | None = None
) -> list[Path | None]:
    """Accuracy against FLOPs per tier (FedorAS and rand-init), the supernet's curve,
    and the fine-tuning curves (``chance``: the chance line of each)."""
    models = [m.summary() for m in result.models]
    return [
        plot_tiers(out_dir / "tiers_accuracy_flops.png", models, chance),
        plot_history(
            out_dir / "supernet_accuracy.png",
            result.history,
            "val-accuracy",
            title="Supernet: mean accuracy of random paths",
            ylabel="accuracy",
            chance=chance,
        ),
        plot_finetune(out_dir / "finetune_curves.png", models, chance),
    ]
