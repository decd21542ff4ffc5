"""DP-FNAS privacy / accuracy trade-off on MNIST-5k (paper: Table 1 and Table 2).

One run, same seed, side by side (in-process grid: the real ClientApp, no engine):

- **single-party NAS** (one party holding every training and validation sample, no noise);
- **FNAS** (K = 2, 4, 8 IID parties, no noise) and **DP-FNAS** (same K, sigma^2 = tau^2 = 1);
- a **noise sweep** sigma^2 = tau^2 in {0.5, 1, 2, 5, 10} at K = 4.

Every row searches the ``darts`` space, derives the genotype (top-2 inputs per
node), trains the derived network from scratch with the same FedAvg schedule
over the row's parties, and reports its accuracy on the **server slice**
(500 held-out digits no party trains on and no search decision uses; the same
for every row) and on the parties' own test splits, with epsilon at
delta = 1e-5 (opacus RDP accountant, worst party, worst of the W and A
mechanisms) and the paper's mu-GDP for W and A.

    python benchmarks/dpfnas_privacy.py            # full run (see README for the numbers)
    python benchmarks/dpfnas_privacy.py --quick    # CI smoke run (< 2 minutes)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))

DELTA = 1e-5


def settings(quick: bool, cache_dir: Path) -> dict[str, Any]:
    return {
        "method": "dpfnas",
        "seed": 0,
        "data.cache-dir": str(cache_dir),
        "data.partitioner": "iid",
        "space.name": "darts",
        "space.width": 0.25 if quick else 0.5,  # C = 2 / 4
        "space.layers-per-block": 2,  # cells: normal + reduction
        "dpfnas.iterations": 2 if quick else 10,
        "dpfnas.batch-size": 16,
        "dpfnas.eval-every": 0,
        "dpfnas.delta": DELTA,
        "dpfnas.final-rounds": 1 if quick else 3,
        "dpfnas.min-replies": 1,
    }


def rows_to_run(quick: bool) -> list[tuple[str, int, float]]:
    """(mode, parties, noise variance) per row."""
    parties = (2,) if quick else (2, 4, 8)
    sweep = (10.0,) if quick else (0.5, 1.0, 2.0, 5.0, 10.0)
    sweep_parties = 2 if quick else 4
    rows = [("single", 1, 0.0)]
    rows += [("fnas", k, 0.0) for k in parties]
    rows += [("dpfnas", k, 1.0) for k in parties]
    rows += [("dpfnas", sweep_parties, v) for v in sweep if not (v == 1.0)]
    return rows


def run_row(base: dict[str, Any], mode: str, parties: int, variance: float) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader

    from fedorasflwr.artifacts import load_checkpoint
    from fedorasflwr.client_app import app
    from fedorasflwr.clients.training import evaluate
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.data import load_server_data
    from fedorasflwr.inprocess import InProcessGrid
    from fedorasflwr.search_spaces.darts import DerivedNetwork, Genotype
    from fedorasflwr.server_app import run_dpfnas

    noise = math.sqrt(variance)
    config = {
        **base,
        "min-nodes": parties,
        "dpfnas.mode": mode,
        "dpfnas.noise-weights": noise if mode == "dpfnas" else 1.0,
        "dpfnas.noise-arch": noise if mode == "dpfnas" else 1.0,
    }
    run_settings = parse_run_config(config)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        document = run_dpfnas(InProcessGrid(app, config, parties), run_settings, Path(out))
        checkpoint = load_checkpoint(Path(out) / "derived.pt")
    spec = {k: v for k, v in checkpoint["space"].items() if k != "name"}
    net = DerivedNetwork(Genotype.from_text(checkpoint["genotype"]), **spec)
    net.load_state_dict(checkpoint["state_dict"])
    net.eval()
    held_out = evaluate(
        net, DataLoader(load_server_data(run_settings.data), batch_size=256), torch.device("cpu")
    )
    privacy = document["privacy"]
    return {
        "mode": mode,
        "parties": parties,
        "noise_variance": variance if mode == "dpfnas" else 0.0,
        "server_slice_accuracy": held_out.accuracy,
        "party_test_accuracy": document["test-accuracy"],
        "epsilon": _worst(p["epsilon"] for p in privacy),
        "mu_weights": _worst(p["weights"]["mu"] for p in privacy),
        "mu_arch": _worst(p["architecture"]["mu"] for p in privacy),
        "iterations": document["iterations"],
        "genotype": document["genotype"],
        "seconds": round(time.perf_counter() - started, 1),
    }


def _worst(values: Any) -> float:
    """Largest value; ``None`` in the report means no guarantee (no noise): inf."""
    return max(math.inf if v is None else v for v in values)


def _fmt(value: float) -> str:
    return "inf (no noise)" if math.isinf(value) else f"{value:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    import logging

    logging.getLogger("flwr").setLevel(logging.WARNING)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        base = settings(args.quick, Path(tmp) / "cache")
        rows = [run_row(base, *row) for row in rows_to_run(args.quick)]
    print(
        "| setting | parties | sigma^2 = tau^2 | held-out acc | parties' test acc "
        f"| epsilon (delta={DELTA:g}) | mu_W | mu_A |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    names = {"single": "single-party NAS", "fnas": "FNAS", "dpfnas": "DP-FNAS"}
    for row in rows:
        print(
            f"| {names[row['mode']]} | {row['parties']} | {row['noise_variance']:g} "
            f"| {row['server_slice_accuracy']:.4f} | {row['party_test_accuracy']:.4f} "
            f"| {_fmt(row['epsilon'])} | {_fmt(row['mu_weights'])} | {_fmt(row['mu_arch'])} |"
        )
    fnas = {r["parties"]: r for r in rows if r["mode"] == "fnas"}
    dp = {r["parties"]: r for r in rows if r["mode"] == "dpfnas" and r["noise_variance"] == 1.0}
    gaps = {
        k: 100 * (fnas[k]["server_slice_accuracy"] - dp[k]["server_slice_accuracy"]) for k in dp
    }
    worst = max(gaps, key=lambda k: gaps[k])
    summary = {
        "single_acc": round(rows[0]["server_slice_accuracy"], 4),
        "fnas_acc": round(fnas[worst]["server_slice_accuracy"], 4),
        "dpfnas_acc": round(dp[worst]["server_slice_accuracy"], 4),
        "worst_gap_pp": round(gaps[worst], 2),
        "worst_gap_parties": worst,
        "epsilon_at_var1": round(dp[worst]["epsilon"], 3),
    }
    print(
        "headline: "
        + " ".join(f"{k}={v}" for k, v in summary.items())
        + f" within_2pp={gaps[worst] <= 2.0} quick={args.quick}"
        + f" seconds={time.perf_counter() - started:.0f}"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "dpfnas_privacy.quick.json" if args.quick else "dpfnas_privacy.json"
    (RESULTS / name).write_text(
        json.dumps(
            {
                "quick": args.quick,
                "settings": settings(args.quick, Path("-")),
                "headline": summary,
                "gaps_pp": {str(k): round(v, 2) for k, v in gaps.items()},
                "rows": [{**r, "epsilon": _fmt(r["epsilon"])} for r in rows],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
