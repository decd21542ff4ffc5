"""Where the test suite's CPU goes, by kind of process: the suite as CI runs it (``python
-m pytest``: its workers, and every engine process, Ray worker and subprocess its tests
start), read from ``/proc`` while it runs.

``suite_cpu.py`` gives each test's CPU on one worker; this gives the whole run's CPU by who
spent it: the pytest workers (every in-process federation, the presets, the unit tests),
Ray's ClientApp actors, the simulation and ServerApp processes, SuperLinks, SuperNodes, the
warm ClientApp executors, Flower's command line, the benchmarks' quick runs, and the rest of
the machine. Every process's user + system CPU seconds are read every ``--interval`` seconds
(``/proc/<pid>/stat``; a process's CPU before the sampler first saw it is not counted, and a
process that ends loses at most its last interval; the reader's own process is a row of its
own); ``covered`` compares their sum with the machine's own total over the run
(``/proc/stat``). Run it with nothing else on the machine:
everything on it counts.

    python benchmarks/suite_processes.py                 # the whole suite, as CI runs it
    python benchmarks/suite_processes.py -- -m "not slow"   # pytest's arguments after --
    python benchmarks/suite_processes.py --quick         # smoke: two small test modules

Writes ``benchmarks/results/suite_processes.json`` (``.quick.json`` for ``--quick``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections import Counter

from common import ROOT, ProcessSampler, machine_cpu_seconds, report

QUICK_ARGS = ("-n", "0", "tests/test_config.py", "tests/test_layout.py")

#: (kind, pattern of the command line), first match wins
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("pytest (workers: in-process tests)", r"-m pytest|exec\(eval\(sys\.stdin"),
        ("Ray ClientApp actors", r"^ray::ClientAppActor"),
        ("Ray runtime", r"^ray::|/ray/|ray/core/src"),
        ("flwr-simulation", r"flwr-simulation"),
        ("flwr-serverapp", r"flwr-serverapp"),
        ("SuperLink", r"flower-superlink|fedorasflwr\.launch\.superlink"),
        ("SuperNode", r"flower-supernode|fedorasflwr\.launch\.supernode"),
        (
            "ClientApp executors",
            r"fedorasflwr\.launch\.warm|fedorasflwr-clientapp-executor|flwr-clientapp",
        ),
        ("SuperExec", r"flower-superexec"),
        ("flwr command line", r"/flwr (run|ls|log|stop|supernode|federation)\b|\bflwr (run|ls)\b"),
        ("benchmarks' quick runs", r"benchmarks/\w+\.py"),
        ("launcher and compare", r"fedorasflwr\.(launch|compare)\b"),
        ("other Python processes", r"python"),
    )
)
OTHER = "rest of the machine"


def kind_of(command: str) -> str:
    """The kind of process a command line names (:data:`KINDS`, else :data:`OTHER`)."""
    for kind, pattern in KINDS:
        if pattern.search(command):
            return kind
    return OTHER


#: the benchmark's own process: its reading thread (the rest of it waits on pytest), so the
#: reader's own cost is a row of the table
SAMPLER = "this benchmark (its /proc reader)"


def by_kind(sampler: ProcessSampler) -> tuple[Counter[str], Counter[str]]:
    """CPU seconds and processes per kind (`kind_of`; the sampler's own process apart)."""
    cpu: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for reading, seconds in sampler.spent():
        kind = SAMPLER if reading.pid == sampler.me else kind_of(reading.command)
        cpu[kind] += seconds
        count[kind] += 1
    return cpu, count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke: two small test modules")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between reads")
    parser.add_argument("pytest_args", nargs="*", help="pytest's arguments (after --)")
    args = parser.parse_args(argv)
    pytest_args = list(QUICK_ARGS) if args.quick else args.pytest_args
    load = os.getloadavg()
    machine_before, started = machine_cpu_seconds(), time.monotonic()
    with ProcessSampler(args.interval) as sampler:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *pytest_args], cwd=ROOT
        )
    wall = time.monotonic() - started
    machine = machine_cpu_seconds() - machine_before
    cpu, count = by_kind(sampler)
    total = sum(cpu.values())
    rows = [
        {
            "kind": kind,
            "cpu_s": round(seconds, 1),
            "share": round(seconds / total, 4) if total else 0.0,
            "processes": count[kind],
        }
        for kind, seconds in cpu.most_common()
    ]
    print("\n| kind of process | CPU s | share | processes |\n| --- | ---: | ---: | ---: |")
    for row in rows:
        share = f"{100 * row['share']:.1f}%"
        print(f"| {row['kind']} | {row['cpu_s']:.1f} | {share} | {row['processes']} |")
    print(f"sampled {total:.1f} CPU-s of the machine's {machine:.1f} in {wall:.1f} s wall")
    workers = cpu["pytest (workers: in-process tests)"]
    report(
        "suite_processes",
        args.quick,
        {
            "pytest_exit_code": done.returncode,
            "wall_s": round(wall, 1),
            "machine_cpu_s": round(machine, 1),
            "covered": round(total / machine, 3) if machine else 0.0,
            "pytest_workers_share": round(workers / total, 3) if total else 0.0,
        },
        {
            "pytest_args": pytest_args,
            "interval_s": args.interval,
            "samples": sampler.samples,
            "load_before": load,
            "rows": rows,
        },
    )
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
