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
    python benchmarks/latency.py --only fedoras # only the FedorAS run below

**FedorAS with two emulated device classes** (issue 16 item 3, second part; run after the
tables unless ``--only tables``): one seeded FedorAS run, all three stages, in-process (the
real ClientApp through ``InProcessGrid``), ``fedoras.resource = "latency"``,
``latency.statistic = "min"``, MNIST-5k iid, cnn_s. Half the nodes are
``{"device-class": "1-thread", "num-threads": 1}``, half ``{"device-class": "2-threads",
"num-threads": 2}`` (``docs/latency.md``: on a loaded 2-core host 2 threads is usually the
slower class). The node cache (``$FEDORASFLWR_CACHE``) is a fresh temporary directory.

Budgets are chosen from the measured tables: each class's table is measured first in a
process of its own whose torch threads are set once (a device of the class, as a
SuperNode with ``num-threads``; in one process that switches threads, a 2-thread node
could time like a 1-thread one) and stored in the node cache, under the key the nodes of
the class look up; a first setup of the strategy (no budgets) has the nodes answer
``query.latency`` from that cache (checked) and gives the tiers, which do not depend on
the budgets. The *slower* class (the larger median latency of :data:`BUDGET_PATHS` paths,
stream ``(seed, "latency-paths")``, on its own table) declares ``latency-budget-ms`` =
the upper bound of the lowest tier that holds at least a quarter of those paths on its
own table, and whose bound is at least its own fastest path (at most the second-highest
tier); the faster class the bound of the tier above. So the classes land in adjacent
tiers, the faster one higher. The tiers are cut on every node's table (the median of
the two classes'), so on a loaded host the slower class's fastest path can lie above
every tier's bound: its tier's search then finds no path within the bound on its
devices and keeps the least violating one (the row's ``reachable`` is false, and the
headline's ``fedoras_budgets_reachable``).

After the run, each tier's chosen model (``init`` "supernet") is built standalone
(``space.subnet(arch)``, the run's weights) and timed end to end at batch 1 in a fresh
process per class whose torch threads are set once to the class's (as on a SuperNode with
``num-threads``; :func:`time_in_fresh_process` says why not in the run's process), for
every class with nodes in that tier (``latency.measure_paths``, the fastest of 50 calls;
the median over 3 such processes, each listed in the JSON; quick: 10 calls, 1 process):
reported per (tier, class) the predicted ms (the tier's table, and the class's own),
the measured ms, the ratio measured / predicted (own table), the tier's upper bound and
the class's declared budget, and whether the measured latency is within that budget.
Quick: cnn_s width 0.25, 4 nodes holding 4 of 20 partitions, 1 Stage-1 round, 2 scored
paths per tier, 1 fine-tuning round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import ROOT, report, run_config, warm_data_cache

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


#: the emulated device classes: (device-class, num-threads)
CLASSES = (("1-thread", 1), ("2-threads", 2))
#: sampled paths whose latency on a class's own table orders the classes and sets budgets
BUDGET_PATHS = 200
#: the share of those paths the slower class's tier must hold (on its own table)
BUDGET_SHARE = 0.25


def fedoras_settings(quick: bool, nodes: int) -> dict[str, Any]:
    """The FedorAS run's config overrides (``data.cache-dir`` is added at run time)."""
    return {
        "method": "fedoras",
        "seed": 0,
        "device": "cpu",
        "data.partitioner": "iid",
        "data.server-fraction": 0.02 if quick else 0.1,
        "space.name": "cnn_s",
        "space.width": 0.25 if quick else 0.5,
        "fedoras.resource": "latency",
        "fedoras.rounds": 1 if quick else 5,
        "fedoras.clients-per-round": nodes,
        "fedoras.local-epochs": 1,
        "fedoras.tier-samples": 500 if quick else 5000,
        "fedoras.eval-every": 0 if quick else 1,
        "fedoras.eval-paths": 2 if quick else 4,
        "fedoras.min-replies": 1,
        "fedoras.search-population": 2 if quick else 8,
        "fedoras.search-offspring": 2 if quick else 4,
        "fedoras.search-evaluations": 2 if quick else 24,
        "fedoras.search-clients": 2,
        "fedoras.finetune-rounds": 1 if quick else 3,
        "fedoras.finetune-clients-per-round": 2 if quick else 4,
        "fedoras.compare-rand-init": False,
        "latency.statistic": "min",
        "latency.repeats": 3 if quick else 20,
        "latency.warmup": 1 if quick else 5,
        "latency.validation-paths": 0 if quick else 20,
    }


def _fedoras(config: dict[str, Any]) -> Any:
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.methods.fedoras.runner import build_fedoras

    return build_fedoras(parse_run_config(config))


def _quantile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.quantile(values, q))


def _time_subnets(
    spec: dict[str, Any],
    state: dict[str, Any],
    archs: list[tuple[int, ...]],
    threads: int,
    repeats: int,
    warmup: int,
) -> list[float]:
    """In a fresh process: ``measure_paths`` of ``archs`` of the space ``spec`` with
    weights ``state``, torch threads set once to ``threads``."""
    torch.set_num_threads(threads)
    from fedorasflwr.latency import measure_paths
    from fedorasflwr.search_spaces import build_space

    space = build_space(**spec)
    space.load_state_dict(state)
    return measure_paths(
        space, archs, device="cpu", repeats=repeats, warmup=warmup, statistic="min"
    )


def _class_table(spec: dict[str, Any], request: Any, threads: int) -> Any:
    """In a fresh process: this device class's table, measured with torch threads set
    once to ``threads`` and stored in the node cache (``$FEDORASFLWR_CACHE``) under the
    key the run's nodes of the class look up."""
    torch.set_num_threads(threads)
    from fedorasflwr.clients.latency import cached_table
    from fedorasflwr.search_spaces import build_space

    table, _ = cached_table(build_space(**spec), request, torch.device("cpu"))
    return table


def in_fresh_process(function: Any, *args: Any) -> Any:
    """``function(*args)`` in a new (spawned) process, as a device of a class is."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, args)


def time_in_fresh_process(
    spec: dict[str, Any],
    state: dict[str, Any],
    archs: list[tuple[int, ...]],
    threads: int,
    repeats: int,
    warmup: int,
) -> list[float]:
    """:func:`_time_subnets` in a new process: a device of the class, as a SuperNode with
    ``num-threads`` is, apart from the run's process (whose nodes switch torch threads)."""
    return in_fresh_process(_time_subnets, spec, state, archs, threads, repeats, warmup)


def fedoras_classes(quick: bool, threads: int) -> dict[str, Any]:
    """The FedorAS run with two emulated device classes (see the module docstring)."""
    from flwr.app import ArrayRecord

    from fedorasflwr.client_app import app
    from fedorasflwr.inprocess import InProcessGrid
    from fedorasflwr.latency import sample_paths
    from fedorasflwr.methods.fedoras.tiers import PathCost

    nodes = 4 if quick else 8
    # the data split in this many partitions, the nodes holding the first ones (quick: a
    # small local data set, for time)
    partitions = 20 if quick else nodes
    # the end-to-end timing of the models: calls per process, and processes per class
    repeats, warmup, processes = (10, 2, 1) if quick else (50, 5, 3)
    class_of = {pid: CLASSES[0] if pid < nodes // 2 else CLASSES[1] for pid in range(nodes)}
    threads_of = dict(CLASSES)
    started = time.perf_counter()
    saved_cache = os.environ.get("FEDORASFLWR_CACHE")
    load_before = os.getloadavg()[0]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["FEDORASFLWR_CACHE"] = str(Path(tmp) / "node-cache")  # measured afresh
            config = run_config(
                {**fedoras_settings(quick, nodes), "data.cache-dir": str(Path(tmp) / "data")}
            )
            warm_data_cache([config], partitions)
            plain = {
                pid: {"device-class": c, "num-threads": n, "num-partitions": partitions}
                for pid, (c, n) in class_of.items()
            }

            # 1. each class's table, measured in a process of its own (a device of the
            # class) into the node cache, which the nodes read; the tiers, which no
            # budget moves
            probe = _fedoras(config)
            measured_table = {
                c: in_fresh_process(
                    _class_table, probe.space.spec, probe.latency_request, threads_of[c]
                )
                for c, _ in CLASSES
            }
            probe_grid = InProcessGrid(app, config, nodes, node_configs=plain)
            probe.setup(probe_grid)
            tiers = probe.tiers
            table_of = {
                c: probe.node_tables[probe_grid.node_of_partition[pid]]
                for pid, (c, _) in class_of.items()
            }
            if any(
                (t.option_ms, t.fixed_ms, t.threads)
                != (measured_table[c].option_ms, measured_table[c].fixed_ms, threads_of[c])
                for c, t in table_of.items()
            ):
                raise RuntimeError("the nodes did not read their class's table from the cache")
            paths = sample_paths(probe.space, BUDGET_PATHS, 0, "latency-paths")
            own_ms = {c: [t.path_ms(a) for a in paths] for c, t in table_of.items()}
            median_ms = {c: statistics.median(v) for c, v in own_ms.items()}
            slower = max(median_ms, key=median_ms.__getitem__)
            faster = next(c for c in median_ms if c != slower)
            fastest = {c: PathCost(probe.space, t).lowest() for c, t in table_of.items()}
            # a bound the slower class can reach (its fastest path), if any tier's can
            share = max(_quantile(own_ms[slower], BUDGET_SHARE), fastest[slower])
            low = next((t.index for t in tiers if t.high >= share), len(tiers) - 2)
            low = min(low, len(tiers) - 2)
            budget_of = {slower: tiers[low].high, faster: tiers[low + 1].high}
            table_seconds = time.perf_counter() - started

            # 2. the run: each node declares its class's budget
            node_configs = {
                pid: {**plain[pid], "latency-budget-ms": budget_of[c]}
                for pid, (c, _) in class_of.items()
            }
            strategy = _fedoras(config)
            grid = InProcessGrid(app, config, nodes, node_configs=node_configs)
            result = strategy.start(grid, ArrayRecord(), strategy.settings.train.rounds)
            run_seconds = time.perf_counter() - started - table_seconds

            # 3. each tier's chosen model, timed end to end on its nodes' device classes
            classes_in: dict[int, list[str]] = {}
            for pid, tier in sorted(result.tier_of_partition.items()):
                name = class_of[pid][0]
                if name not in classes_in.setdefault(tier, []):
                    classes_in[tier].append(name)
            models = sorted(
                (m for m in result.models if m.init == "supernet" and m.tier in classes_in),
                key=lambda m: m.tier,
            )
            spec, state = strategy.space.spec, strategy.space.state_dict()
            measured: dict[tuple[int, str], list[float]] = {}
            for _ in range(processes):
                for name, _ in CLASSES:
                    mine = [m for m in models if name in classes_in[m.tier]]
                    if not mine:
                        continue
                    times = time_in_fresh_process(
                        spec, state, [m.arch for m in mine], threads_of[name], repeats, warmup
                    )
                    for model, ms in zip(mine, times, strict=True):
                        measured.setdefault((model.tier, name), []).append(ms)
    finally:
        torch.set_num_threads(threads)
        if saved_cache is None:
            os.environ.pop("FEDORASFLWR_CACHE", None)
        else:
            os.environ["FEDORASFLWR_CACHE"] = saved_cache
    rows = []
    for model in models:
        tier = result.tiers[model.tier]
        for name in classes_in[model.tier]:
            ms = statistics.median(measured[(model.tier, name)])
            own = table_of[name].path_ms(model.arch)
            rows.append(
                {
                    "tier": model.tier + 1,
                    "class": name,
                    "threads": threads_of[name],
                    "nodes": sum(
                        1
                        for p, t in result.tier_of_partition.items()
                        if t == model.tier and class_of[p][0] == name
                    ),
                    "arch": list(model.arch),
                    "predicted_ms": model.latency_ms,
                    "class_predicted_ms": own,
                    "class_fastest_ms": fastest[name],
                    "reachable": fastest[name] <= tier.high * (1 + 1e-9),
                    "measured_ms": ms,
                    "measured_ms_per_process": measured[(model.tier, name)],
                    "measured_over_predicted": ms / own,
                    "tier_low_ms": tier.low,
                    "tier_high_ms": tier.high,
                    "budget_ms": budget_of[name],
                    "within_budget": ms <= budget_of[name],
                    "within_tier_bound": ms <= tier.high,
                    "search_accuracy": model.search_accuracy,
                    "test_accuracy": None if model.test is None else model.test.accuracy,
                }
            )
    return {
        "nodes": nodes,
        "partitions": partitions,
        "settings": fedoras_settings(quick, nodes),
        "timing": {
            "repeats": repeats,
            "warmup": warmup,
            "statistic": "min",
            "processes": processes,
        },
        "classes": {
            name: {
                "threads": threads_of[name],
                "budget_ms": budget_of[name],
                "median_path_ms": median_ms[name],
                "min_path_ms": min(own_ms[name]),
                "max_path_ms": max(own_ms[name]),
                "fixed_ms": table_of[name].fixed_ms,
                "validation": None
                if table_of[name].validation is None
                else vars(table_of[name].validation),
                "tiers": sorted(
                    {result.tier_of_partition[p] + 1 for p, (c, _) in class_of.items() if c == name}
                ),
            }
            for name in threads_of
        },
        "slower_class": slower,
        "tiers": [{"tier": t.index + 1, "low_ms": t.low, "high_ms": t.high} for t in result.tiers],
        "rows": rows,
        "table_seconds": table_seconds,
        "run_seconds": run_seconds,
        "seconds": time.perf_counter() - started,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


def fedoras_table(run: dict[str, Any]) -> str:
    lines = [
        "| tier | class (threads) | nodes | predicted ms (tier table) "
        "| predicted ms (class table) | measured ms (per process) | measured / predicted "
        "| tier bound ms | budget ms | within budget |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in run["rows"]:
        each = row["measured_ms_per_process"]
        runs = " (" + " / ".join(f"{ms:.3f}" for ms in each) + ")" if len(each) > 1 else ""
        lines.append(
            f"| {row['tier']} | {row['class']} ({row['threads']}) | {row['nodes']} "
            f"| {row['predicted_ms']:.3f} | {row['class_predicted_ms']:.3f} "
            f"| {row['measured_ms']:.3f}{runs} | {row['measured_over_predicted']:.2f} "
            f"| {row['tier_high_ms']:.3f} | {row['budget_ms']:.3f} "
            f"| {'yes' if row['within_budget'] else 'no'} |"
        )
    return "\n".join(lines)


def fedoras_summary(run: dict[str, Any]) -> dict[str, Any]:
    rows = run["rows"]
    tiers = {name: c["tiers"] for name, c in run["classes"].items()}
    return {
        "fedoras_tiers_within_measured_budget": (
            sum(r["within_budget"] for r in rows) / len(rows) if rows else float("nan")
        ),
        "fedoras_measured_over_predicted_median": (
            statistics.median(r["measured_over_predicted"] for r in rows) if rows else float("nan")
        ),
        "fedoras_budgets_reachable": all(r["reachable"] for r in rows),
        "fedoras_class_tiers": ",".join(
            f"{name}:{'+'.join(map(str, t))}" for name, t in tiers.items()
        ),
        "fedoras_distinct_tiers": not set(tiers[CLASSES[0][0]]) & set(tiers[CLASSES[1][0]]),
        "fedoras_seconds": run["seconds"],
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
    parser.add_argument(
        "--only",
        choices=("tables", "fedoras"),
        default=None,
        help="run only the tables per space, or only the FedorAS run (default: both)",
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
    summary: dict[str, Any] = {}
    document: dict[str, Any] = {"settings": setting}
    if args.only != "fedoras":
        rows = [measure_space(name, setting) for name in args.spaces]
        print(table(rows))
        rhos = {row["space"]: row["spearman_rho"] for row in rows}
        summary.update({f"rho_{name}": rho for name, rho in rhos.items()})
        summary.update(
            {
                "min_rho": min(rhos.values()),
                "max_median_relative_error": max(row["relative_error"] for row in rows),
                "paths": setting["paths"],
                "goal_met": min(rhos.values()) >= GOAL_RHO,
            }
        )
        document["rows"] = rows
    if args.only != "tables":
        run = fedoras_classes(args.quick, setting["threads"])
        print()
        print(fedoras_table(run))
        summary.update(fedoras_summary(run))
        document["fedoras"] = run
    summary.update({"seconds": time.perf_counter() - started, "load_average": os.getloadavg()[0]})
    name = "latency" + "".join(
        f".{value}"
        for value, default in (
            (args.clock, "wall"),
            (args.statistic, "median"),
            (args.only or "", ""),
        )
        if value != default
    )
    report(name, args.quick, summary, document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
