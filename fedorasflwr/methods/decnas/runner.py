"""DecNAS's runner: run config -> starting net, ``DecNAS.start``, the frontier's models, plot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from flwr.serverapp import Grid

from ... import runs
from ...arrays import record_of
from ...checkpoints import Checkpointer
from ...config import RunSettings
from ...data import dataset_info
from ...model_files import PRUNABLE
from ...progress import PlannedStage, RunEstimate
from ...search_spaces.prunable import PrunableNet, build_prunable
from ...seeding import seed_torch
from .netadapt import rounds_for
from .plots import plot_frontier
from .stages import GM0, ITERATIONS, GlobalModel
from .strategy import DecNAS

__all__ = ["build_decnas_net", "decnas_plan", "model_file", "run_decnas"]


def build_decnas_net(settings: RunSettings) -> PrunableNet:
    """DecNAS's starting net (``decnas.model`` at ``space.width``, the ConvNet with
    ``decnas.head``), initialised from the seed."""
    info = dataset_info(settings.data)
    if info.kind != "image":
        raise ValueError(f"DecNAS prunes image nets; 'data.dataset' = {info.name!r} is {info.kind}")
    seed_torch(settings.seed, "init")
    channels, height, width = info.input_shape
    own = settings.method_settings
    # a scaled head travels in the net's spec (the default flatten one: no key, as before)
    head = {} if own.head == "flatten" else {"head": own.head}
    return build_prunable(
        own.model,
        num_classes=info.num_classes,
        in_channels=channels,
        input_height=height,
        input_width=width,
        width=settings.space.width,
        **head,
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
    resume = runs.resume_checkpoint(settings, None, stages)
    strategy = DecNAS(
        net=net,
        settings=settings.method_settings,
        latency=settings.latency.request(settings.seed),
        **runs.strategy_options(settings, resume),
    )
    run = runs.RunFiles(out_dir, settings, net.spec, progress)
    initial = record_of(net.state_dict())
    plan = decnas_plan(settings.method_settings, settings.min_nodes, len(net.spec["widths"]))
    with plan.active():
        result = runs.start(
            strategy, grid, settings, run, initial, settings.method_settings.max_iterations
        )
    for model in result.frontier:  # scored on the server as written (RunFiles.save_final)
        save_frontier_model(run, model)
    run.add(
        plot_frontier(
            out_dir / "frontier.png",
            result.summary(),
            settings.method_settings.variant,
            runs.chance_accuracy(settings),
            {
                m.iteration: settings.method_settings.rounds_trained(m.iteration)
                for m in result.frontier
            },
        )
    )
    summary = with_units(result.summary(), settings.method_settings.resource)
    if "latency" in summary:  # every target node's table, without its entries
        nodes = runs.latency_document(strategy.profiles, strategy.target_tables)["nodes"]
        summary["latency"]["nodes"] = [
            {k: v for k, v in node.items() if k != "option-ms"} for node in nodes
        ]
    # result.arrays: GM_T as tuned when it was (what a user deploys), else as searched
    final = result.frontier[-1]
    summary["final-model"] = f"{model_file(final, final.tuned_arrays is not None)}.pt"
    return {**summary, **run.document()}


def save_frontier_model(run: runs.RunFiles, model: GlobalModel) -> None:
    """GM_t as searched and, when tuned, as tuned, each written and scored as written
    (``runs.RunFiles.save_final``: BatchNorm statistics re-estimated on the server's slice);
    ``model`` gets the scores and keeps the weights as trained (the checkpoint's)."""
    extra = {"iteration": model.iteration, "macs": model.macs}
    versions = [(False, model.arrays, "iterations")]
    if model.tuned_arrays is not None:
        versions.append((True, model.tuned_arrays, "final"))
    for tuned, arrays, stage in versions:
        saved = run.save_final(
            model_file(model, tuned),
            build_prunable(**model.spec),
            arrays,
            stage=stage,
            builder=PRUNABLE,
            space_spec=model.spec,
            **extra,
        )
        if saved.score is None:
            continue
        if tuned:
            model.tuned_global_test_accuracy = saved.score.accuracy
        else:
            model.global_test_accuracy = saved.score.accuracy
            model.global_test_count = saved.score.count


#: ``decnas.resource`` -> the unit its budgets and costs are counted in, as result keys name it
RESOURCE_UNITS = {"macs": "macs", "params": "params", "latency": "ms"}


def with_units(summary: dict[str, Any], resource: str) -> dict[str, Any]:
    """``summary`` with each budget and resource cost also under a key naming its unit
    (``decnas.resource``: ``budget-macs``, ``budget-ms``, ...; the history's per-candidate
    ``resource-<unit>``); ``budget`` / ``resource`` stay, the same values, for readers of
    earlier result files."""
    unit = RESOURCE_UNITS[resource]
    for entry in summary.get("frontier", []):
        entry[f"budget-{unit}"] = entry.get("budget")
    for entry in summary.get("history", []):
        if "budget" in entry:
            entry[f"budget-{unit}"] = entry["budget"]
        if "resource" in entry:
            entry[f"resource-{unit}"] = entry["resource"]
    return summary


def decnas_plan(settings: Any, nodes: int, layers: int) -> RunEstimate:
    """The whole run's estimate (``progress.RunEstimate``) of DecNAS, in client-epochs (a
    client training a model for ``decnas.local-epochs``), ``nodes`` clients, a net of
    ``layers`` prunable layers: GM_0's FedAvg rounds (``gm0``); every NetAdapt iteration
    ``t`` up to ``max-iterations`` (``iteration-<t>``), its rounds from the schedule
    (``rounds`` / ``rounds-every``; the largest every iteration without dynamic rounds),
    a round training each surviving candidate (one per prunable layer at first, ``ceil(
    drop-ratio x layers)`` fewer after each round when dropping) on one group of
    ``nodes / num-groups`` clients (every client without groups); the tuning rounds of
    GM_T, or of every GM_t with ``final-models = "all"`` (``final-gm<t>``); with
    ``width-baseline``, each GM_t's baseline (``width-<t>``). A search that reaches its
    target before ``max-iterations`` ends the run before the plan does."""
    recipe, epochs = settings.train, settings.train.local_epochs
    per_round = float(recipe.clients(nodes) * epochs)
    group = nodes / (min(settings.num_groups, nodes) if settings.grouping else 1)
    drop = math.ceil(settings.drop_ratio * layers - 1e-9) if settings.dropping else 0
    stages = [PlannedStage(GM0, recipe.rounds, per_round)]
    for t in range(1, settings.max_iterations + 1):
        rounds = (
            rounds_for(t, settings.rounds, settings.rounds_every)
            if settings.dynamic_rounds
            else max(settings.rounds)
        )
        trained = [max(1, layers - r * drop) for r in range(rounds)]  # candidates per round
        stages.append(
            PlannedStage(f"iteration-{t}", rounds, sum(trained) / rounds * group * epochs)
        )
    tuned = settings.max_iterations if settings.final_models == "all" else 1
    stages.append(PlannedStage("final-gm*", tuned * settings.final_rounds, per_round))
    if settings.width_baseline:
        rounds = settings.max_iterations * (recipe.rounds + settings.final_rounds)
        stages.append(PlannedStage("width-*", rounds, per_round))
    return RunEstimate(stages, replan=lambda count: decnas_plan(settings, count, layers).stages)


def model_file(model: GlobalModel, tuned: bool) -> str:
    """The name (without ``.pt``) of GM_t's file: ``gm-<t>``, as tuned ``gm-<t>-tuned``
    (``<kind>-<index>[-<variant>]`` as every method's model files; ``gm<t>`` before issue 41)."""
    return f"gm-{model.iteration}" + ("-tuned" if tuned else "")
