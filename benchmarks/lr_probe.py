"""The width baselines (and FedorAS's Stage 1) with and without the server's lr probe
(issue 40 item 4), federated.

``benchmarks/lr_stability.py`` derives the probe's rule centrally; this checks what it does
to a federated run. HeteroFL and FjORD run at ``configs/compare-quick.toml``'s settings (20
clients, Dirichlet alpha 1.0, seed 0, each method's quick-preset keys, configured lr 0.05) on
MNIST-5k and on the synthetic shapes folder (``fedorasflwr.data.shapes``, 300 images a
class), once with ``<method>.lr-probe = false`` (lr 0.05 as given) and once with the probe
(the default), in process. Each tier's model is scored on the global test set.

    python benchmarks/lr_probe.py                # 2 datasets x 2 methods x probe off / on
    python benchmarks/lr_probe.py --rounds 16    # every round key at 16
    python benchmarks/lr_probe.py --quick        # smoke: MNIST-5k, HeteroFL (flatten head), 1 round
    python benchmarks/lr_probe.py --methods fedoras --reduction maxpool-conv1x1
                                                 # FedorAS (fedoras.lr-probe) with max pooling
    python benchmarks/lr_probe.py --methods fedoras --reduction maxpool-conv1x1 \
        --datasets shapes --seeds 0 1 2 --probe on --rounds-scale auto
                                                 # ... with the rounds rule, the probe on only

``--methods fedoras`` runs FedorAS at compare-quick's keys (Stage 1 configured at lr 0.1), its
``fedoras.lr-probe`` off and on; ``--reduction`` sets its ``space.reduction``,
``--fedoras-lr`` its Stage-1 ``fedoras.lr`` (the probe starts from it).

``--rounds-scale`` is the run config's ``rounds-scale`` (``fedorasflwr.rounds``): default 1,
the rounds as compare-quick sets them, as every figure recorded before the rounds rule (2026-12-07)
was taken; ``auto`` is the rule (on shapes x2.78; on MNIST-5k 1). ``--probe on`` / ``off``
runs one side only (default: both).

The headline: per dataset and method, the mean global-test accuracy over the tiers with and
without the probe (``<dataset>_<method>_probe_on`` / ``_off``), the rate the probe kept, and
how many tiers end within 1.5x chance (the leaderboard's flag), over ``--seeds`` (default 0
alone: then the rows say what the probe does on one draw, not a mean). Writes
``benchmarks/results/lr_probe.json`` (``.rounds-<n>.json``, ``.quick.json``; other methods:
``lr_probe.<methods>[.<reduction>].json``; then ``.<datasets>`` unless both, and
``.seeds-<s>-...`` unless seed 0 alone).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from common import ROOT, dataset_label, report
from lr_stability import shapes_folder

sys.path.insert(0, str(ROOT))

METHODS = ("heterofl", "fjord")


def run_case(
    dataset: str,
    probe: bool,
    methods: tuple[str, ...],
    rounds: int,
    reduction: str = "",
    seed: int = 0,
    rounds_scale: float | str = 1.0,
    fedoras_lr: float = 0.0,
    extra: tuple[tuple[str, Any], ...] = (),
) -> dict[str, Any]:
    """One dataset, the probe on or off: every method's tiers on the global test set.
    ``reduction``: FedorAS's ``space.reduction`` ("": the file's); ``seed``: the run's;
    ``rounds_scale``: the run config's ``rounds-scale``; ``fedoras_lr``: FedorAS's Stage-1
    ``fedoras.lr`` (0: the file's); ``extra``: run-config keys every method gets."""
    import torch

    from fedorasflwr.compare.cli import compare
    from fedorasflwr.compare.leaderboard import CHANCE_FACTOR
    from fedorasflwr.compare.spec import app_run_config, read_spec
    from fedorasflwr.config import parse_run_config

    torch.set_num_threads(1)
    flags = {"methods": ",".join(methods), "reference": methods[0], "rounds": rounds}
    base = read_spec(ROOT / "configs/compare-quick.toml", flags)
    spec = replace(
        base,
        shared={**base.shared, "data.dataset": dataset, "seed": seed, "rounds-scale": rounds_scale},
        overrides={
            m: {
                **base.overrides.get(m, {}),
                f"{m}.lr-probe": probe,
                **({"space.reduction": reduction} if reduction and m == "fedoras" else {}),
                **({"fedoras.lr": fedoras_lr} if fedoras_lr and m == "fedoras" else {}),
                **dict(extra),
            }
            for m in methods
        },
    )
    with tempfile.TemporaryDirectory() as out:
        board = compare(spec, Path(out), inprocess=True, echo=lambda line: None)
        probes = {}
        for entry in board["methods"]:
            if entry["result"] is None:
                raise SystemExit(f"{entry['method']} failed on {dataset}: {entry['reason']}")
            result = Path(out) / entry["result"]
            document = json.loads(result.read_text())
            probes[entry["method"]] = document.get("lr_probe")
    name = dataset_label(dataset)
    chance = board["chance"]
    out_rows = []
    for method in methods:
        tiers = [r for r in board["rows"] if r["method"] == method]
        accuracies = [r["global_test_accuracy"] for r in tiers]
        config = {**app_run_config(ROOT), **spec.run_config(method)}
        configured = parse_run_config(config).method_settings.train.lr
        out_rows.append(
            {
                "dataset": name,
                "method": method,
                "seed": seed,
                "probe": probe,
                "lr": probes[method]["lr"] if probes[method] else configured,
                "tried": probes[method]["tried"] if probes[method] else [],
                "tiers": {r["model"]: r["global_test_accuracy"] for r in tiers},
                "mean": statistics.fmean(accuracies),
                "near_chance": sum(a <= CHANCE_FACTOR * chance + 1e-9 for a in accuracies),
                "chance": chance,
            }
        )
    return {"rows": out_rows}


def _job(
    args: tuple[str, bool, tuple[str, ...], int, str, int, float | str, float, tuple],
) -> dict[str, Any]:
    return run_case(*args)


def headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``<dataset>_<method>_probe_on`` / ``_off`` (mean tier accuracy, over the seeds),
    ``..._lr`` (the smallest rate the probe kept) and ``..._near_chance_on`` / ``_off``
    (tiers within 1.5x chance, summed over the seeds)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        side = "on" if row["probe"] else "off"
        groups.setdefault((f"{row['dataset']}_{row['method']}", side), []).append(row)
    out: dict[str, Any] = {}
    for (key, side), group in groups.items():
        out[f"{key}_probe_{side}"] = round(statistics.fmean(r["mean"] for r in group), 4)
        out[f"{key}_near_chance_{side}"] = sum(r["near_chance"] for r in group)
        if side == "on":
            out[f"{key}_lr"] = min(r["lr"] for r in group)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=0, help="every round key (0: presets')")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--methods", default=",".join(METHODS), help="heterofl, fjord, fedoras")
    parser.add_argument("--reduction", default="", help="FedorAS's space.reduction")
    parser.add_argument("--fedoras-lr", type=float, default=0.0, help="FedorAS's fedoras.lr")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--datasets", nargs="+", choices=("mnist5k", "shapes"), default=["mnist5k", "shapes"]
    )
    parser.add_argument(
        "--rounds-scale", default="1", help='the run config\'s rounds-scale: "auto" or a number'
    )
    parser.add_argument("--probe", choices=("both", "on", "off"), default="both")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    rounds_scale: float | str = "auto" if args.rounds_scale == "auto" else float(args.rounds_scale)
    sides = {"both": (False, True), "on": (True,), "off": (False,)}[args.probe]
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    unknown = sorted(set(methods) - {*METHODS, "fedoras"})
    if unknown or not methods:
        raise SystemExit(f"--methods {args.methods!r}: allowed: heterofl, fjord, fedoras")
    if (args.reduction or args.fedoras_lr) and "fedoras" not in methods:
        raise SystemExit("--reduction / --fedoras-lr set FedorAS's: add fedoras to --methods")
    extra: tuple[tuple[str, Any], ...] = ()
    if args.quick:
        datasets, methods, args.rounds, args.seeds = ["mnist5k"], ("heterofl",), 1, [0]
        # the ConvNet's plain flatten head, whose first steps blow up at 0.05 on MNIST-5k (the
        # scaled head, the default since 2026-12-07, keeps them bounded: nothing to lower)
        extra = (("heterofl.head", "flatten"),)
    else:
        datasets = [shapes_folder(300) if d == "shapes" else d for d in args.datasets]
    from lr_stability import _data

    for dataset in datasets:  # fill the data cache once, before the workers race for it
        _data(dataset)
    jobs = [
        (d, probe, methods, args.rounds, args.reduction, seed, rounds_scale, args.fedoras_lr, extra)
        for seed in args.seeds
        for d in datasets
        for probe in sides
    ]
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        rows = [row for case in pool.map(_job, jobs) for row in case["rows"]]
    print(f"{'dataset':<20} {'method':<9} seed {'probe':<5} {'lr':>9} mean  tiers")
    for row in rows:
        tiers = " ".join(f"{a:.3f}" for a in row["tiers"].values())
        print(
            f"{row['dataset']:<20} {row['method']:<9} {row['seed']:>4} {str(row['probe']):<5} "
            f"{row['lr']:>9.6f} {row['mean']:.3f} {tiers}"
        )
    name = "lr_probe" + (f".rounds-{args.rounds}" if args.rounds and not args.quick else "")
    if methods != METHODS and not args.quick:
        name += "." + "-".join(methods) + (f".{args.reduction}" if args.reduction else "")
        name += f".lr-{args.fedoras_lr:g}" if args.fedoras_lr else ""
    if not args.quick and args.datasets != ["mnist5k", "shapes"]:
        name += "." + "-".join(args.datasets)
    if args.seeds != [0]:
        name += ".seeds-" + "-".join(str(seed) for seed in args.seeds)
    if rounds_scale != 1.0:
        name += f".rounds-scale-{args.rounds_scale}"
    if args.probe != "both":
        name += f".probe-{args.probe}"
    summary = {
        "rounds": args.rounds or "presets'",
        "rounds_scale": rounds_scale,
        "seeds": " ".join(str(seed) for seed in args.seeds),
        **({"reduction": args.reduction} if args.reduction else {}),
        **({"fedoras_lr": args.fedoras_lr} if args.fedoras_lr else {}),
        **headline(rows),
    }
    report(name, args.quick, summary, {"rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
