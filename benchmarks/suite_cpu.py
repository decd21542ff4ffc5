"""Where the test suite's CPU goes: every test's machine CPU seconds, on one worker.

Runs ``python -m pytest -n 0`` (one test at a time) with ``$FEDORASFLWR_SUITE_CPU_LOG``
set: ``tests/conftest.py`` then logs, per test, the CPU seconds of the whole machine
(user + nice + system over all cores, ``/proc/stat``) from its setup to its teardown, and
its wall seconds. Machine-wide, because an engine test's work is in other processes (the
SuperLink, SuperNodes, Ray's client workers, which run at nice 15) that pytest does not
wait on; so run it with nothing else on the machine. Prints per module and per test, with
each one's share, and the **floor** the CPU alone puts under the suite on this machine's
cores (total CPU seconds / cores: what ``-n auto`` could reach with perfect packing and no
waiting).

    python benchmarks/suite_cpu.py                  # the whole suite (about 25 min here)
    python benchmarks/suite_cpu.py tests/engines    # only these tests (pytest's paths / ids)
    python benchmarks/suite_cpu.py --from LOG.jsonl # summarise a log of an earlier run
    python benchmarks/suite_cpu.py --quick          # smoke: two small test modules

A log of another checkout (e.g. before a change) comes from its own ``tests/conftest.py``:
``FEDORASFLWR_SUITE_CPU_LOG=LOG python -m pytest -q -n 0 -p no:cacheprovider PATHS`` there,
then ``--from LOG`` here.

The run's own last line (``tests/conftest.py``, printed by every pytest run, CI's too) gives
the machine's CPU over the whole session, setup and collection included, and how busy it kept
the cores; it is saved as ``session``.

Writes ``benchmarks/results/suite_cpu.json`` (``.quick.json`` for ``--quick``); a run of
chosen tests writes ``suite_cpu.selected.json`` unless ``--save-as NAME`` names another
``results/NAME.json`` (the whole suite's record is not overwritten by a part of it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common import ROOT, report

LOG_ENV = "FEDORASFLWR_SUITE_CPU_LOG"  # tests/conftest.py: SUITE_CPU_LOG_ENV
QUICK_TESTS = ("tests/test_config.py", "tests/test_layout.py")
TOP = 20


#: the line tests/conftest.py's ``pytest_terminal_summary`` ends every run with
SESSION_LINE = re.compile(
    r"machine CPU during the suite: (?P<cpu>[\d.]+) CPU-s in (?P<wall>[\d.]+) s wall "
    r"on (?P<cores>\d+) cores"
)


def session_totals(output: str) -> dict[str, float] | None:
    """The machine's CPU seconds, wall seconds and busy share over a pytest session, from
    its last line (None: not printed)."""
    matches = list(SESSION_LINE.finditer(output))
    if not matches:
        return None
    found = matches[-1]
    cpu, wall, cores = float(found["cpu"]), float(found["wall"]), int(found["cores"])
    return {"cpu_seconds": cpu, "wall_seconds": wall, "busy": round(cpu / (wall * cores), 3)}


def run_suite(log: Path, tests: list[str]) -> tuple[int, float, dict[str, float] | None]:
    """``pytest -n 0`` on ``tests`` (all: none given), logging to ``log``; its exit code,
    wall seconds and session totals (:func:`session_totals`). Its output is echoed as it
    comes."""
    started = time.monotonic()
    with subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *tests],
        cwd=ROOT,
        env=dict(os.environ, **{LOG_ENV: str(log)}),
        stdout=subprocess.PIPE,
        text=True,
    ) as pytest_run:
        assert pytest_run.stdout is not None
        lines = []
        for line in pytest_run.stdout:
            print(line, end="", flush=True)
            lines.append(line)
    output = "".join(lines)
    return pytest_run.returncode, time.monotonic() - started, session_totals(output)


def summarise(records: list[dict[str, Any]], cores: int) -> dict[str, Any]:
    """Totals, per module and the top tests by CPU, each with its share of the total."""
    total = sum(r["cpu"] for r in records)
    modules: Counter[str] = Counter()
    for r in records:
        modules[r["id"].split("::")[0]] += r["cpu"]

    def share(cpu: float) -> float:
        return round(cpu / total, 4) if total else 0.0

    return {
        "tests": len(records),
        "cpu_seconds": round(total, 1),
        "wall_seconds": round(sum(r["wall"] for r in records), 1),
        "cores": cores,
        "floor_seconds": round(total / cores, 1),
        "modules": [
            {"module": m, "cpu": round(c, 1), "share": share(c)} for m, c in modules.most_common()
        ],
        "top_tests": [
            {**r, "share": share(r["cpu"])}
            for r in sorted(records, key=lambda r: r["cpu"], reverse=True)[:TOP]
        ],
    }


def table(summary: dict[str, Any]) -> str:
    lines = ["| module | CPU s | share |", "|---|---:|---:|"]
    lines += [
        f"| {m['module']} | {m['cpu']:.1f} | {100 * m['share']:.1f}% |"
        for m in summary["modules"][:TOP]
    ]
    lines += ["", "| test | CPU s | wall s | share |", "|---|---:|---:|---:|"]
    lines += [
        f"| {t['id']} | {t['cpu']:.1f} | {t['wall']:.1f} | {100 * t['share']:.1f}% |"
        for t in summary["top_tests"]
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke: two small test modules")
    parser.add_argument("--from", dest="source", type=Path, help="summarise this log instead")
    parser.add_argument("tests", nargs="*", help="test paths or ids (default: the whole suite)")
    parser.add_argument(
        "--save-as",
        metavar="NAME",
        help="write results/NAME.json (default: suite_cpu; suite_cpu.selected for chosen tests)",
    )
    args = parser.parse_args(argv)
    if args.source is not None and (args.tests or args.quick):
        parser.error("--from summarises a log: give no test paths and no --quick with it")
    cores = os.cpu_count() or 1
    exit_code, wall, load, session = None, None, None, None  # of a run made here (not --from)
    with tempfile.TemporaryDirectory() as tmp:
        log = args.source
        if log is None:
            log, load = Path(tmp) / "suite-cpu.jsonl", os.getloadavg()[0]
            tests = list(QUICK_TESTS) if args.quick else args.tests
            exit_code, wall, session = run_suite(log, tests)
        records = [json.loads(line) for line in log.read_text().splitlines() if line]
    summary = summarise(records, cores)
    print(table(summary))
    headline = {
        "tests": summary["tests"],
        "cpu_s": summary["cpu_seconds"],
        "wall_s": summary["wall_seconds"],
        "floor_s": summary["floor_seconds"],
        "cores": cores,
        "top_module_share": summary["modules"][0]["share"] if summary["modules"] else 0.0,
    }
    name = args.save_as or ("suite_cpu.selected" if args.tests else "suite_cpu")
    report(
        name,
        args.quick,
        headline,
        {
            **summary,
            "selected": args.tests,
            "pytest_exit_code": exit_code,
            "pytest_wall": wall,
            "load_before": load,
            "session": session,
        },
    )
    return 0 if exit_code in (None, 0) else 1


if __name__ == "__main__":
    raise SystemExit(main())
