"""DecNAS client cost against the naive federated NetAdapt and each optimisation switched off.

MNIST-5k, 50 clients (Dirichlet alpha = 1), each client's data split train/val/test
6:2:2 (paper), ConvNet (simplified AlexNet) at width 0.25, MACs budget down to 50% of
GM_0 (dR_1 = 10% of GM_0, decay 0.93: 6 iterations).  One run, same data, same seed,
same GM_0 (FedAvg-trained once, then handed to every variant), in-process grid (the real
ClientApp, no engine):

- **DecNAS**: 10 groups (r = 1.1), 33% of the candidates dropped per round, rounds
  1, 2, 3 (every 2 iterations);
- **naive**: every client trains every candidate every round, no dropping, 3 rounds
  every iteration;
- **no groups / no dropping / no dynamic rounds**: one optimisation off each;
- **centralised NetAdapt**: one party holding all the (IID) data, every candidate
  tuned for 3 rounds, no dropping;
- **width multiplier**: GM_0's structure scaled uniformly to DecNAS's budgets (the middle
  and the last GM_t), trained from scratch with FedAvg for as many rounds as GM_0 and the
  final tuning together.

Client cost = the search's short-term fine-tuning, as in the paper (§5.3): uplink bytes
(serialized arrays sent by clients; accuracies-only replies count 0) and training FLOPs
(forward x 3, FLOPs = 2 x MACs), from the ledger.  GM_0's training and the long-term
tuning (20 FedAvg rounds of GM_T on all clients) are the same for every variant and
excluded.  Accuracy: GM_t on the clients' pooled test splits (centralised: its own
test split), after the search, and GM_T after the long-term tuning.

    python benchmarks/decnas_cost.py            # full run (numbers: benchmarks/README.md)
    python benchmarks/decnas_cost.py --quick    # CI smoke run (~20 s CPU)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import report, run_config

VARIANTS = ("naive", "no-groups", "no-drop", "no-dynamic-rounds")


def settings(quick: bool, cache_dir: Path) -> dict[str, Any]:
    # --quick: the smoke test only checks that every variant runs and reports, and that
    # none uploads more than the naive one; so the least that still runs each: one
    # iteration on a fifth of MNIST-5k, 4 clients in 2 groups, no long-term tuning
    return {
        "method": "decnas",
        "data.cache-dir": str(cache_dir),
        **({"data.server-fraction": 0.8} if quick else {}),  # the clients get 1,000 samples
        "data.partitioner": "dirichlet",
        "data.alpha": 1.0,
        "data.val-fraction": 0.2,  # 6:2:2 (paper)
        "data.test-fraction": 0.2,
        "space.width": 0.125 if quick else 0.25,
        "decnas.model": "convnet",
        "decnas.target": 0.8 if quick else 0.5,
        "decnas.initial-reduction": 0.1,
        "decnas.decay": 0.93,
        "decnas.max-iterations": 1 if quick else 20,
        "decnas.num-groups": 2 if quick else 10,
        "decnas.balance-ratio": 1.1,
        "decnas.drop-ratio": 0.33,
        "decnas.rounds": "1,2" if quick else "1,2,3",
        "decnas.rounds-every": 1 if quick else 2,
        "decnas.local-epochs": 1,
        "decnas.batch-size": 32,
        "decnas.lr": 0.05,
        "decnas.gm0-rounds": 1 if quick else 10,
        "decnas.final-rounds": 0 if quick else 20,
        "decnas.final-models": "last",
    }


def make(config: dict[str, Any], **kwargs: Any) -> Any:

    from fedorasflwr.config import parse_run_config
    from fedorasflwr.methods.decnas.runner import build_decnas_net
    from fedorasflwr.methods.decnas.strategy import DecNAS

    run = parse_run_config(config)
    net = build_decnas_net(run)
    return DecNAS(net=net, settings=run.method_settings, seed=run.seed, **kwargs)


def search_cost(ledger: dict[str, Any]) -> dict[str, int]:
    """Client uplink bytes, downlink bytes and training FLOPs of the short-term tuning."""
    totals = [ledger.get(stage, {}).get("totals", {}) for stage in ("tune", "upload")]
    return {
        "uplink-bytes": sum(t.get("bytes_up", 0) for t in totals),
        "downlink-bytes": sum(t.get("bytes_down", 0) for t in totals),
        "train-flops": sum(t.get("train_flops", 0) for t in totals),
    }


def summarise(name: str, result: Any) -> dict[str, Any]:
    last = result.frontier[-1]
    return {
        "variant": name,
        **search_cost(result.ledger),
        "iterations": len(result.frontier) - 1,
        "final-macs": last.macs,
        "final-widths": last.widths,
        "final-accuracy": last.tuned_test_accuracy,
        "frontier": [model.summary() for model in result.frontier],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    parser.add_argument("--clients", type=int, default=None, help="default: 50 (quick: 4)")
    args = parser.parse_args(argv)
    clients = args.clients or (4 if args.quick else 50)
    import torch

    torch.set_num_threads(1)
    from flwr.app import ArrayRecord

    from fedorasflwr.client_app import app
    from fedorasflwr.inprocess import InProcessGrid

    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = run_config(settings(args.quick, Path(tmp) / "cache"))
        decnas = make(config)
        grid = InProcessGrid(app, config, clients)
        result = decnas.start(grid, ArrayRecord(), decnas.settings.max_iterations)
        rows.append(summarise("DecNAS", result))
        gm0 = result.frontier[0].arrays
        for variant in VARIANTS:
            cfg = {**config, "decnas.variant": variant, "decnas.gm0-rounds": 0}
            other_strategy = make(cfg)
            other = other_strategy.start(
                InProcessGrid(app, cfg, clients), gm0, other_strategy.settings.max_iterations
            )
            rows.append(summarise(variant, other))
        central_cfg = {
            **config,
            "decnas.variant": "centralised",
            "decnas.gm0-rounds": 0,
            "data.partitioner": "iid",
        }
        central_strategy = make(central_cfg, min_nodes=1)
        central = central_strategy.start(
            InProcessGrid(app, central_cfg, 1), gm0, central_strategy.settings.max_iterations
        )
        rows.append(summarise("centralised NetAdapt", central))
        frontier = result.frontier
        middle = [] if args.quick else [frontier[len(frontier) // 2]]
        picks = [frontier[0], *[m for m in middle if m is not frontier[-1]], frontier[-1]]
        width = decnas.width_baseline(grid, picks)

    base = rows[0]
    for row in rows:
        row["uplink-x"] = row["uplink-bytes"] / max(base["uplink-bytes"], 1)
        row["flops-x"] = row["train-flops"] / max(base["train-flops"], 1)
    print("Client cost of the search (short-term fine-tuning), one run, same seed and GM_0:\n")
    print(
        "| variant | uplink MB | x DecNAS | downlink MB | training TFLOPs | x DecNAS | "
        "GM_T MMACs | GM_T test acc (tuned) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['variant']} | {r['uplink-bytes'] / 1e6:.2f} | {r['uplink-x']:.1f} | "
            f"{r['downlink-bytes'] / 1e6:.2f} | {r['train-flops'] / 1e12:.3f} | "
            f"{r['flops-x']:.1f} | {r['final-macs'] / 1e6:.3f} | {r['final-accuracy']:.4f} |"
        )
    print("\nFrontier: test accuracy of GM_t after the search (MMACs in brackets):\n")
    names = [r["variant"] for r in rows]
    print("| t | " + " | ".join(names) + " | width multiplier |")
    print("| --- " * (len(names) + 2) + "|")
    width_of = {w["iteration"]: w for w in width}
    for t in range(max(len(r["frontier"]) for r in rows)):
        cells = []
        for r in rows:
            point = r["frontier"][t] if t < len(r["frontier"]) else None
            cells.append(
                f"{point['test-accuracy']:.4f} ({point['macs'] / 1e6:.3f})" if point else "-"
            )
        w = width_of.get(t)
        cells.append(f"{w['test-accuracy']:.4f} ({w['macs'] / 1e6:.3f})" if w else "-")
        print(f"| {t} | " + " | ".join(cells) + " |")
    print()
    by = {r["variant"]: r for r in rows}
    final_gm = result.frontier[-1]
    width_final = width_of.get(final_gm.iteration)
    summary = {
        "uplink_vs_naive": by["naive"]["uplink-bytes"] / max(base["uplink-bytes"], 1),
        "flops_vs_naive": by["naive"]["train-flops"] / max(base["train-flops"], 1),
        "uplink_no_groups": by["no-groups"]["uplink-x"],
        "uplink_no_drop": by["no-drop"]["uplink-x"],
        "uplink_no_dynamic": by["no-dynamic-rounds"]["uplink-x"],
        "decnas_acc": base["final-accuracy"],
        "naive_acc": by["naive"]["final-accuracy"],
        "gap_pp": 100 * (by["naive"]["final-accuracy"] - base["final-accuracy"]),
        "centralised_acc": by["centralised NetAdapt"]["final-accuracy"],
        "width_acc": width_final["test-accuracy"] if width_final else float("nan"),
        "final_mmacs": final_gm.macs / 1e6,
        "iterations": base["iterations"],
        "clients": clients,
    }
    summary["goal_met"] = summary["uplink_vs_naive"] >= 20 and summary["gap_pp"] <= 1.0
    summary["seconds"] = round(time.perf_counter() - started, 1)
    report(
        "decnas_cost",
        args.quick,
        summary,
        {
            "clients": clients,
            "settings": settings(args.quick, Path("-")),
            "convention": "MACs per sample; FLOPs = 2 x MACs; training FLOPs = 3 x forward",
            "rows": rows,
            "width-multiplier": width,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
