"""FedorAS per tier against rand-init on the offline text task, with the paper's RNN recipe.

The paper's Shakespeare result (Table 6) on the data this machine has: ``pydoc-topics``
(79 Python documentation topics, character level, 98 symbols), natural partition (each
client holds whole topics, so clients differ in what they write about), the ``rnn``
supernet, the paper's recipe for it (Tables 9-11): SGD at lr 1.0 without momentum in every
stage, gradient clipping at norm 5 (``fedoras.grad-clip = "auto"``), fine-tuning and
rand-init on the step schedule (10x down at 50% and 75% of the rounds), rand-init at Stage
1's lr for as many rounds as Stage 1.  Every case is a whole FedorAS run on the in-process
grid (``fedoras_tiers.run_case``: real ClientApp and strategy, no engine), one per seed,
two at a time in fresh processes with one torch thread each.

Metric: test perplexity per tier (exp of the mean next-character cross-entropy on the
pooled test windows of the clients able to run the tier's model; lower is better) of the
tier's searched architecture fine-tuned from the supernet (FedorAS) and trained from a
random initialisation (rand-init); gain = rand-init's perplexity - FedorAS's.  Prints a
Markdown table and ``headline: ...``; writes ``benchmarks/results/fedoras_text.json``.

    python benchmarks/fedoras_text.py                 # seeds 0 1 2 (numbers: benchmarks/README.md)
    python benchmarks/fedoras_text.py --seeds 0       # one seed
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import report, run_config
from fedoras_tiers import cell, mean, run_cases

CLIENTS = 20


def settings(quick: bool) -> dict[str, Any]:
    """The run config of every case (on top of ``pyproject.toml``'s defaults)."""
    recipe: dict[str, Any] = {
        "data.dataset": "pydoc-topics",
        "data.partitioner": "natural",
        "data.seq-len": 32,
        "space.name": "rnn",
        "fedoras.num-tiers": 4,
        "fedoras.tier-proportions": "",
        "fedoras.eval-every": 0,
        "fedoras.lr": 1.0,  # Table 9: 1.0, fixed, no momentum
        "fedoras.momentum": 0.0,
        "fedoras.grad-clip": "auto",  # 5 for the rnn space (Tables 9-11)
        "fedoras.finetune-lr": 1.0,  # Table 10: 1.0, step schedule, no momentum
        "fedoras.finetune-lr-schedule": "step",
        "fedoras.finetune-momentum": 0.0,
        "fedoras.compare-rand-init": True,
        "fedoras.rand-init-lr": 1.0,  # Sec. 4.3: Stage 1's lr
        "fedoras.batch-size": 16,
        "fedoras.finetune-batch-size": 16,
    }
    if quick:
        return {
            **recipe,
            "space.width": 0.125,
            "fedoras.num-tiers": 2,
            "fedoras.rounds": 2,
            "fedoras.clients-per-round": 4,
            "fedoras.local-epochs": 1,
            "fedoras.tier-samples": 500,
            "fedoras.search-population": 4,
            "fedoras.search-offspring": 2,
            "fedoras.search-evaluations": 6,
            "fedoras.finetune-rounds": 2,
            "fedoras.finetune-clients-per-round": 2,
            "fedoras.rand-init-rounds": 2,
        }
    # As in fedoras_tiers.py: a Stage-1 round trains more per client than a fine-tuning
    # round (the paper: 5 local epochs against 1), rand-init gets as many rounds as Stage 1
    # (paper: 500 and 500) and fine-tuning as many as rand-init, so that the two differ
    # only in their initialisation.
    return {
        **recipe,
        "space.width": 0.5,
        "fedoras.rounds": 20,
        "fedoras.clients-per-round": 8,
        "fedoras.local-epochs": 2,
        "fedoras.search-population": 16,
        "fedoras.search-offspring": 8,
        "fedoras.search-evaluations": 48,
        "fedoras.finetune-rounds": 20,
        "fedoras.finetune-clients-per-round": 6,
        "fedoras.finetune-local-epochs": 1,
        "fedoras.rand-init-rounds": 20,
    }


def per_tier(run: dict[str, Any], init: str, key: str, num_tiers: int) -> list[float | None]:
    """Per tier (1-based order), the ``init`` model's test ``key`` (perplexity, accuracy)."""
    by_tier = {m["tier"]: m for m in run["models"] if m["init"] == init and m["test"]}
    return [by_tier[t]["test"][key] if t in by_tier else None for t in range(1, num_tiers + 1)]


def gains(runs: list[dict[str, Any]], num_tiers: int) -> list[list[float | None]]:
    """Per run and tier, rand-init's perplexity minus FedorAS's (> 0: FedorAS better)."""
    out = []
    for run in runs:
        fedoras = per_tier(run, "supernet", "perplexity", num_tiers)
        rand = per_tier(run, "random", "perplexity", num_tiers)
        out.append(
            [None if f is None or r is None else r - f for f, r in zip(fedoras, rand, strict=True)]
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run (8 clients, seconds)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="runs at once, each in a fresh process (default 2); 0: one after the other here",
    )
    args = parser.parse_args(argv)
    clients = 8 if args.quick else CLIENTS
    started = time.perf_counter()
    measured = settings(args.quick)
    with tempfile.TemporaryDirectory() as tmp:
        base = run_config({**measured, "data.cache-dir": str(Path(tmp) / "cache")})
        configs = [{**base, "seed": seed} for seed in args.seeds]
        outcomes = run_cases(configs, clients, Path(tmp), args.jobs)
    runs = [{"seed": seed, **o} for seed, o in zip(args.seeds, outcomes, strict=True)]

    num_tiers = base["fedoras.num-tiers"]
    per_run = gains(runs, num_tiers)
    tiers = " | ".join(f"T{t}" for t in range(1, num_tiers + 1))
    print(
        f"FedorAS on pydoc-topics (natural partition, {clients} clients, rnn width "
        f"{base['space.width']}, {num_tiers} tiers): test perplexity per tier (lower is better)\n"
    )
    print(f"| seed | model | {tiers} | mean |")
    print("| --- | --- | " + "--- | " * num_tiers + "--- |")
    for run, gain in zip(runs, per_run, strict=True):
        for label, init, key, digits in (
            ("FedorAS", "supernet", "perplexity", 3),
            ("rand-init, same architecture", "random", "perplexity", 3),
            ("FedorAS, next-character accuracy", "supernet", "accuracy", 4),
            ("rand-init, next-character accuracy", "random", "accuracy", 4),
        ):
            values = per_tier(run, init, key, num_tiers)
            cells = " | ".join(cell(v, digits) for v in values)
            print(f"| {run['seed']} | {label} | {cells} | {cell(mean(values), digits)} |")
        cells = " | ".join(cell(v, 3) for v in gain)
        print(f"| {run['seed']} | gain: rand-init - FedorAS | {cells} | {cell(mean(gain), 3)} |")
    mean_gain = [mean(list(tier)) for tier in zip(*per_run, strict=True)]
    cells = " | ".join(f"**{cell(v, 3)}**" for v in mean_gain)
    print(f"| mean | gain: rand-init - FedorAS | {cells} | **{cell(mean(mean_gain), 3)}** |\n")

    present = [g for gain in per_run for g in gain if g is not None]
    summary: dict[str, Any] = {
        "seeds": "-".join(map(str, args.seeds)),
        "mean_gain_ppl": statistics.fmean(present) if present else float("nan"),
        "min_tier_gain_ppl": min(g for g in mean_gain if g is not None)
        if present
        else float("nan"),
        "cells_fedoras_better": f"{sum(g > 0 for g in present)}/{len(present)}",
        "clients": clients,
        "seconds": round(time.perf_counter() - started, 1),
    }
    report(
        "fedoras_text",
        args.quick,
        summary,
        {"clients": clients, "settings": measured, "runs": runs},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
