"""What the simulation engine adds to a FedorAS Stage-1 round.

One run, side by side, same seed:

- **engine**: the app under ``flwr run`` on the simulation engine (Ray, one CPU
  per ClientApp, so two clients train at once on a 2-core machine);
- **direct**: the same strategy and the same client code in one process through
  ``fedorasflwr.inprocess.InProcessGrid`` (same clients, subspaces, batches and
  paths, since every draw is seeded), i.e. plain PyTorch training one client
  after the other, plus the server's subspace sampling and OPA.

Both sides time each round from configure to aggregate (``history[i]["seconds"]``);
round 1 pays one-off start-up (actors importing torch, caches), so the ratio uses
the later rounds.  Prints a Markdown table and ``headline: ...``; writes
``benchmarks/results/stage1_overhead.json`` (``.quick.json`` for ``--quick``).

    python benchmarks/stage1_overhead.py            # 20 clients, 10 per round, 8 rounds
    python benchmarks/stage1_overhead.py --quick    # smoke run: 10 clients, 2 per round, 3 rounds
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, report, run_config, warm_data_cache


def settings(quick: bool, output_dir: Path, cache_dir: Path) -> dict:
    return {
        "output-dir": str(output_dir),
        "data.cache-dir": str(cache_dir),
        "space.width": 0.25 if quick else 0.5,
        "fedoras.rounds": 3 if quick else 8,
        # the smoke run: 2 of 10 clients per round, a fifth of the full run's training
        "fedoras.clients-per-round": 2 if quick else 10,
        "fedoras.local-epochs": 1 if quick else 2,
        "fedoras.tier-samples": 2000,
        "fedoras.eval-every": 0,
        "fedoras.stop-after": "supernet",  # Stage 1 only, on both sides
    }


def engine_rounds(overrides: dict, num_clients: int) -> tuple[list[float], float]:
    from fedorasflwr.launch import run_simulation

    result = run_simulation(
        ROOT, num_supernodes=num_clients, run_config=overrides, client_num_cpus=1, timeout=1800
    )
    document = json.loads(next(Path(overrides["output-dir"]).glob("*/result.json")).read_text())
    return [h["seconds"] for h in document["history"][1:]], result.wall_time


def direct_rounds(overrides: dict, num_clients: int) -> tuple[list[float], float]:
    from fedorasflwr.client_app import app
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.inprocess import InProcessGrid
    from fedorasflwr.methods.fedoras.strategy import FedorAS
    from fedorasflwr.runs import build_supernet

    config = run_config(overrides)
    run = parse_run_config(config)
    started = time.perf_counter()
    strategy = FedorAS(space=build_supernet(run), settings=run.fedoras, seed=run.seed)
    from flwr.app import ArrayRecord

    grid = InProcessGrid(app, config, num_clients)
    result = strategy.start(grid, ArrayRecord(), num_rounds=run.fedoras.train.rounds)
    return [h["seconds"] for h in result.history[1:]], time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    args = parser.parse_args(argv)
    num_clients = 10 if args.quick else 20
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        cache = tmp_path / "cache"
        direct_config = settings(args.quick, tmp_path / "direct", cache)
        # neither side pays for partitioning
        warm_data_cache([run_config(direct_config)], num_clients)
        direct, direct_wall = direct_rounds(direct_config, num_clients)
        engine, engine_wall = engine_rounds(
            settings(args.quick, tmp_path / "engine", cache), num_clients
        )
    warm = slice(1, None) if len(engine) > 1 else slice(None)
    engine_round = statistics.median(engine[warm])
    direct_round = statistics.median(direct[warm])
    ratio = engine_round / direct_round
    rows = [
        ("engine (flwr run, simulation)", engine, engine_wall),
        ("direct (one process, PyTorch)", direct, direct_wall),
    ]
    print("| side | round seconds (1st, then later) | median later round | whole run s |")
    print("| --- | --- | --- | --- |")
    for name, rounds, wall in rows:
        shown = ", ".join(f"{r:.2f}" for r in rounds)
        print(f"| {name} | {shown} | {statistics.median(rounds[warm]):.2f} | {wall:.1f} |")
    print()
    report(
        "stage1_overhead",
        args.quick,
        {
            "engine_over_direct": ratio,
            "engine_round_s": engine_round,
            "direct_round_s": direct_round,
            "clients": num_clients,
        },
        {
            "settings": settings(args.quick, Path("-"), Path("-")),
            "engine_round_seconds": engine,
            "direct_round_seconds": direct,
            "engine_wall_seconds": engine_wall,
            "direct_wall_seconds": direct_wall,
            "engine_over_direct": ratio,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
