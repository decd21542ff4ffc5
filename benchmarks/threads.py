"""The server's path scoring on a shared host: torch threads and OpenMP's wait policy.

A federated run shares its host: the ServerApp runs next to the engine's clients (the
simulation engine), several SuperNodes share one machine, other jobs run. torch's
intra-op pool is OpenMP (libgomp); by default its idle threads *spin* before they sleep,
so with as many threads as cores and one core busy elsewhere, every parallel region
waits for a thread whose core is taken. ``fedorasflwr/__init__.py`` therefore sets
``OMP_WAIT_POLICY=PASSIVE`` (idle threads sleep) before torch is first imported.

Measured here, side by side in one run: the Stage-1 supernet evaluation of the default
run config (``SupernetEvaluator``: 8 paths, BN recalibration on a fifth of the server's
held-out slice, then accuracy on the rest) in a fresh process per setting, for

- the wait policy: libgomp's default (unset), ``ACTIVE`` (spin), ``PASSIVE`` (sleep);
- torch threads: 1, and one per core;

while ``--competitors`` busy processes (default 1: one core taken by something else, as
the other pytest worker or a client is) run. Settings are interleaved over ``--rounds``
rounds, so that a change in the host's load hits each alike; each setting reports the
median of its rounds' seconds per evaluation.

    python benchmarks/threads.py            # 5 rounds, 3 evaluations each
    python benchmarks/threads.py --quick    # CI smoke: 1 round, unset vs PASSIVE, no busy process
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import report, run_config  # noqa: E402

POLICIES = ("default", "ACTIVE", "PASSIVE")


def worker(threads: int, evaluations: int) -> None:
    """One setting, in this fresh process: the seconds of each evaluation, as JSON."""
    import torch  # first: libgomp reads the environment the parent set (or left unset)

    torch.set_num_threads(threads)
    from flwr.app import ArrayRecord

    from fedorasflwr.config import parse_run_config
    from fedorasflwr.data import load_server_data
    from fedorasflwr.methods.fedoras.evaluation import SupernetEvaluator
    from fedorasflwr.runs import build_supernet

    settings = parse_run_config(run_config({}))
    evaluator = SupernetEvaluator(
        space=build_supernet(settings),
        dataset=load_server_data(settings.data),
        num_paths=settings.method_settings.eval_paths,
        seed=settings.seed,
    )
    arrays = ArrayRecord(build_supernet(settings).state_dict())
    evaluator(0, arrays)  # warm-up
    seconds = []
    for _ in range(evaluations):
        start = time.perf_counter()
        evaluator(1, arrays)
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"seconds": seconds, "threads": torch.get_num_threads()}))


def measure(policy: str, threads: int, evaluations: int) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    done = subprocess.run(
        [sys.executable, __file__, "--worker", str(threads), "--evaluations", str(evaluations)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=ROOT,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["threads"] == threads, result
    return statistics.median(result["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="one round, one evaluation")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--evaluations", type=int, default=3)
    parser.add_argument("--competitors", type=int, default=1, help="busy processes alongside")
    parser.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.evaluations)
        return
    rounds, evaluations = (1, 1) if args.quick else (args.rounds, args.evaluations)
    cores = os.cpu_count() or 1
    settings = [(p, t) for p in POLICIES for t in sorted({1, cores})]
    if args.quick:  # the comparison the default is about: one thread per core, unset or not
        settings = [("default", cores), ("PASSIVE", cores)]
    # the smoke run takes no core from the test suite running next to it
    competitors = 0 if args.quick else args.competitors
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(competitors)
    ]
    seconds: dict[tuple[str, int], list[float]] = {s: [] for s in settings}
    try:
        load = os.getloadavg()[0]
        for _ in range(rounds):
            for policy, threads in settings:
                seconds[(policy, threads)].append(measure(policy, threads, evaluations))
    finally:
        for process in busy:
            process.kill()
            process.wait()
    rows = [
        {
            "policy": policy,
            "threads": threads,
            "seconds": statistics.median(seconds[(policy, threads)]),
            "rounds": seconds[(policy, threads)],
        }
        for policy, threads in settings
    ]
    by = {(r["policy"], r["threads"]): r["seconds"] for r in rows}
    print(
        f"Supernet evaluation (8 paths), {competitors} busy process(es), {cores} cores, "
        f"load average {load:.2f} at start\n"
    )
    print("| OMP_WAIT_POLICY | torch threads | seconds per evaluation |")
    print("| --- | --- | --- |")
    for r in rows:
        print(f"| {r['policy']} | {r['threads']} | {r['seconds']:.3f} |")
    summary = {
        f"default_over_passive_{cores}_threads": by[("default", cores)] / by[("PASSIVE", cores)]
    }
    if not args.quick:
        summary[f"active_over_passive_{cores}_threads"] = (
            by[("ACTIVE", cores)] / by[("PASSIVE", cores)]
        )
        summary[f"passive_{cores}_over_1_thread"] = by[("PASSIVE", cores)] / by[("PASSIVE", 1)]
    report(
        "threads",
        args.quick,
        summary,
        {"cores": cores, "competitors": competitors, "load-average": load, "rows": rows},
    )


if __name__ == "__main__":
    main()
