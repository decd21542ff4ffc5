"""ServerApp: run config -> data spec, search space, strategy -> start() -> artifacts."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from logging import INFO
from pathlib import Path
from typing import Any

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

from .artifacts import plot_history, run_directory, save_checkpoint, write_json
from .config import RunSettings, parse_run_config, space_kwargs
from .data import dataset_info, load_server_data
from .evaluation import SupernetEvaluator
from .search_spaces import SearchSpace, build_space
from .strategies.base import NodeProfile
from .strategies.fedoras import FedorAS

app = ServerApp()


def build_supernet(settings: RunSettings) -> SearchSpace:
    """The run's search space, initialised from the run seed."""
    torch.manual_seed(settings.seed)
    return build_space(**space_kwargs(settings.space, dataset_info(settings.data)))


def _check_partitions(settings: RunSettings, profiles: Sequence[NodeProfile]) -> None:
    counts = {p.num_partitions for p in profiles}
    if len(counts) != 1:
        raise ValueError(f"nodes disagree on num-partitions: {sorted(counts)}")
    settings.data.check_partitionable(counts.pop())


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


def run_fedoras(grid: Grid, settings: RunSettings, out_dir: Path) -> dict[str, Any]:
    """FedorAS Stage 1 end to end; returns the result document."""
    space = build_supernet(settings)
    evaluator = SupernetEvaluator(
        space=build_supernet(settings),
        dataset=load_server_data(settings.data),
        num_paths=settings.fedoras.eval_paths,
        seed=settings.seed,
    )
    strategy = FedorAS(
        space=space,
        settings=settings.fedoras,
        seed=settings.seed,
        evaluate_fn=evaluator,
        validate_profiles=lambda profiles: _check_partitions(settings, profiles),
        reply_timeout=settings.reply_timeout,
        min_nodes=settings.min_nodes,
    )
    result = strategy.start(grid)
    checkpoint = save_checkpoint(
        out_dir / "supernet.pt",
        space_spec=space.spec,
        arrays=result.arrays,
        stage="supernet",
        rounds=settings.fedoras.rounds,
        tiers=[asdict(t) for t in result.tiers],
    )
    plot = plot_history(
        out_dir / "supernet_accuracy.png",
        result.history,
        "val-accuracy",
        title="Supernet: mean accuracy of random paths",
        ylabel="accuracy",
    )
    return {
        "space": describe_space(space),
        "tiers": result.tiers,
        "tier-of-partition": result.tier_of_partition,
        "history": result.history,
        "ledger": result.ledger,
        "files": [str(p.name) for p in (checkpoint, plot) if p is not None],
    }


#: method name (run config ``method``) -> runner returning the result document.
RUNNERS: dict[str, Callable[[Grid, RunSettings, Path], dict[str, Any]]] = {
    "fedoras": run_fedoras,
}


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Parse the run config (fail before any training), run the method, write artifacts."""
    started = time.time()
    settings = parse_run_config(context.run_config)
    out_dir = run_directory(settings.output_path, settings.method, context.run_id)
    log(INFO, "fedorasflwr: method %s, results in %s", settings.method, out_dir)
    document = RUNNERS[settings.method](grid, settings, out_dir)
    write_json(
        out_dir / "result.json",
        {
            "method": settings.method,
            "settings": settings,
            "run-id": context.run_id,
            "seconds": round(time.time() - started, 2),
            **document,
        },
    )
    log(INFO, "fedorasflwr: wrote %s", out_dir / "result.json")
