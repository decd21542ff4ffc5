"""FedorAS per tier against rand-init, OPA against FedAvg of supernets, and B_comm.

MNIST-5k, 40 clients, Dirichlet label skew alpha = 0.1 and alpha = 1.0, 4 tiers with
clients dealt to them uniformly, cnn_s; every case is a whole FedorAS run (Stage 1,
NSGA-II per tier on the server's held-out slice, Stage 3 per tier) on the in-process
grid (the real ClientApp and strategy, no engine), same seed:

- **FedorAS vs rand-init** (paper Table 6), for each alpha: every tier's searched
  architecture fine-tuned from the supernet's weights, and the *same* architecture
  trained from a random initialisation with FedAvg on the same eligible clients (the
  tier and those above), for as many rounds as Stage 1 had (the paper: 500, against
  100 rounds of fine-tuning after 500 of supernet training), same local recipe;
- **OPA vs FedAvg of supernets** (alpha = 0.1): Stage 1 with ``aggregation="fedavg"``
  (clients return every weight they got; plain averaging), then the same Stages 2-3;
- **communication budget** (alpha = 0.1): B_comm = the whole supernet and 1/4 of it,
  against the default 1/2;
- **tier-unaware baseline** (paper Figs. 1 and 3; alpha = 0.1, at every seed like the main
  runs): ``fedoras.tier-aware = false`` puts every client in the top tier, so every path
  trains on every client and every tier's model is fine-tuned and tested on all clients:
  what the tiers' models would score if device limits did not exist.  Its rand-init
  models (each tier's architecture trained from scratch with FedAvg on every client) are
  the paper's tier-unaware baseline of Fig. 3.

Accuracy = the tier's model on the global test set held by the server (``data.global-test``:
450 digits carved before partitioning, the same for every tier: the paper's protocol);
result files from before it (no global figure) give the pooled test splits of the clients
able to run the model, and the printed table says which.
Cases run two at a time in fresh processes with one torch thread each (``--quick``: one
after the other in one process, without the runs' figures).  Prints one
Markdown table and ``headline: ...``; writes ``benchmarks/results/fedoras_tiers.json``
(``.quick.json`` for ``--quick``).  The memory side of the issue (single path against a
DARTS-style mixed step) is ``benchmarks/fedoras_memory.py``.

    python benchmarks/fedoras_tiers.py            # full run (numbers: benchmarks/README.md)
    python benchmarks/fedoras_tiers.py --quick    # CI smoke run (< 2 minutes)

A test client set of one seed is small (the top tier's model is tested on the ten top-tier
clients' ~100 digits), so ``--seeds`` repeats the main runs with other run-config seeds
(each draws its own split, tiers, sampling and initialisation) and adds the per-tier gain
averaged over them; ``--merge`` takes finished cases from earlier result files instead of
running them again:

    python benchmarks/fedoras_tiers.py --seeds 1 2 --only opa  # fedoras_tiers.seeds-1-2.opa.json
    python benchmarks/fedoras_tiers.py --seeds 0 1 2 --merge \
        benchmarks/results/fedoras_tiers.json benchmarks/results/fedoras_tiers.seeds-1-2.opa.json

Each finished case is saved at once to ``<result name>.partial.json`` (removed when the
whole run is reported): a run stopped part way goes on with the same command plus
``--merge benchmarks/results/<result name>.partial.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from common import RESULTS, report, run_config, warm_data_cache

SKEWED, MILD = 0.1, 1.0


def file_defaults() -> dict[str, Any]:
    """What a result file written before these keys were recorded was measured with: the
    paper's GAP head and reduction, Stage 1 at its lr as given (the probe came later) and at
    the paper's lr 0.1 (the default until 2026-12-07). ``merged_cases`` (and
    ``baselines.py``'s merge) read a file's settings on top of these."""
    from fedorasflwr.search_spaces.cnn import PAPER_REDUCTION

    return {
        "space.head": "gap",
        "space.reduction": PAPER_REDUCTION,
        "fedoras.lr-probe": False,
        "fedoras.lr": 0.1,
    }


def identity() -> dict[str, Any]:
    """The keys that decide FedorAS's figures and that ``pyproject.toml``'s defaults may
    change (issue 40): every file names them, resolved (``auto`` as the head and reduction
    it builds)."""
    from fedorasflwr.config import SpaceSettings
    from fedorasflwr.methods.fedoras.settings import FedorASSettings

    return {
        "space.head": SpaceSettings(name="cnn_s").resolved_head(),
        "space.reduction": SpaceSettings(name="cnn_s").resolved_reduction(),
        "fedoras.lr": FedorASSettings().train.lr,
        # Stage 1 at lr as given, as every recorded case was (fedoras.lr-probe came later)
        "fedoras.lr-probe": False,
    }


def settings(quick: bool) -> dict[str, Any]:
    """The run config shared by every case (on top of ``pyproject.toml``'s defaults)."""
    common: dict[str, Any] = {
        **identity(),
        "data.partitioner": "dirichlet",
        "fedoras.num-tiers": 4,
        "fedoras.tier-proportions": "",
        "fedoras.eval-every": 0,
        "fedoras.compare-rand-init": True,
        "data.global-test": True,  # the headline on the server's global test set (issue 28)
    }
    if quick:
        # The smallest run that still makes every comparison: each stage once, the fewest
        # clients and steps (batches of 128: a client's ~470 digits in 4 steps), one NSGA-II
        # generation after the first, a 200-digit server slice for scoring and curves.
        return {
            **common,
            "fedoras.num-tiers": 2,  # every comparison still made, on half the fine-tuning jobs
            "space.width": 0.25,
            "data.server-fraction": 0.04,
            "fedoras.rounds": 1,
            "fedoras.clients-per-round": 2,
            "fedoras.local-epochs": 1,
            "fedoras.batch-size": 128,
            "fedoras.tier-samples": 100,
            "fedoras.search-population": 2,
            "fedoras.search-offspring": 1,
            "fedoras.search-evaluations": 3,
            "fedoras.finetune-rounds": 1,
            "fedoras.finetune-clients-per-round": 2,
            "fedoras.finetune-batch-size": 128,
            "fedoras.rand-init-rounds": 1,
        }
    # A client holds about 90 training digits (3 batches of 32).  As in the paper, a Stage-1
    # round trains much more per client than a fine-tuning or rand-init round (CIFAR-10:
    # 50 epochs at batch 128 = 200 steps against 1 epoch at batch 32 = 16 steps; here
    # 10 epochs = 30 steps against 2 epochs = 6 steps), and rand-init gets as many rounds
    # as Stage 1 (paper: 500 and 500).  Fine-tuning gets as many rounds as rand-init, so
    # the two differ only in their initialisation (the paper fine-tunes for 100 rounds; at
    # 20 here, FedorAS lost the top tier by 3-5 pp while winning the others).
    return {
        **common,
        "space.width": 0.5,
        "fedoras.rounds": 30,
        "fedoras.clients-per-round": 10,
        "fedoras.local-epochs": 10,
        "fedoras.search-population": 16,
        "fedoras.search-offspring": 8,
        "fedoras.search-evaluations": 48,
        "fedoras.finetune-rounds": 30,
        "fedoras.finetune-clients-per-round": 6,
        "fedoras.finetune-local-epochs": 2,
        "fedoras.rand-init-rounds": 30,
    }


CASES: list[dict[str, Any]] = [
    {"name": "opa", "alpha": SKEWED, "overrides": {}},
    {"name": "opa", "alpha": MILD, "overrides": {}},
    {
        "name": "fedavg",
        "alpha": SKEWED,
        "overrides": {"fedoras.aggregation": "fedavg", "fedoras.compare-rand-init": False},
    },
    {
        "name": "budget-1",
        "alpha": SKEWED,
        "overrides": {"fedoras.comm-budget": 1.0, "fedoras.compare-rand-init": False},
    },
    {
        "name": "budget-1/4",
        "alpha": SKEWED,
        "overrides": {"fedoras.comm-budget": 0.25, "fedoras.compare-rand-init": False},
    },
    {
        "name": "tier-unaware",
        "alpha": SKEWED,
        "overrides": {"fedoras.tier-aware": False},
    },
]
"""Every FedorAS run in the table: name, alpha and run-config overrides (the main runs,
named "opa", and the tier-unaware one train the rand-init comparison)."""

EVERY_SEED = ("opa", "tier-unaware")
"""Runs repeated at every seed; the others (OPA against FedAvg, B_comm) run at the first."""


def cases(seeds: list[int], only: list[str]) -> list[dict[str, Any]]:
    """The runs for ``seeds``: the main ones and the tier-unaware baseline at every seed,
    the other comparisons (OPA against FedAvg, B_comm) at the first; ``only`` keeps just the
    named ones (all if empty)."""
    return [
        {**case, "seed": seed}
        for i, seed in enumerate(seeds)
        for case in CASES
        if (not only or case["name"] in only) and (case["name"] in EVERY_SEED or i == 0)
    ]


def case_key(case: dict[str, Any]) -> tuple[str, float, int]:
    # Result files written before ``--seeds`` existed ran the pyproject's seed, 0.
    return case["name"], case["alpha"], case.get("seed", 0)


def merged_cases(
    paths: list[Path], settings_now: dict[str, Any], clients: int
) -> dict[tuple[str, float, int], dict[str, Any]]:
    """The finished runs in earlier result files of this benchmark, by (name, alpha, seed);
    a file measured with other settings or another number of clients is an error."""
    done: dict[tuple[str, float, int], dict[str, Any]] = {}
    for path in paths:
        document = json.loads(path.read_text())
        saved = {**file_defaults(), **document.get("settings", {})}
        if saved != settings_now or document.get("clients") != clients:
            raise SystemExit(
                f"--merge {path}: measured with clients={document.get('clients')} and "
                f"settings {saved}; this run has clients={clients} and "
                f"settings {settings_now}"
            )
        for case in document["cases"]:
            done[case_key(case)] = {**case, "seed": case_key(case)[2]}
    return done


def results_name(seeds: list[int], only: list[str]) -> str:
    """``fedoras_tiers`` for the default run (every case, seed 0), else with the seeds and
    the kept cases in the name, so that no run overwrites another's file."""
    if seeds == [0] and not only:
        return "fedoras_tiers"
    name = "fedoras_tiers.seeds-" + "-".join(map(str, seeds))
    return name + ("." + "-".join(n.replace("/", "_") for n in only) if only else "")


def run_case(
    config: dict[str, Any], clients: int, out_dir: str, plots: bool = True
) -> dict[str, Any]:
    """One whole FedorAS run in this (fresh) process; its per-tier models and costs.
    ``plots=False`` skips the run's figures, which no number here comes from."""
    from unittest import mock

    import torch

    torch.set_num_threads(1)
    from fedorasflwr.client_app import app
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.inprocess import InProcessGrid
    from fedorasflwr.methods.fedoras import runner
    from fedorasflwr.progress import setup_logging

    setup_logging(False)  # a spawned process: each log line once

    started = time.perf_counter()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    figures = runner.fedoras_plots if plots else lambda *_: []
    with mock.patch.object(runner, "fedoras_plots", figures):
        document = runner.run_fedoras(
            InProcessGrid(app, config, clients), parse_run_config(config), Path(out_dir)
        )
    stage1 = document["ledger"]["supernet"]["totals"]
    return {
        "models": document["models"],
        "tiers": document["tiers"],  # 1-based "index", as in result.json
        "stage1-bytes-down-per-message": stage1["bytes_down"] / max(stage1["messages"], 1),
        "stage1-bytes-up-per-reply": stage1["bytes_up"] / max(stage1["replies"], 1),
        "seconds": round(time.perf_counter() - started, 1),
    }


def run_cases(
    configs: list[dict[str, Any]],
    clients: int,
    tmp: Path,
    jobs: int,
    finished: Callable[[int, dict[str, Any]], None] = lambda i, outcome: None,
) -> list[dict[str, Any]]:
    """``run_case`` of every config (data partitions built once first, outputs under
    ``tmp``): ``jobs`` at a time in fresh spawned processes, or with ``jobs = 0`` one after
    the other in this process, without the runs' figures. ``finished(i, outcome)`` is
    called as each run ends (``main`` saves the runs done so far)."""
    warm_data_cache(configs, clients)
    out_dirs = [str(tmp / f"case{i}") for i in range(len(configs))]
    outcomes: dict[int, dict[str, Any]] = {}
    if jobs == 0:
        for i, (config, out_dir) in enumerate(zip(configs, out_dirs, strict=True)):
            outcomes[i] = run_case(config, clients, out_dir, plots=False)
            finished(i, outcomes[i])
        return [outcomes[i] for i in range(len(configs))]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = {
            pool.submit(run_case, config, clients, out_dir): i
            for i, (config, out_dir) in enumerate(zip(configs, out_dirs, strict=True))
        }
        for future in as_completed(futures):
            outcomes[futures[future]] = future.result()
            finished(futures[future], outcomes[futures[future]])
    return [outcomes[i] for i in range(len(configs))]


def partial_saver(
    path: Path, todo: list[dict[str, Any]], measured: dict[str, Any], clients: int
) -> Callable[[int, dict[str, Any]], None]:
    """Save every finished run to ``path`` (a result file ``--merge`` takes) as it ends,
    so that a run stopped part way loses only the cases still running."""
    done: list[dict[str, Any]] = []

    def save(i: int, outcome: dict[str, Any]) -> None:
        done.append({**todo[i], **outcome})
        document = {"quick": False, "clients": clients, "settings": measured, "cases": done}
        path.write_text(json.dumps(document, indent=1))

    return save


def model_accuracy(model: dict[str, Any]) -> float | None:
    """A model's accuracy on the global test set, or (a run without one) on its eligible
    clients' pooled test splits."""
    if model.get("global-test-accuracy") is not None:  # (the runner's in-memory keys)
        return model["global-test-accuracy"]
    return model["test"]["accuracy"] if model.get("test") else None


def accuracies(run: dict[str, Any], init: str, num_tiers: int) -> list[float | None]:
    """Per tier (1-based order), the test accuracy of the ``init`` model, if any."""
    by_tier = {m["tier"]: m for m in run["models"] if m["init"] == init}
    return [model_accuracy(by_tier[t]) if t in by_tier else None for t in range(1, num_tiers + 1)]


def measured_on(runs: list[dict[str, Any]]) -> str:
    """What the table's accuracies were measured on: ``global`` (the server's global test
    set), or ``clients`` (each model's eligible clients' pooled test splits)."""
    models = [m for run in runs for m in run.get("models", [])]
    if models and all(m.get("global-test-accuracy") is not None for m in models):
        return "global"
    return "clients"


def cell(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def gain_over_seeds(per_seed: list[list[float | None]]) -> list[float | None]:
    """Per tier, the gain averaged over the seeds that have one (a seed draws its own
    split, tiers and test clients, so each is also a fresh test set)."""
    return [mean(list(tier)) for tier in zip(*per_seed, strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    parser.add_argument("--clients", type=int, default=None, help="default: 40 (quick: 8)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="cases run at once, each in a fresh process (default 2); 0: one after the other "
        "in this process, without the figures of each run (--quick's default: a process's "
        "imports cost as much CPU as a quick case)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[0],
        help="run-config seeds (data split, tiers, sampling, initialisation): the main runs "
        "at each, the comparisons at the first (default: 0)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=[],
        choices=sorted({c["name"] for c in CASES}),
        help="run only these cases (default: all)",
    )
    parser.add_argument(
        "--rand-init-lr",
        type=float,
        default=None,
        help="lr of rand-init (run-config fedoras.rand-init-lr; default: the fine-tuning lr, "
        "0.05; the paper trains from scratch at 0.1, 10x its fine-tuning lr)",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=[],
        help="result files of earlier runs of this benchmark (same settings and clients): "
        "their cases are taken, not run again",
    )
    args = parser.parse_args(argv)
    clients = args.clients or (8 if args.quick else 40)
    jobs = args.jobs if args.jobs is not None else 0 if args.quick else 2
    started = time.perf_counter()
    runs = cases(args.seeds, args.only)
    measured = settings(args.quick)
    if args.rand_init_lr is not None:
        measured["fedoras.rand-init-lr"] = args.rand_init_lr
    done = merged_cases(args.merge, measured, clients)
    todo = [c for c in runs if case_key(c) not in done]
    with tempfile.TemporaryDirectory() as tmp:
        base = run_config({**measured, "data.cache-dir": str(Path(tmp) / "cache")})
        configs = [
            {**base, "seed": c["seed"], "data.alpha": c["alpha"], **c["overrides"]} for c in todo
        ]
        result_name = results_name(args.seeds, args.only) + (
            "" if args.rand_init_lr is None else f".rand-init-lr-{args.rand_init_lr}"
        )
        partial = RESULTS / f"{result_name}{'.quick' if args.quick else ''}.partial.json"
        save = partial_saver(partial, todo, measured, clients)
        outcomes = run_cases(configs, clients, Path(tmp), jobs, save)
    for case, outcome in zip(todo, outcomes, strict=True):
        case.update(outcome)
    runs = [done.get(case_key(c), c) for c in runs]

    num_tiers = base["fedoras.num-tiers"]
    rows: list[tuple[str, str, list[float | None], str]] = []
    gains: dict[float, list[list[float | None]]] = {}  # alpha -> per seed, per tier
    seeds_of: dict[float, list[int]] = {}  # alpha -> the seed of each entry of gains
    for run in (c for c in runs if c["name"] == "opa"):
        alpha = run["alpha"]
        at = f" (seed {run['seed']})" if len(args.seeds) > 1 else ""
        fedoras = accuracies(run, "supernet", num_tiers)
        rand = accuracies(run, "random", num_tiers)
        gain = [
            None if f is None or r is None else 100 * (f - r)
            for f, r in zip(fedoras, rand, strict=True)
        ]
        gains.setdefault(alpha, []).append(gain)
        seeds_of.setdefault(alpha, []).append(run["seed"])
        down = f"{run['stage1-bytes-down-per-message'] / 1e6:.3f}"
        flops = [
            next((m["flops"] / 1e6 for m in run["models"] if m["tier"] == t), None)
            for t in range(1, num_tiers + 1)
        ]
        rows += [
            (f"FedorAS (OPA, B=1/2) MFLOPs of the chosen path{at}", f"{alpha}", flops, "-"),
            (f"FedorAS (OPA, B=1/2){at}", f"{alpha}", fedoras, down),
            (
                f"rand-init, same architectures ({base['fedoras.rand-init-rounds']} rounds, "
                f"lr {base['fedoras.rand-init-lr'] or base['fedoras.finetune-lr']}){at}",
                f"{alpha}",
                rand,
                "-",
            ),
            (f"gain FedorAS - rand-init (pp){at}", f"{alpha}", gain, "-"),
        ]
    mean_gain = {alpha: gain_over_seeds(per_seed) for alpha, per_seed in gains.items()}
    if len(args.seeds) > 1:
        rows += [
            (f"gain, mean over seeds {', '.join(map(str, args.seeds))} (pp)", f"{a}", g, "-")
            for a, g in mean_gain.items()
        ]
    labels = {
        "fedavg": "FedAvg of supernets (B=1/2)",
        "budget-1": "OPA, B = whole supernet",
        "budget-1/4": "OPA, B = 1/4",
        "tier-unaware": "tier-unaware (every client in the top tier; tested on all clients)",
    }
    for run in runs:
        if run["name"] in labels:
            down = f"{run['stage1-bytes-down-per-message'] / 1e6:.3f}"
            at = f" (seed {run['seed']})" if len(args.seeds) > 1 else ""
            rows.append(
                (
                    labels[run["name"]] + at,
                    f"{run['alpha']}",
                    accuracies(run, "supernet", num_tiers),
                    down,
                )
            )
            if run["name"] == "tier-unaware":
                rows.append(
                    (
                        "tier-unaware rand-init: FedAvg from scratch on all clients (paper "
                        f"Fig. 3){at}",
                        f"{run['alpha']}",
                        accuracies(run, "random", num_tiers),
                        "-",
                    )
                )

    tiers = " | ".join(f"T{t}" for t in range(1, num_tiers + 1))
    on = "the global test set" if measured_on(runs) == "global" else "the clients' test splits"
    print(f"FedorAS on MNIST-5k, {clients} clients, {num_tiers} tiers (test accuracy on {on}):\n")
    print(f"| setting | alpha | {tiers} | mean | Stage-1 MB down per client |")
    print("| --- | --- | " + "--- | " * num_tiers + "--- | --- |")
    for name, alpha, values, down in rows:
        digits = 2 if "pp" in name or "MFLOPs" in name else 4
        cells = " | ".join(cell(v, digits) for v in values)
        print(f"| {name} | {alpha} | {cells} | {cell(mean(values), digits)} | {down} |")
    print()
    if len(args.seeds) > 1 and gains:  # (none with --only tier-unaware)
        print("Gain FedorAS - rand-init (pp), per seed and averaged over the seeds:\n")
        print(f"| alpha | seed | {tiers} | mean |")
        print("| --- | --- | " + "--- | " * num_tiers + "--- |")
        for alpha, per_seed in gains.items():
            for seed, gain in zip(seeds_of[alpha], per_seed, strict=True):
                cells = " | ".join(cell(v, 2) for v in gain)
                print(f"| {alpha} | {seed} | {cells} | {cell(mean(gain), 2)} |")
            cells = " | ".join(f"**{cell(v, 2)}**" for v in mean_gain[alpha])
            print(f"| {alpha} | mean | {cells} | **{cell(mean(mean_gain[alpha]), 2)}** |")
        print()

    def first(name: str, alpha: float) -> dict[str, Any] | None:
        return next((c for c in runs if c["name"] == name and c["alpha"] == alpha), None)

    def mean_acc(run: dict[str, Any] | None, init: str = "supernet") -> float:
        value = None if run is None else mean(accuracies(run, init, num_tiers))
        return float("nan") if value is None else value

    skew = [g for g in mean_gain.get(SKEWED, []) if g is not None]
    mild = [g for g in mean_gain.get(MILD, []) if g is not None]
    summary: dict[str, Any] = {
        "seeds": "-".join(map(str, args.seeds)),
        "min_gain_pp_alpha0.1": min(skew) if skew else float("nan"),
        "mean_gain_pp_alpha0.1": statistics.fmean(skew) if skew else float("nan"),
        "min_gain_pp_alpha1.0": min(mild) if mild else float("nan"),
        "mean_gain_pp_alpha1.0": statistics.fmean(mild) if mild else float("nan"),
        "fedavg_mean_acc": mean_acc(first("fedavg", SKEWED)),
        "opa_mean_acc": mean_acc(first("opa", SKEWED)),
        "tier_unaware_mean_acc": mean_acc(first("tier-unaware", SKEWED)),
        "tier_unaware_rand_init_mean_acc": mean_acc(first("tier-unaware", SKEWED), "random"),
        "clients": clients,
        "test_set": measured_on(runs),
    }
    for alpha, per_seed in gains.items():  # (seed, tier) cells where FedorAS >= rand-init
        cells = [g for gain in per_seed for g in gain if g is not None]
        summary[f"cells_level_or_above_alpha{alpha}"] = f"{sum(g >= 0 for g in cells)}/{len(cells)}"
    summary["goal_met"] = bool(
        skew
        and mild
        and min(skew + mild) >= 0
        and summary["mean_gain_pp_alpha0.1"] > summary["mean_gain_pp_alpha1.0"]
    )
    summary["seconds"] = round(time.perf_counter() - started, 1)
    report(
        result_name, args.quick, summary, {"clients": clients, "settings": measured, "cases": runs}
    )
    partial.unlink(missing_ok=True)  # every case is in the result file now
    return 0


if __name__ == "__main__":
    sys.exit(main())
