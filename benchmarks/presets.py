"""The README's preset table, measured: every quick preset run once by the launcher, as a user
runs it, one after the other, with what each final model scored and the wall time.

    python benchmarks/presets.py                   # every configs/quick-*.toml
    python benchmarks/presets.py --only fjord dpfnas
    python benchmarks/presets.py --quick           # CI smoke run: the cheapest preset, 2 rounds

Each run is ``python -m fedorasflwr.launch --run-config configs/quick-<method>.toml
--output-dir <tmp>`` on the simulation engine (the data partitions cached first, outside the
timed part, as the README's "seconds" assume); the rows are the method's cost points
(``fedorasflwr.methods.points_function``: the leaderboard's rows) read back from the run's own
``result.json``, with the load average sampled before and after each run. Results:
``benchmarks/results/presets.json``; the README's table quotes it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ROOT, report

from fedorasflwr.methods import points_function

#: preset name -> its method (the file configs/quick-<name>.toml)
PRESETS = ("fedoras", "fdnas", "cfdnas", "dpfnas", "decnas", "heterofl", "fjord", "fednas")


def run_preset(name: str, out: Path, extra: list[str]) -> dict[str, Any]:
    """One preset through the launcher; its points, wall time, exit code and load."""
    load_before = os.getloadavg()
    started = time.perf_counter()
    command = [
        sys.executable,
        "-m",
        "fedorasflwr.launch",
        "--run-config",
        str(ROOT / "configs" / f"quick-{name}.toml"),
        "--output-dir",
        str(out),
        *extra,
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=3600)
    seconds = time.perf_counter() - started
    row: dict[str, Any] = {
        "preset": name,
        "command": " ".join(command[1:]),
        "exit": done.returncode,
        "seconds": round(seconds, 1),
        "load-before": load_before,
        "load-after": os.getloadavg(),
    }
    results = sorted(out.glob("**/result.json"))
    if done.returncode != 0 or not results:
        row["failed"] = (done.stdout + done.stderr)[-2000:]
        return row
    document = json.loads(results[-1].read_text())
    method = document.get("method", name)
    row["method"] = method
    row["points"] = points_function(method)(document)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    parser.add_argument("--only", nargs="+", choices=PRESETS, help="these presets only")
    args = parser.parse_args(argv)
    names = ["decnas"] if args.quick else list(args.only or PRESETS)
    # the smoke run shortens the search; every real run is the preset as it is
    extra = ["--run-config", "decnas.max-iterations=1"] if args.quick else []
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            row = run_preset(name, Path(tmp) / name, extra)
            rows.append(row)
            state = "FAILED" if "failed" in row else "ok"
            print(f"{name}: {state}, {row['seconds']:.0f} s, load {row['load-before'][0]:.1f}")
            for point in row.get("points", []):
                accuracy = point["global_test_accuracy"]
                macs = point["macs"]
                print(
                    f"  {point['model']}: global test "
                    f"{'-' if accuracy is None else f'{accuracy:.3f}'}, "
                    f"{'-' if macs is None else f'{macs / 1e6:.3f}'} MMACs"
                    + (f", epsilon {point['epsilon']}" if point["epsilon"] is not None else "")
                )
    failed = [r["preset"] for r in rows if "failed" in r]
    summary = {
        "presets": len(rows),
        "failed": len(failed),
        "seconds": round(sum(r["seconds"] for r in rows), 1),
    }
    name = "presets" if not args.only else "presets." + "-".join(args.only)
    report(name, args.quick, summary, {"rows": rows})
    if failed:
        print(f"presets.py: {', '.join(failed)} failed (their output is in the result file)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
