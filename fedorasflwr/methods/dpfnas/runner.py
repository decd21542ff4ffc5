"""DP-FNAS's runner: run config -> darts space, ``DPFNAS.start``, derived net, privacy report."""

from __future__ import annotations

from dataclasses import replace
from logging import INFO
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from ...checkpoints import Checkpointer
from ...config import RunSettings
from ...data import load_server_data
from ...latency import table_document
from ...model_files import DERIVED, SPACE
from ...runs import (
    RunFiles,
    build_supernet,
    describe_space,
    latency_document,
    resume_checkpoint,
    start,
    strategy_options,
)
from ...search_spaces.darts_style import build_derived_network
from .plots import plot_dpfnas
from .strategy import DPFNAS, json_safe, privacy_report

__all__ = ["run_dpfnas"]


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
    initial, rounds = ArrayRecord(space.state_dict()), settings.method_settings.iterations
    result = start(strategy, grid, settings, run, initial, rounds)
    genotype = result.genotype.to_text()
    run.save("supernet", result.arrays, stage="search", builder=SPACE, genotype=genotype)
    if result.final_arrays is not None:
        net = build_derived_network(space.spec, genotype)
        run.save(
            "derived",
            result.final_arrays,
            stage="final",
            builder=DERIVED,
            model=net,
            genotype=genotype,
        )
    run.add(
        plot_dpfnas(
            out_dir / "privacy_accuracy.png",
            result.history,
            settings.method_settings.target_epsilon,
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
        "privacy": privacy_report(result.privacy),
        "noise": result.noise,
        "test-accuracy": result.test_accuracy,
        "final-privacy": json_safe(result.final_privacy),
        "history": json_safe(result.history),
        "final-history": result.final_history,
        "ledger": result.ledger,
        **latency,
        **run.document(),
    }
