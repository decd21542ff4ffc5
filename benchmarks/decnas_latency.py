"""DecNAS by latency against DecNAS by MACs at the same latency budget (issue 16 item 3).

MNIST-5k, 6 clients (Dirichlet alpha = 1), ConvNet at width 0.5, in-process grid (the real
ClientApp, no engine), one torch thread, the CPU. GM_0 is FedAvg-trained once and handed to
both runs:

1. **by MACs** (the paper's resource): down to ``target`` x GM_0's MACs;
2. the target devices' layer-wise latency table of GM_0 (every node a target; NetAdapt's
   look-up table, ``fedorasflwr.methods.decnas.latency``; the fastest of ``repeats`` timed
   calls per entry) predicts GM_T(MACs)'s latency: that many ms is the budget of
3. **by latency** (NetAdapt's resource): down to the same ms, costed on the same table.

Reported per run: GM_T's MACs, its predicted and measured latency (end to end at batch 1,
the fastest of 50 calls), its test accuracy after the search and after the FedAvg tuning,
and the table's own validation (Spearman's rho and the median relative error of 20
random-width nets timed end to end). NetAdapt's claim: at the same latency, the net pruned
by latency keeps more accuracy than the one pruned by a proxy (here MACs).

    python benchmarks/decnas_latency.py            # full run (numbers: benchmarks/README.md)
    python benchmarks/decnas_latency.py --quick    # CI smoke run
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import report, run_config


def settings(quick: bool, cache_dir: Path) -> dict[str, Any]:
    # --quick: the smoke test checks that both runs report and that the run by latency
    # meets the budget; so a fifth of MNIST-5k, a coarse table and no long-term tuning
    return {
        "method": "decnas",
        "data.cache-dir": str(cache_dir),
        **({"data.server-fraction": 0.8} if quick else {}),  # the clients get 1,000 samples
        "data.partitioner": "dirichlet",
        "data.alpha": 1.0,
        "space.width": 0.25 if quick else 0.5,
        "decnas.model": "convnet",
        "decnas.target": 0.8 if quick else 0.5,
        "decnas.initial-reduction": 0.1,
        "decnas.decay": 0.93,
        "decnas.max-iterations": 1 if quick else 10,
        "decnas.num-groups": 3,
        "decnas.rounds": "1" if quick else "1,2",
        "decnas.rounds-every": 2,
        "decnas.batch-size": 32,
        "decnas.gm0-rounds": 1 if quick else 10,
        "decnas.final-rounds": 0 if quick else 10,
        "decnas.latency-grid": 2 if quick else 8,
        "latency.statistic": "min",
        "latency.repeats": 3 if quick else 20,
        "latency.warmup": 1 if quick else 5,
        "latency.validation-paths": 4 if quick else 20,
    }


def make(config: dict[str, Any]) -> Any:
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.methods.decnas.runner import build_decnas_net
    from fedorasflwr.methods.decnas.strategy import DecNAS

    run = parse_run_config(config)
    return DecNAS(
        net=build_decnas_net(run),
        settings=run.method_settings,
        seed=run.seed,
        latency=run.latency.request(run.seed),
    )


def summarise(name: str, result: Any, predict: Any, measured: float) -> dict[str, Any]:
    last = result.frontier[-1]
    return {
        "run": name,
        "iterations": len(result.frontier) - 1,
        "final-widths": last.widths,
        "final-macs": last.macs,
        "predicted-ms": predict(last.widths),
        "measured-ms": measured,
        "test-accuracy": last.test_accuracy,
        "tuned-test-accuracy": last.tuned_test_accuracy,
        "frontier": [{**m.summary(), "predicted-ms": predict(m.widths)} for m in result.frontier],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    parser.add_argument("--clients", type=int, default=None, help="default: 6 (quick: 4)")
    args = parser.parse_args(argv)
    clients = args.clients or (4 if args.quick else 6)
    import torch

    torch.set_num_threads(1)
    from flwr.app import ArrayRecord

    from fedorasflwr.client_app import app
    from fedorasflwr.clients.layer_latency import cached_layer_table
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.inprocess import InProcessGrid
    from fedorasflwr.methods.decnas.latency import layer_layout, measure_nets, predict_ms

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FEDORASFLWR_CACHE"] = str(Path(tmp) / "node-cache")  # measured afresh
        config = run_config(settings(args.quick, Path(tmp) / "cache"))
        by_macs = make({**config, "decnas.resource": "macs"})
        grid = InProcessGrid(app, config, clients)
        macs_result = by_macs.start(grid, ArrayRecord(), by_macs.settings.max_iterations)
        gm0 = macs_result.frontier[0]

        # the table every node of this host would send (the nodes read this cache file)
        run = parse_run_config(config)
        layout = layer_layout(gm0.spec, run.method_settings.latency_grid)
        table, _ = cached_layer_table(layout, run.latency.request(run.seed))

        def predict(widths: Any) -> float:
            return predict_ms(table, layout, widths)

        budget_ms = predict(macs_result.frontier[-1].widths)
        target = budget_ms / predict(gm0.widths)
        lat_config = {
            **config,
            "decnas.resource": "latency",
            "decnas.target": min(max(target, 1e-6), 1 - 1e-9),
            "decnas.gm0-rounds": 0,
        }
        by_latency = make(lat_config)
        lat_grid = InProcessGrid(app, lat_config, clients)
        lat_result = by_latency.start(lat_grid, gm0.arrays, by_latency.settings.max_iterations)

        finals = [macs_result.frontier[-1].widths, lat_result.frontier[-1].widths, gm0.widths]
        repeats, warmup = (5, 1) if args.quick else (50, 5)
        measured = measure_nets(layout, finals, repeats=repeats, warmup=warmup, statistic="min")
    rows = [
        summarise("by MACs", macs_result, predict, measured[0]),
        summarise("by latency", lat_result, predict, measured[1]),
    ]
    check = table.validation
    print(
        f"GM_0: {gm0.macs / 1e6:.3f} MMACs, predicted {predict(gm0.widths):.3f} ms, "
        f"measured {measured[2]:.3f} ms; table: {sum(layout.num_options())} entries, "
        + (
            f"rho {check.spearman_rho:.3f}, relative error {check.relative_error:.3f} "
            f"({check.paths} nets)"
            if check is not None
            else "no validation"
        )
        + f"; latency budget {budget_ms:.3f} ms ({target:.3f} of GM_0)\n"
    )
    print(
        "| run | iterations | GM_T widths | MMACs | predicted ms | measured ms | "
        "test acc | tuned test acc |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['run']} | {r['iterations']} | {r['final-widths']} | "
            f"{r['final-macs'] / 1e6:.3f} | {r['predicted-ms']:.3f} | {r['measured-ms']:.3f} | "
            f"{r['test-accuracy']:.4f} | {r['tuned-test-accuracy'] or float('nan'):.4f} |"
        )
    print()
    macs_row, lat_row = rows
    summary = {
        "budget_ms": budget_ms,
        "macs_predicted_ms": macs_row["predicted-ms"],
        "latency_predicted_ms": lat_row["predicted-ms"],
        "macs_measured_ms": macs_row["measured-ms"],
        "latency_measured_ms": lat_row["measured-ms"],
        "macs_mmacs": macs_row["final-macs"] / 1e6,
        "latency_mmacs": lat_row["final-macs"] / 1e6,
        "macs_acc": macs_row["tuned-test-accuracy"] or float("nan"),
        "latency_acc": lat_row["tuned-test-accuracy"] or float("nan"),
        "table_rho": check.spearman_rho if check is not None else float("nan"),
        "table_error": check.relative_error if check is not None else float("nan"),
        "clients": clients,
    }
    summary["within_budget"] = lat_row["predicted-ms"] <= budget_ms + 1e-9
    summary["seconds"] = round(time.perf_counter() - started, 1)
    report(
        "decnas_latency",
        args.quick,
        summary,
        {
            "clients": clients,
            "settings": settings(args.quick, Path("-")),
            "gm0": {"widths": gm0.widths, "macs": gm0.macs, "measured-ms": measured[2]},
            "table": {"entries": sum(layout.num_options()), "fixed-ms": table.fixed_ms},
            "rows": rows,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
