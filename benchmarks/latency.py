"""Latency lookup tables against measured latency, on this machine (issue 16 item 3).

For every built-in search space at its default size (``cnn_s``, ``cnn_l``, ``rnn``,
``mbconv``, ``darts``): the table a node would send for ``query.latency``
(``fedorasflwr.latency.measure_table``: every option timed at batch 1 on its layer's
input, ``warmup`` untimed calls, the median of ``repeats`` timed ones, interleaved over
the options; the fixed part by difference on 5 paths), then 200 uniformly sampled paths
(stream ``(seed, "latency-paths")``), each path's subnet timed end to end the same way.
Reported per space: Spearman's rank correlation between the table's prediction and the
measured latency (goal: >= 0.9 on every space), the median and 90th percentile of the
relative error, the measured range, and the seconds spent. One torch thread, the CPU.
Prints a Markdown table and ``headline: ...``; writes ``benchmarks/results/latency.json``
(``.quick.json`` for ``--quick``, which times 20 paths with fewer repeats).

``--clock cpu`` times with the process's CPU time instead of the wall clock (written to
``latency.cpu.json``): on a host shared with other jobs it shows whether the table
*model* (options + fixed) holds, apart from the scheduling noise the wall clock carries.
``--statistic min`` keeps the fastest timed call of each option and path instead of the
median (``latency.min.json``): the uncontended latency, less sensitive to that noise.

    python benchmarks/latency.py                # 200 paths per space, 20 repeats
    python benchmarks/latency.py --clock cpu    # the same, process CPU time
    python benchmarks/latency.py --statistic min
    python benchmarks/latency.py --compare-threads --statistic min   # 1 against 2 threads
    python benchmarks/latency.py --quick        # CI smoke run (seconds)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch
from common import ROOT, report

SPACES = ("cnn_s", "cnn_l", "rnn", "mbconv", "darts")
GOAL_RHO = 0.9


def settings(quick: bool) -> dict[str, Any]:
    return {
        "paths": 20 if quick else 200,
        "repeats": 5 if quick else 20,
        "warmup": 2 if quick else 5,
        "statistic": "median",
        "seed": 0,
        "threads": 1,
        "device": "cpu",
        "clock": "wall",
    }


def _table(space: Any, setting: dict[str, Any], clock: str) -> Any:
    """The space's latency table with the run's settings, timed on ``clock``."""
    from fedorasflwr.latency import measure_table

    keys = ("device", "repeats", "warmup", "statistic", "seed")
    return measure_table(space, clock=clock, **{key: setting[key] for key in keys})


def measure_space(name: str, setting: dict[str, Any]) -> dict[str, Any]:
    """One space: its table, the sampled paths' prediction and measurement."""
    from fedorasflwr.latency import sample_paths, validate
    from fedorasflwr.search_spaces import build_space

    space = build_space(name)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    table = _table(space, setting, setting["clock"])
    table_seconds = time.perf_counter() - started
    paths = sample_paths(space, setting["paths"], setting["seed"], "latency-paths")
    check = validate(table, space, paths)
    return {
        "space": name,
        "spec": space.spec,
        "options": sum(space.num_options()),
        "paths": check.paths,
        "spearman_rho": check.spearman_rho,
        "relative_error": check.relative_error,
        "relative_error_p90": check.relative_error_p90,
        "measured_min_ms": min(check.measured_ms),
        "measured_max_ms": max(check.measured_ms),
        "fixed_ms": table.fixed_ms,
        "table_seconds": table_seconds,
        "seconds": time.perf_counter() - started,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "table": {"option_ms": table.option_ms, "fixed_ms": table.fixed_ms},
        "archs": [list(a) for a in paths],
        "predicted_ms": list(check.predicted_ms),
        "measured_ms": list(check.measured_ms),
    }


def compare_threads(name: str, setting: dict[str, Any]) -> dict[str, Any]:
    """One space's table with 1 and with 2 torch threads (the emulated device classes of
    ``docs/latency.md``): the same sampled paths' predicted latency under each."""
    import statistics

    from fedorasflwr.latency import path_latency, sample_paths
    from fedorasflwr.search_spaces import build_space

    space = build_space(name)
    paths = sample_paths(space, setting["paths"], setting["seed"], "latency-paths")
    predicted = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        table = _table(space, setting, "wall")
        predicted[threads] = [path_latency(table, arch) for arch in paths]
    torch.set_num_threads(setting["threads"])
    ratios = [one / two for one, two in zip(predicted[1], predicted[2], strict=True)]
    return {
        "space": name,
        "median_path_ms_1_thread": statistics.median(predicted[1]),
        "median_path_ms_2_threads": statistics.median(predicted[2]),
        "speed_up_median": statistics.median(ratios),
        "speed_up_min": min(ratios),
        "speed_up_max": max(ratios),
        "load": os.getloadavg()[0],
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| space | options | paths | Spearman rho | median rel. error | p90 rel. error "
        "| measured ms (min-max) | fixed ms | seconds | load |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['space']} | {row['options']} | {row['paths']} | {row['spearman_rho']:.3f} "
            f"| {row['relative_error']:.3f} | {row['relative_error_p90']:.3f} "
            f"| {row['measured_min_ms']:.3f}-{row['measured_max_ms']:.3f} "
            f"| {row['fixed_ms']:.3f} | {row['seconds']:.1f} "
            f"| {row['load_before']:.1f}-{row['load_after']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    parser.add_argument("--spaces", nargs="+", default=list(SPACES), choices=SPACES)
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: what a user waits; cpu: process CPU time, blind to other processes' load",
    )
    parser.add_argument(
        "--statistic",
        choices=("median", "min"),
        default="median",
        help="how the timed calls of an option or a path reduce (both sides alike)",
    )
    parser.add_argument(
        "--compare-threads",
        action="store_true",
        help="instead: each space's table with 1 and with 2 threads (emulated device classes)",
    )
    args = parser.parse_args(argv)
    if str(ROOT) not in sys.path:  # this checkout's package first
        sys.path.insert(0, str(ROOT))
    setting = {**settings(args.quick), "clock": args.clock, "statistic": args.statistic}
    torch.set_num_threads(setting["threads"])
    if args.compare_threads:
        for name in args.spaces:
            row = compare_threads(name, setting)
            print(
                f"{name}: median path {row['median_path_ms_1_thread']:.3f} ms with 1 thread, "
                f"{row['median_path_ms_2_threads']:.3f} ms with 2; 1-thread / 2-thread "
                f"median {row['speed_up_median']:.2f} (min {row['speed_up_min']:.2f}, "
                f"max {row['speed_up_max']:.2f}); load {row['load']:.1f}",
                flush=True,
            )
        return 0
    started = time.perf_counter()
    rows = [measure_space(name, setting) for name in args.spaces]
    print(table(rows))
    rhos = {row["space"]: row["spearman_rho"] for row in rows}
    summary: dict[str, Any] = {f"rho_{name}": rho for name, rho in rhos.items()}
    summary.update(
        {
            "min_rho": min(rhos.values()),
            "max_median_relative_error": max(row["relative_error"] for row in rows),
            "paths": setting["paths"],
            "goal_met": min(rhos.values()) >= GOAL_RHO,
            "seconds": time.perf_counter() - started,
            "load_average": os.getloadavg()[0],
        }
    )
    name = "latency" + "".join(
        f".{value}"
        for value, default in ((args.clock, "wall"), (args.statistic, "median"))
        if value != default
    )
    report(name, args.quick, summary, {"settings": setting, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
