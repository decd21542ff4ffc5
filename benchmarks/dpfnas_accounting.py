"""DP-FNAS privacy accounting per iteration, uncached (before) and composed (after).

The search accounts every party after every iteration (and, with a privacy target, once
more for the next iteration).  Before: each party's two epsilons were recomputed from
scratch by a fresh opacus accountant (``PartyPrivacy.compute``, in pure Python); after:
``privacy.Accountant`` composes each (noise, rate, steps) history from the RDP of one
step, cached per (noise, rate), and remembers every epsilon.

Two measurements, same seed, in-process grid (the real ClientApp):

1. **a real search**: parties of MNIST-5k, the ``darts`` space, a privacy
   target (so the look-ahead runs too); 10 parties, 4 iterations (quick: 4, 2); the same
   search twice, once with the accounting
   of before (a ``DPFNAS`` whose ``privacy`` is the old uncached loop), once as it is.
   Reported: the seconds of one iteration and of its accounting, and their ratio;
2. **the accounting alone at scale**: 50 parties (quick: 20) with distinct split sizes
   (distinct rates, no two parties share a history: the cache's worst case) over 5
   iterations (quick: 3), before and after; checked equal.

    python benchmarks/dpfnas_accounting.py            # numbers: benchmarks/README.md
    python benchmarks/dpfnas_accounting.py --quick    # smoke run (< 1 minute)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from common import ROOT, report, run_config, warm_data_cache

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DELTA = 1e-5


def search_config(quick: bool, cache_dir: Path) -> dict[str, Any]:
    return run_config(
        {
            "method": "dpfnas",
            "seed": 0,
            "data.cache-dir": str(cache_dir),
            "data.partitioner": "iid",
            "space.name": "darts",
            "space.width": 0.25,
            "space.layers-per-block": 1,
            "dpfnas.iterations": 2 if quick else 4,
            "dpfnas.batch-size": 8,
            "dpfnas.eval-every": 0,
            "dpfnas.delta": DELTA,
            "dpfnas.target-epsilon": 1000.0,  # never reached; the look-ahead runs
            "dpfnas.final-rounds": 0,
            "dpfnas.min-replies": 1,
            "min-nodes": 1,
        }
    )


def uncached_privacy(strategy, extra_steps: int = 0):
    """The accounting of before: every party, both mechanisms, a fresh opacus accountant."""
    from fedorasflwr.methods.dpfnas.privacy import PartyPrivacy

    report = []
    for party in strategy.parties:
        rate_train, rate_val = strategy.sample_rates(party)
        steps = strategy.steps[party.partition_id]
        report.append(
            PartyPrivacy.compute(
                party.partition_id,
                sigma=strategy.sigma,
                tau=strategy.tau,
                rate_train=rate_train,
                rate_val=rate_val,
                steps_weights=steps["weights"] + extra_steps,
                steps_arch=steps["arch"] + extra_steps,
                delta=strategy.settings.delta,
                accountant=strategy.settings.accountant,
            )
        )
    return report


def search(config: dict[str, Any], parties: int, cached: bool) -> dict[str, Any]:
    """One search; the seconds of its iterations and of their accounting."""
    from flwr.app import ArrayRecord

    from fedorasflwr.client_app import app as client_app
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.inprocess import InProcessGrid
    from fedorasflwr.methods.dpfnas.strategy import DPFNAS
    from fedorasflwr.runs import build_supernet

    settings = parse_run_config(config)
    spent: dict[int, float] = {}  # iteration -> seconds of its look-ahead and its report

    class Timed(DPFNAS):
        def privacy(self, extra_steps: int = 0):
            started = time.perf_counter()
            iteration = len(self.train_metrics) + extra_steps
            try:
                if cached:
                    return super().privacy(extra_steps)
                return uncached_privacy(self, extra_steps)
            finally:
                spent[iteration] = spent.get(iteration, 0.0) + time.perf_counter() - started

    strategy = Timed(
        space=build_supernet(settings), settings=settings.method_settings, seed=settings.seed
    )
    grid = InProcessGrid(client_app, config, parties)
    result = strategy.start(grid, ArrayRecord(), settings.method_settings.iterations)
    # the accounting of the search loop only (the result's report is one more call)
    iterations = [h["seconds"] for h in result.history if h.get("iteration", 0) > 0]
    per_iteration = [spent.get(i, 0.0) for i in range(1, len(iterations) + 1)]
    iteration_s = sum(iterations) / len(iterations)
    later = per_iteration[1:]
    return {
        "iteration-s": iteration_s,
        "accounting-s": per_iteration,
        # the first iteration also computes each (noise, rate)'s one-step RDP, once per run
        "first-share": per_iteration[0] / iteration_s,
        "later-share": sum(later) / len(later) / iteration_s,
        "epsilon": max(p.epsilon for p in result.privacy),
        "iterations": len(iterations),
    }


def accounting_alone(parties: int, iterations: int) -> dict[str, Any]:
    """Before and after on ``parties`` distinct histories over ``iterations`` iterations."""
    from fedorasflwr.methods.dpfnas.privacy import Accountant, PartyPrivacy, add_steps

    rates = [(8 / (400 + 3 * k), 8 / (45 + k)) for k in range(parties)]
    started = time.perf_counter()
    before = []
    for t in range(1, iterations + 1):
        before = [
            PartyPrivacy.compute(
                k,
                sigma=1.0,
                tau=1.0,
                rate_train=rt,
                rate_val=rv,
                steps_weights=t,
                steps_arch=t,
                delta=DELTA,
                accountant="rdp",
            )
            for k, (rt, rv) in enumerate(rates)
        ]
    seconds_before = time.perf_counter() - started
    account = Accountant("rdp", DELTA)
    histories = {k: ([], []) for k in range(parties)}
    after = []
    seconds_after = []
    for _ in range(iterations):
        started = time.perf_counter()
        after = []
        for k, (rt, rv) in enumerate(rates):
            w, a = histories[k]
            histories[k] = (add_steps(w, 1.0, rt), add_steps(a, 1.0, rv))
            after.append(
                PartyPrivacy.of(
                    k,
                    weights=histories[k][0],
                    arch=histories[k][1],
                    account=account,
                    current=(1.0, 1.0, rt, rv),
                )
            )
        seconds_after.append(time.perf_counter() - started)
    equal = all(
        b.weights.epsilon == a.weights.epsilon and b.architecture.epsilon == a.architecture.epsilon
        for b, a in zip(before, after, strict=True)
    )
    return {
        "parties": parties,
        "iterations": iterations,
        "before-s-per-iteration": seconds_before / iterations,
        "after-s-first-iteration": seconds_after[0],
        "after-s-later-iterations": sum(seconds_after[1:]) / (iterations - 1),
        "equal": equal,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (< 1 minute)")
    args = parser.parse_args()
    quick = args.quick
    warnings.filterwarnings("ignore", message="Optimal order")
    parties = 4 if quick else 10
    with tempfile.TemporaryDirectory() as tmp:
        config = search_config(quick, Path(tmp) / "cache")
        warm_data_cache([config], parties)
        runs = {
            "before": search(config, parties, cached=False),
            "after": search(config, parties, cached=True),
        }
    for name, row in runs.items():
        print(
            f"{name}: {row['iteration-s']:.3f} s per iteration; accounting "
            + ", ".join(f"{s:.4f}" for s in row["accounting-s"])
            + f" s in iterations 1..{row['iterations']}: first {100 * row['first-share']:.2f}%,"
            f" later {100 * row['later-share']:.3f}% of an iteration"
        )
    scale = accounting_alone(20 if quick else 50, 3 if quick else 5)
    print(
        f"{scale['parties']} parties, distinct rates: {scale['before-s-per-iteration']:.3f} s "
        f"of accounting per iteration before, after {scale['after-s-first-iteration']:.3f} s "
        f"in the first and {scale['after-s-later-iterations']:.5f} s in each later one "
        f"(equal: {scale['equal']})"
    )
    summary = {
        "parties": parties,
        "iteration_s_before": round(runs["before"]["iteration-s"], 3),
        "iteration_s_after": round(runs["after"]["iteration-s"], 3),
        "share_before": round(runs["before"]["later-share"], 4),
        "share_after_first": round(runs["after"]["first-share"], 4),
        "share_after": round(runs["after"]["later-share"], 5),
        "same_epsilon": runs["before"]["epsilon"] == runs["after"]["epsilon"],
        "scale_parties": scale["parties"],
        "scale_before_s": round(scale["before-s-per-iteration"], 3),
        "scale_after_first_s": round(scale["after-s-first-iteration"], 3),
        "scale_after_s": round(scale["after-s-later-iterations"], 5),
        "scale_equal": scale["equal"],
    }
    report("dpfnas_accounting", quick, summary, {"search": runs, "scale": scale})
    if not (summary["same_epsilon"] and summary["scale_equal"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
