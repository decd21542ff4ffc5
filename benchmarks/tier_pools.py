"""Which classes each tier's fine-tuning clients hold, beside what each method scored there.

FedorAS fine-tunes a tier's model on that tier's clients and the tiers above (the paper's
rule: only they can run it), so the top tier's model sees a quarter of the clients. At
Dirichlet alpha 0.1 a client holds one or two classes, and ten clients can leave a class
nearly absent. The width baselines do not have this limit: a client of any tier trains the
channels every tier shares, and the classifier. This reads the cases of a
``baselines.py`` result file, rebuilds each case's data split (the same seed, alpha and
clients, so the same partitions), and prints per tier: the pool's clients and samples, its
rarest classes, the share of the global test set in *thin* classes (under ``--thin`` of
the pool's samples, default 1%), and FedorAS's, its rand-init's (``--rand-init`` files)
and the baselines' global-test accuracy. Only data is loaded: nothing trains (a few
seconds a case).

    python benchmarks/tier_pools.py                                    # results/baselines.json
    python benchmarks/tier_pools.py --cases-from benchmarks/results/baselines.rand-init.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from baselines import (
    BASELINES,
    baseline_accuracy,
    fedoras_accuracy,
    rand_init_accuracy,
    settings,
)
from common import RESULTS, report, run_config

THIN = 0.01
"""A class is thin in a pool when it is under this share of the pool's training samples."""


def pool_counts(
    label_counts: dict[int, list[int]], tier_of: dict[int, int], tier: int
) -> tuple[list[int], int]:
    """Summed training label counts of the partitions of tier ``tier`` and above (those
    that fine-tune its model), and how many partitions that is."""
    members = [p for p, t in tier_of.items() if t >= tier]
    if not members:
        raise ValueError(f"tier {tier}: no partition of this tier or above")
    width = len(label_counts[members[0]])
    return [sum(label_counts[p][c] for p in members) for c in range(width)], len(members)


def thin_classes(counts: list[int], thin: float) -> list[int]:
    """The classes under ``thin`` of the pool's samples."""
    total = sum(counts)
    return [c for c, n in enumerate(counts) if n < thin * total]


def test_share(test_counts: list[int], classes: list[int]) -> float:
    """The share of the global test set whose label is one of ``classes``."""
    return sum(test_counts[c] for c in classes) / sum(test_counts)


def case_counts(
    case: dict[str, Any], clients: int, cache: Path, recorded: dict[str, Any] | None = None
) -> tuple[dict[int, list[int]], list[int]]:
    """Every partition's training label counts and the global test set's, rebuilt for
    ``case`` with ``baselines.py``'s settings and the ``data.*`` keys of ``recorded`` (the
    result file's settings: the split it was measured on)."""
    import torch

    from fedorasflwr.config import parse_run_config
    from fedorasflwr.data import load_client_data, load_global_test

    config = run_config(
        {
            **settings(False),
            # the file's own data keys (its split), where it records them
            **{k: v for k, v in (recorded or {}).items() if k.startswith("data.")},
            "seed": case["seed"],
            "data.alpha": case["alpha"],
            "data.cache-dir": str(cache),
        }
    )
    spec = parse_run_config(config).data
    counts = {p: list(load_client_data(spec, p, clients).label_counts) for p in range(clients)}
    labels = load_global_test(spec).tensors[1].reshape(-1)
    width = len(counts[0])
    return counts, torch.bincount(labels, minlength=width).tolist()


def rows_of(
    case: dict[str, Any], counts: dict[int, list[int]], test: list[int], thin: float
) -> list[dict[str, Any]]:
    """One row per tier of ``case``."""
    tier_of = {int(p): int(t) for p, t in case["tier-of-partition"].items()}
    rows = []
    for tier in sorted(set(tier_of.values())):
        pool, members = pool_counts(counts, tier_of, tier)
        thins = thin_classes(pool, thin)
        rows.append(
            {
                "seed": case["seed"],
                "alpha": case["alpha"],
                "tier": tier,
                "clients": members,
                "samples": sum(pool),
                "rarest": sorted(range(len(pool)), key=lambda c: pool[c])[:2],
                "rarest_counts": sorted(pool)[:2],
                "thin_classes": thins,
                "thin_test_share": test_share(test, thins),
                "fedoras": fedoras_accuracy(case, tier),
                "rand_init": rand_init_accuracy(case, tier),
                **{method: baseline_accuracy(case, method, tier) for method in BASELINES},
            }
        )
    return rows


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases-from", type=Path, default=RESULTS / "baselines.json", help="a baselines.py file"
    )
    parser.add_argument("--thin", type=float, default=THIN, help="thin-class share (0.01)")
    args = parser.parse_args(argv)
    if not 0 < args.thin < 1:
        raise SystemExit(f"--thin {args.thin}: must be between 0 and 1")
    document = json.loads(args.cases_from.read_text())
    clients = int(document["clients"])
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in document["cases"]:
            counts, test = case_counts(case, clients, Path(tmp) / "cache", document.get("settings"))
            rows.extend(rows_of(case, counts, test, args.thin))
    print(
        f"\n{args.cases_from.name}: each tier's fine-tuning pool (its clients and those of "
        f"the tiers above); thin: under {args.thin:.0%} of the pool's samples\n"
    )
    print(
        "| alpha | seed | tier | clients | samples | rarest classes (samples) "
        "| thin classes' test share | FedorAS | rand-init | HeteroFL | FjORD |"
    )
    print("| --- " * 11 + "|")
    for r in rows:
        rarest = ", ".join(
            f"{c} ({n})" for c, n in zip(r["rarest"], r["rarest_counts"], strict=True)
        )
        print(
            f"| {r['alpha']} | {r['seed']} | T{r['tier']} | {r['clients']} | {r['samples']} "
            f"| {rarest} | {r['thin_test_share']:.3f} | {_cell(r['fedoras'])} "
            f"| {_cell(r['rand_init'])} | {_cell(r['heterofl'])} | {_cell(r['fjord'])} |"
        )
    summary: dict[str, Any] = {}
    for alpha in sorted({r["alpha"] for r in rows}):
        for thin_pool in (True, False):
            group = [
                r for r in rows if r["alpha"] == alpha and bool(r["thin_classes"]) == thin_pool
            ]
            key = f"alpha_{alpha}_{'thin' if thin_pool else 'full'}"
            summary[f"{key}_tiers"] = len(group)
            for method in ("fedoras", "rand_init"):
                gaps = [100 * (r[method] - r["fjord"]) for r in group if r[method] is not None]
                if gaps or method == "fedoras":
                    value = round(statistics.fmean(gaps), 2) if gaps else None
                    summary[f"{key}_{method}_minus_fjord_pp"] = value
    for method, label in (("fedoras", "FedorAS"), ("rand_init", "rand-init")):
        if not any(r[method] is not None for r in rows):
            continue
        print(
            f"\n{label} - FjORD (pp), mean over the tiers whose pool has a thin class / has none: "
            + "; ".join(
                f"alpha {alpha}: "
                + " / ".join(
                    "-"
                    if summary.get(f"alpha_{alpha}_{k}_{method}_minus_fjord_pp") is None
                    else f"{summary[f'alpha_{alpha}_{k}_{method}_minus_fjord_pp']:+.1f} "
                    f"({summary[f'alpha_{alpha}_{k}_tiers']} tiers)"
                    for k in ("thin", "full")
                )
                for alpha in sorted({r["alpha"] for r in rows})
            )
        )
    name = "tier_pools." + args.cases_from.stem
    report(
        name, False, summary, {"cases-from": args.cases_from.name, "thin": args.thin, "rows": rows}
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
