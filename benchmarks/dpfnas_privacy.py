"""DP-FNAS privacy / accuracy trade-off on MNIST-5k (paper: Table 1 and Table 2).

One run, same seed, side by side (in-process grid: the real ClientApp, no engine):

- **single-party NAS** (one party holding every training and validation sample, no noise);
- **FNAS** (K = 2, 4, 8 IID parties, no noise) and **DP-FNAS** (same K, sigma^2 = tau^2 = 1);
- a **noise sweep** sigma^2 = tau^2 in {0.5, 1, 2, 5, 10} at K = 4.

Every row runs the federated search of the ``darts`` space with the same budget
(iterations, expected batch per party, learning rates) and derives the genotype
(top-2 inputs per node).  The derived network is then evaluated with the
paper's protocol (§4.1, "augmentation"): trained **from scratch, centrally, on
all the training data** (here the single party's train + validation split,
4,050 digits, identical for every row) with one fixed schedule (SGD, cosine
lr, ``AUGMENT`` below) for several seeds, and tested on the **server slice**
(500 held-out digits no party trains on and no search decision uses).  The
table reports mean +- std over those seeds; the seeds are the same for every
row, so the FNAS / DP-FNAS difference is a paired comparison of the two
genotypes, with no federated-training noise in it (the ``dpfnas.final-*``
FedAvg stage of ``flwr run`` is not used here).  Identical (effective)
genotypes share one evaluation.  Epsilon at delta = 1e-5 is opacus' RDP
accountant for the worst party and the worst of the W and A mechanisms, with
the paper's mu-GDP for W and A.

At ``space.layers-per-block`` = 2 both cells are reduction cells (DARTS puts
reductions at 1/3 and 2/3 of the depth), so only the reduction half of the
genotype is searched and used; the normal half is reported but inert.

    python benchmarks/dpfnas_privacy.py            # full run (numbers: benchmarks/README.md)
    python benchmarks/dpfnas_privacy.py --quick    # CI smoke run (< 2 minutes)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import report

DELTA = 1e-5


def augment_settings(quick: bool) -> dict[str, Any]:
    """The fixed from-scratch training of every derived network (paper: 600 epochs)."""
    return {
        "epochs": 1 if quick else 10,
        "seeds": [0] if quick else [0, 1, 2],
        "batch-size": 256 if quick else 64,
        "lr": 0.1,  # cosine-annealed to 0 over the run
        "momentum": 0.9,
        "weight-decay": 3e-4,
    }


def settings(quick: bool, cache_dir: Path) -> dict[str, Any]:
    return {
        "method": "dpfnas",
        "seed": 0,
        "data.cache-dir": str(cache_dir),
        "data.partitioner": "iid",
        "space.name": "darts",
        "space.width": 0.25 if quick else 0.5,  # C = 2 / 4
        "space.layers-per-block": 2,  # two cells, both reductions (see the module docstring)
        "dpfnas.iterations": 1 if quick else 10,
        "dpfnas.batch-size": 16,
        "dpfnas.eval-every": 0,
        "dpfnas.delta": DELTA,
        "dpfnas.final-rounds": 0,  # evaluation is the central from-scratch training below
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


def search_row(base: dict[str, Any], mode: str, parties: int, variance: float) -> dict[str, Any]:
    """The federated search of one row: genotype, privacy, time."""
    from fedorasflwr.client_app import app
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.inprocess import InProcessGrid
    from fedorasflwr.methods.dpfnas.runner import run_dpfnas

    noise = math.sqrt(variance)
    config = {
        **base,
        "min-nodes": parties,
        "dpfnas.mode": mode,
        "dpfnas.noise-weights": noise if mode == "dpfnas" else 1.0,
        "dpfnas.noise-arch": noise if mode == "dpfnas" else 1.0,
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        document = run_dpfnas(
            InProcessGrid(app, config, parties), parse_run_config(config), Path(out)
        )
    privacy = document["privacy"]
    return {
        "mode": mode,
        "parties": parties,
        "noise_variance": variance if mode == "dpfnas" else 0.0,
        "epsilon": _worst(p["epsilon"] for p in privacy),
        "mu_weights": _worst(p["weights"]["mu"] for p in privacy),
        "mu_arch": _worst(p["architecture"]["mu"] for p in privacy),
        "iterations": document["iterations"],
        "genotype": document["genotype"],
        "search_seconds": round(time.perf_counter() - started, 1),
    }


class Augmentation:
    """Train a genotype's network from scratch on all the training data; server-slice
    accuracy per seed.  Cached by the part of the genotype the network uses."""

    def __init__(self, base: dict[str, Any], options: dict[str, Any]) -> None:
        from torch.utils.data import ConcatDataset

        from fedorasflwr.config import parse_run_config
        from fedorasflwr.data import load_client_data, load_server_data
        from fedorasflwr.runs import build_supernet

        run = parse_run_config({**base, "min-nodes": 1})
        self.spec = {k: v for k, v in build_supernet(run).spec.items() if k != "name"}
        everything = load_client_data(run.data, 0, 1)  # one party: all non-server digits
        self.train = ConcatDataset([everything.train, everything.val])
        self.test = load_server_data(run.data)
        self.options = options
        self.cache: dict[str, list[float]] = {}

    def key(self, genotype_text: str) -> str:
        from fedorasflwr.search_spaces.darts import _reduction_layers

        normal, reduce = genotype_text.split("|")
        cells = int(self.spec["cells"])
        has_normal = len(_reduction_layers(cells) & set(range(cells))) < cells
        return (normal if has_normal else "-") + "|" + reduce

    def __call__(self, genotype_text: str) -> list[float]:
        key = self.key(genotype_text)
        if key not in self.cache:
            self.cache[key] = [self.train_once(genotype_text, s) for s in self.options["seeds"]]
        return self.cache[key]

    def train_once(self, genotype_text: str, seed: int) -> float:
        import torch
        from torch import nn
        from torch.utils.data import DataLoader

        from fedorasflwr.search_spaces.darts import DerivedNetwork, Genotype
        from fedorasflwr.training import evaluate

        o = self.options
        torch.manual_seed(seed)
        net = DerivedNetwork(Genotype.from_text(genotype_text), **self.spec)
        loader = DataLoader(
            self.train,
            batch_size=o["batch-size"],
            shuffle=True,
            generator=torch.Generator().manual_seed(seed),
        )
        optimizer = torch.optim.SGD(
            net.parameters(), lr=o["lr"], momentum=o["momentum"], weight_decay=o["weight-decay"]
        )
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, o["epochs"] * len(loader))
        net.train()
        for _ in range(o["epochs"]):
            for inputs, targets in loader:
                optimizer.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(net(inputs), targets).backward()
                optimizer.step()
                schedule.step()
        net.eval()
        result = evaluate(net, DataLoader(self.test, batch_size=256), torch.device("cpu"))
        return float(result.accuracy)


def _worst(values: Any) -> float:
    """Largest value; ``None`` in the report means no guarantee (no noise): inf."""
    return max(math.inf if v is None else v for v in values)


def _fmt(value: float) -> str:
    return "inf (no noise)" if math.isinf(value) else f"{value:.3g}"


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    import logging

    logging.getLogger("flwr").setLevel(logging.WARNING)
    started = time.perf_counter()
    options = augment_settings(args.quick)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = settings(args.quick, Path(tmp) / "cache")
        for mode, parties, variance in rows_to_run(args.quick):
            row = search_row(base, mode, parties, variance)
            print(
                f"searched {mode} K={parties} var={variance:g} in {row['search_seconds']}s",
                file=sys.stderr,
                flush=True,
            )
            rows.append(row)
        augment = Augmentation(base, options)
        for row in rows:
            begun = time.perf_counter()
            accuracies = augment(row["genotype"])
            row["evaluated_genotype"] = augment.key(row["genotype"])
            row["accuracies"] = accuracies
            row["accuracy_mean"] = statistics.fmean(accuracies)
            row["accuracy_std"] = _std(accuracies)
            row["augment_seconds"] = round(time.perf_counter() - begun, 1)
            print(
                f"evaluated {row['mode']} K={row['parties']} in {row['augment_seconds']}s",
                file=sys.stderr,
                flush=True,
            )
    seeds = len(options["seeds"])
    print(
        f"| setting | parties | sigma^2 = tau^2 | test acc (mean +- std, {seeds} seeds) "
        f"| epsilon (delta={DELTA:g}) | mu_W | mu_A |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    names = {"single": "single-party NAS", "fnas": "FNAS", "dpfnas": "DP-FNAS"}
    for row in rows:
        print(
            f"| {names[row['mode']]} | {row['parties']} | {row['noise_variance']:g} "
            f"| {row['accuracy_mean']:.4f} +- {row['accuracy_std']:.4f} "
            f"| {_fmt(row['epsilon'])} | {_fmt(row['mu_weights'])} | {_fmt(row['mu_arch'])} |"
        )
    fnas = {r["parties"]: r for r in rows if r["mode"] == "fnas"}
    dp = {r["parties"]: r for r in rows if r["mode"] == "dpfnas" and r["noise_variance"] == 1.0}
    # paired over the (shared) training seeds: mean and standard error of the difference
    diffs = {
        k: [100 * (a - b) for a, b in zip(fnas[k]["accuracies"], dp[k]["accuracies"], strict=True)]
        for k in dp
    }
    gaps = {k: statistics.fmean(v) for k, v in diffs.items()}
    errors = {k: _std(v) / math.sqrt(len(v)) for k, v in diffs.items()}
    worst = max(gaps, key=lambda k: gaps[k])
    summary = {
        "single_acc": round(rows[0]["accuracy_mean"], 4),
        "fnas_acc": round(fnas[worst]["accuracy_mean"], 4),
        "dpfnas_acc": round(dp[worst]["accuracy_mean"], 4),
        "worst_gap_pp": round(gaps[worst], 2),
        "worst_gap_se_pp": round(errors[worst], 2),
        "worst_gap_parties": worst,
        "epsilon_at_var1": round(dp[worst]["epsilon"], 3),
        "distinct_genotypes": len(augment.cache),
    }
    print(
        "gaps FNAS - DP-FNAS (pp, paired mean +- s.e.): "
        + ", ".join(f"K={k}: {gaps[k]:+.2f} +- {errors[k]:.2f}" for k in sorted(gaps))
    )
    summary["within_2pp"] = gaps[worst] <= 2.0
    summary["seconds"] = round(time.perf_counter() - started)
    report(
        "dpfnas_privacy",
        args.quick,
        summary,
        {
            "settings": settings(args.quick, Path("-")),
            "augmentation": options,
            "gaps_pp": {str(k): round(v, 2) for k, v in gaps.items()},
            "gaps_se_pp": {str(k): round(v, 2) for k, v in errors.items()},
            "rows": [{**r, "epsilon": _fmt(r["epsilon"])} for r in rows],
        },
    )


if __name__ == "__main__":
    main()
