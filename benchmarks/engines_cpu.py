"""Where a deployment round's CPU goes: the ``engines.py`` default config on the deployment
engine (3 SuperNodes, TLS and auth, warm executors) and on the simulation engine, with every
process's CPU seconds sampled from ``/proc`` once a second and summed by role.

``engines.py`` showed the deployment's training messages taking longer than the simulation
engine's for the same work (3 ClientApps trained at once on the 2 cores, where Ray runs 2 then
1). This says whether the difference is the trainers sharing the cores or other processes
using them: CPU seconds per role (the ClientApps that trained, SuperLink, SuperNodes, warm
executors, ServerApp, Ray, other), for the whole run and per training message. Since stop 48
the deployment runs at most ``cpu_count // threads`` ClientApps at once (``Deployment``'s
``clientapp_slots``, 2 here, as Ray); the recorded run (stop 37) predates that.

    python benchmarks/engines_cpu.py            # default config, 4 rounds on both engines
    python benchmarks/engines_cpu.py --quick    # tiny config, 2 rounds (CI smoke run)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from common import ProcessSampler, report, run_config, warm_data_cache
from engines import (
    nodes_of,
    read_timings,
    run_deployment,
    run_simulation_engine,
    settings,
    warm_cost_cache,
)


def role_of(cmdline: str, pid: int, trainers: set[int]) -> str:
    if pid in trainers:
        return "clientapp (training message)"
    for marker, role in (
        ("flower-superlink", "superlink"),
        ("fedorasflwr.launch.supernode", "supernode"),
        ("flower-supernode", "supernode"),
        ("fedorasflwr.launch.warm", "warm executor / other clientapp"),
        ("flwr-clientapp", "warm executor / other clientapp"),
        ("flwr-serverapp", "serverapp"),
        ("flwr-simulation", "serverapp (simulation: with the engine)"),
        ("flower-superexec", "superexec"),
        ("ray::", "ray"),
        ("raylet", "ray"),
        ("gcs_server", "ray"),
        ("/ray/", "ray"),
        ("flwr run", "flwr run"),
        ("flwr ", "flwr run"),
    ):
        if marker in cmdline:
            return role
    return "other"


class CpuSampler(ProcessSampler):
    """`common.ProcessSampler` (every process on the machine, read every ``interval``
    seconds) with its CPU seconds summed by `role_of`."""

    def by_role(self, trainers: set[int]) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for reading, used in self.spent():
            if reading.pid == self.me:
                role = "benchmark process"
            else:
                role = role_of(reading.command, reading.pid, trainers)
            totals[role] += used
        return {k: round(v, 2) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}

    def others(self, trainers: set[int], top: int = 8) -> list[tuple[float, str]]:
        """The ``top`` processes of role "other" by CPU seconds, with their command lines."""
        rows = [
            (round(used, 2), reading.command[:160])
            for reading, used in self.spent()
            if reading.pid != self.me and role_of(reading.command, reading.pid, trainers) == "other"
        ]
        return sorted(rows, reverse=True)[:top]


def measure(engine: str, overrides: dict[str, Any], tmp: Path) -> dict[str, Any]:
    timing = tmp / f"{engine}.jsonl"
    runner = run_deployment if engine == "deployment" else run_simulation_engine
    started = time.perf_counter()
    with CpuSampler() as sampler:
        wall = runner({**overrides, "output-dir": str(tmp / engine)}, timing)
    elapsed = time.perf_counter() - started
    records = read_timings(timing)
    training = [r for r in records if r["message-type"].startswith("train.")]
    trainers = {int(r["pid"]) for r in training}
    roles = sampler.by_role(trainers)
    spans = [r["reply-built"] - r["data-loaded"] for r in training]
    return {
        "wall-s": round(wall, 2),
        "elapsed-s": round(elapsed, 2),
        "cpu-s-by-role": roles,
        "cpu-s-total": round(sum(roles.values()), 2),
        "other-processes": sampler.others(trainers),
        "training-messages": len(training),
        "training-span-s-mean": round(sum(spans) / max(len(spans), 1), 3),
        "cores-busy-mean": round(sum(roles.values()) / elapsed, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny config, 2 rounds")
    parser.add_argument("--engines", default="simulation,deployment", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    config = "tiny" if args.quick else "default"
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="engines-cpu-") as tmp:
        root = Path(tmp)
        overrides = settings(config, args.quick, root / "out", root / "cache")
        if args.quick:
            overrides["fedoras.rounds"] = 2
        warm_data_cache([run_config(overrides)], nodes_of(overrides))
        warm_cost_cache(run_config(overrides))
        for engine in args.engines.split(","):
            print(f"[{config}] {engine} ...", flush=True)
            results[engine] = measure(engine, overrides, root)
    roles = sorted({r for m in results.values() for r in m["cpu-s-by-role"]})
    print("| role | " + " | ".join(results) + " |")
    print("| --- |" + " --- |" * len(results))
    for role in roles:
        print(
            f"| {role} | "
            + " | ".join(str(m["cpu-s-by-role"].get(role, 0)) for m in results.values())
            + " |"
        )
    for key in (
        "cpu-s-total",
        "elapsed-s",
        "cores-busy-mean",
        "training-messages",
        "training-span-s-mean",
    ):
        print(f"| {key} | " + " | ".join(str(m[key]) for m in results.values()) + " |")
    for engine, m in results.items():
        for used, cmdline in m["other-processes"]:
            print(f"{engine} other: {used} s {cmdline}")
    if set(results) != {"simulation", "deployment"}:
        return 0
    sim, dep = results["simulation"], results["deployment"]
    summary = {
        "config": config,
        "deployment_cpu_over_simulation": round(dep["cpu-s-total"] / sim["cpu-s-total"], 3),
        "deployment_training_cpu_s": dep["cpu-s-by-role"].get("clientapp (training message)"),
        "simulation_ray_cpu_s": sim["cpu-s-by-role"].get("ray"),
        "deployment_training_span_s": dep["training-span-s-mean"],
        "simulation_training_span_s": sim["training-span-s-mean"],
    }
    report("engines_cpu", args.quick, summary, {"settings": overrides, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
