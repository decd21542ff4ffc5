"""DP-FNAS's runner: run config -> darts space, ``DPFNAS.start``, derived net, privacy report."""

from __future__ import annotations

from dataclasses import replace
from logging import INFO
from pathlib import Path
from typing import Any

from flwr.serverapp import Grid
from flwr.supercore import log

from ...arrays import record_of
from ...checkpoints import Checkpointer
from ...config import RunSettings
from ...costs import flops_to_macs
from ...data import load_server_data
from ...latency import table_document
from ...model_files import DERIVED, SPACE
from ...progress import PlannedStage, RunEstimate
from ...runs import (
    RunFiles,
    build_supernet,
    chance_accuracy,
    describe_space,
    latency_document,
    resume_checkpoint,
    start,
    strategy_options,
)
from ...search_spaces.darts import genotype_cost
from ...search_spaces.darts_style import build_derived_network
from .plots import plot_dpfnas
from .strategy import DPFNAS, json_safe, privacy_report

__all__ = ["ITERATION_WORK", "derived_cost", "dpfnas_plan", "run_dpfnas"]

#: one search iteration of one party, in client-epochs (the plan's unit of work): two
#: private exchanges, each a Poisson batch of ``dpfnas.batch-size`` samples with per-sample
#: gradients through the mixed supernet (every operation of every edge), and the server's
#: round trips, against a local epoch of the derived net over the party's partition.
#: Measured on ``configs/quick-dpfnas.toml`` (20 parties, a 2-core CPU under a steady load
#: of about 8): 2.6 s per party and iteration (iterations 1-2: 54.4 s, 50.6 s) against
#: 0.63 s per client-epoch (final rounds of 10 clients x 5 epochs: 23.6-42 s), so about 4
#: (an earlier run under a changing load gave 0.87 s against 0.93 s). A rough guide until the
#: final training's first round is timed; it was 0.15, which with the plan's node count at
#: ``min-nodes`` (2, not the 20 parties) foresaw that preset at 41 minutes
ITERATION_WORK = 4.0


def run_dpfnas(
    grid: Grid, settings: RunSettings, out_dir: Path, progress: Checkpointer | None = None
) -> dict[str, Any]:
    """DP-FNAS: private federated DARTS search, derivation, FedAvg training, privacy report."""
    if settings.space.name != "darts":
        log(INFO, "DP-FNAS searches the darts space (run config 'space.name' ignored)")
        settings = replace(settings, space=replace(settings.space, name="darts"))
    space = build_supernet(settings)
    server_data = load_server_data(settings.data)
    strategy = DPFNAS(
        space=space,
        settings=settings.method_settings,
        server_data=server_data if len(server_data) else None,  # validates the supernet
        latency_request=settings.latency.request(settings.seed),
        **strategy_options(
            settings,
            resume_checkpoint(
                settings,
                space,
                {
                    "search": settings.method_settings.iterations,
                    "final": settings.method_settings.final.rounds,
                },
            ),
        ),
    )
    run = RunFiles(out_dir, settings, space.spec, progress)
    initial, rounds = record_of(space.state_dict()), settings.method_settings.iterations
    with dpfnas_plan(settings.method_settings, settings.min_nodes).active():
        result = start(strategy, grid, settings, run, initial, rounds)
    genotype = result.genotype.to_text()
    run.save("supernet", result.arrays, stage="search", builder=SPACE, genotype=genotype)
    if result.final_arrays is not None:  # scored on the server as written (RunFiles.save_final)
        final = run.save_final(
            "derived",
            build_derived_network(space.spec, genotype),
            result.final_arrays,
            stage="final",
            builder=DERIVED,
            genotype=genotype,
        )
        if final.score is not None:
            result.global_test_accuracy = final.score.accuracy
            result.global_test_count = final.score.count
    run.add(
        plot_dpfnas(
            out_dir / "privacy_accuracy.png",
            result.history,
            settings.method_settings.target_epsilon,
            chance_accuracy(settings),
            result.test_accuracy,
        )
    )
    latency: dict[str, Any] = {}
    if settings.method_settings.resource == "latency":
        latency = {
            "latency": result.latency,
            "latency-tables": {
                **latency_document(strategy.profiles, result.latency_tables),
                "groups": {"parties": table_document(strategy.group_latency)},
            },
        }
    return {
        "space": describe_space(space),
        "mode": settings.method_settings.mode,
        "genotype": result.genotype.to_text(),
        "iterations": result.iterations,
        "stopped": result.stopped,
        **derived_cost(space, result.genotype),
        "privacy": privacy_report(result.privacy),
        "noise": result.noise,
        "test-accuracy": result.test_accuracy,
        **(
            {}
            if result.global_test_accuracy is None
            else {
                "global-test-accuracy": result.global_test_accuracy,
                "global-test-count": result.global_test_count,
            }
        ),
        "final-privacy": json_safe(result.final_privacy),
        "history": json_safe(result.history),
        "final-history": result.final_history,
        "ledger": result.ledger,
        **latency,
        **run.document(),
    }


def derived_cost(space: Any, genotype: Any) -> dict[str, Any]:
    """The derived net's forward ``flops`` and ``macs`` per sample (its path in the darts
    supernet: ``search_spaces.darts.genotype_cost``); empty for a DARTS-style space of
    one's own, whose layout that cost does not know."""
    flops = genotype_cost(space, genotype)
    return {} if flops is None else {"flops": flops, "macs": flops_to_macs(flops)}


def dpfnas_plan(settings: Any, nodes: int) -> RunEstimate:
    """The whole run's estimate (``progress.RunEstimate``) of DP-FNAS's two stages, in
    client-epochs, ``nodes`` parties (one in mode "single"): the search's iterations
    (``DP-FNAS``, ``ITERATION_WORK`` per party) and the derived net's FedAvg rounds
    (``final``: its clients, 0 every party, times local epochs). A privacy target that
    stops the search early is not foreseen."""
    parties = 1 if settings.mode == "single" else nodes
    final = settings.final
    return RunEstimate(
        [
            PlannedStage("DP-FNAS", settings.iterations, parties * ITERATION_WORK),
            PlannedStage("final", final.rounds, float(final.clients(parties) * final.local_epochs)),
        ],
        replan=lambda count: dpfnas_plan(settings, count).stages,
    )
