"""FedNAS's runner: run config -> darts space, ``FedNAS.start``, derived net, result.json."""

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
from ...model_files import DERIVED, SPACE
from ...progress import PlannedStage, RunEstimate
from ...runs import (
    RunFiles,
    build_supernet,
    chance_accuracy,
    describe_space,
    resume_checkpoint,
    start,
    strategy_options,
)
from ...search_spaces.darts_style import build_derived_network
from .plots import fednas_plots
from .settings import FedNASSettings
from .strategy import FedNAS

__all__ = ["SEARCH_WORK", "fednas_plan", "run_fednas"]

#: one local search epoch, in client-epochs (the plan's unit of work: a local epoch of
#: plain training of the derived net): a weight step and an architecture step of the mixed
#: supernet per batch, each a forward and backward through every operation of every edge.
#: Measured on ``configs/quick-fednas.toml`` (2-core CPU): 5.8 s per client search epoch
#: (3 rounds of 5 clients x 2 epochs, 58 s each) against 0.31 s per client-epoch of the
#: derived net (4 final rounds of 10 clients x 5 epochs, 15.5 s each), so about 19; a rough
#: guide until the final training's first round is timed (was 2: that preset's run ETA said
#: 11m31s after its first round, 3 minutes before its end)
SEARCH_WORK = 19.0


def run_fednas(
    grid: Grid, settings: RunSettings, out_dir: Path, progress: Checkpointer | None = None
) -> dict[str, Any]:
    """FedNAS: federated DARTS search, derivation, FedAvg training of the derived net."""
    if settings.space.name != "darts":
        log(INFO, "FedNAS searches the darts space (run config 'space.name' ignored)")
        settings = replace(settings, space=replace(settings.space, name="darts"))
    method: FedNASSettings = settings.method_settings
    space = build_supernet(settings)
    strategy = FedNAS(
        space=space,
        settings=method,
        **strategy_options(
            settings,
            resume_checkpoint(
                settings, space, {"search": method.search.rounds, "final": method.final.rounds}
            ),
        ),
    )
    run = RunFiles(out_dir, settings, space.spec, progress)
    initial = record_of(space.state_dict())
    with fednas_plan(method, settings.min_nodes).active():
        result = start(strategy, grid, settings, run, initial, method.search.rounds)
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
    document = {
        "space": describe_space(space),
        "genotype": genotype,
        "rounds": result.rounds,
        "flops": result.flops,
        "macs": result.macs,
        "alpha-entropy": [h.get("alpha-entropy") for h in result.history],
        "test-accuracy": result.test_accuracy,
        **(
            {}
            if result.global_test_accuracy is None
            else {
                "global-test-accuracy": result.global_test_accuracy,
                "global-test-count": result.global_test_count,
            }
        ),
        "history": result.history,
        "final-history": result.final_history,
        "ledger": result.ledger,
    }
    run.add(*fednas_plots(out_dir, document, chance_accuracy(settings)))
    return {**document, **run.document()}


def fednas_plan(settings: FedNASSettings, nodes: int) -> RunEstimate:
    """The whole run's estimate (``progress.RunEstimate``) in client-epochs: the search's
    rounds (its clients times local epochs times ``SEARCH_WORK``) and the derived net's
    FedAvg rounds (``final``)."""
    search, final = settings.search, settings.final
    return RunEstimate(
        [
            PlannedStage(
                "FedNAS", search.rounds, search.clients(nodes) * search.local_epochs * SEARCH_WORK
            ),
            PlannedStage("final", final.rounds, float(final.clients(nodes) * final.local_epochs)),
        ],
        replan=lambda count: fednas_plan(settings, count).stages,
    )
