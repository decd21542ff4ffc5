"""FedorAS against FjORD and HeteroFL at matched per-tier MACs and client compute.

FedorAS's Table 5 / Fig. 3 at this machine's scale (issue 29). For each seed and alpha:

1. **FedorAS** runs as in ``fedoras_tiers.py`` (MNIST-5k, 40 clients, Dirichlet alpha,
   4 tiers, ``cnn_s`` width 0.5, Stage 1 + NSGA-II per tier + fine-tuning; no rand-init):
   it deals the clients to tiers and sets each tier's MACs range.
2. **HeteroFL and FjORD** then run on the same data split, the same global test set and
   the same clients in the same tiers (each node's ``tier`` in its node config, taken
   from FedorAS's ``tier-of-partition``). Their fixed network, the width-sliceable ConvNet
   (docs/baselines.md), is served to each tier at the largest width (a multiple of 1/64)
   whose MACs fit the tier's MACs ceiling, so a tier's budget means the same MACs whichever
   method serves it. FjORD's ladder is those four widths.
3. **Matched client compute**: a baseline first runs ``PROBE_ROUNDS`` rounds to measure its
   clients' training FLOPs per round (the ledger's), then runs
   ``round(FedorAS's client FLOPs / per-round FLOPs)`` rounds, so that its clients spend
   what FedorAS's spent in Stage 1 and fine-tuning together (the achieved ratio is printed
   and saved).

Accuracy = each tier's model on the global test set held by the server (the paper's
protocol). Cases (seed, alpha) run two at a time in fresh processes with one torch thread
each; every finished case is saved at once to ``baselines.partial.json``
(``--merge`` it to go on after a stop).

    python benchmarks/baselines.py                  # seeds 0 1 2, alpha 0.1 and 1.0
    python benchmarks/baselines.py --quick          # CI smoke run (8 clients, 1 seed)
    python benchmarks/baselines.py --merge benchmarks/results/baselines.partial.json
    python benchmarks/baselines.py --stage1-epochs 10   # FedorAS's Stage 1 at the paper's
                                    # 10 local epochs and 30 rounds (same local steps)
    python benchmarks/baselines.py --baseline-rounds 30   # the paper's rule: the baselines
                                    # get FedorAS's Stage-1 rounds, FedorAS from baselines.json
    python benchmarks/baselines.py --baseline-head flatten-scaled   # the baselines with the
                                    # ConvNet's scaled head, FedorAS from baselines.json
    python benchmarks/baselines.py --seeds 0 --stage1-epochs 10 --finetune-rounds 120 \
        --cases-from benchmarks/results/baselines.flatten-seed-0.json   # FedorAS alone, its
                                    # Stage 3 at 120 rounds; the baselines copied

Prints one table per tier and ``headline: ...``; writes ``benchmarks/results/baselines.json``
(``.quick.json``) with ``headline`` keys ``fedoras_minus_fjord_pp`` and
``fedoras_minus_heterofl_pp`` (mean over tiers, seeds and alphas), per-tier keys and
``seeds``. FedorAS's Stage 1 runs at `STAGE1_EPOCHS` (2) local epochs and 150 rounds;
``--stage1-epochs E`` is the ablation behind the disagreement with the paper
(benchmarks/README.md): Stage 1 at ``E`` local epochs and ``300 / E`` rounds, so its client
compute stays put, written to ``baselines.stage1-epochs-<E>.json`` (10: the paper's ratio
of Stage-1 to fine-tuning work, this benchmark's default before 2026-12-05);
``--baseline-rounds N`` reruns only the baselines, at N rounds each, on the cases (tiers,
clients, FedorAS's models) of ``--cases-from`` (default ``results/baselines.json``), written
to ``baselines.rounds-<N>.json``; ``--baseline-head flatten-scaled`` reruns them at the
cases' own rounds with the ConvNet's scaled head (``<method>.head``, issue 40), written to
``baselines.head-flatten-scaled.json``. ``--finetune-rounds N`` is its mirror: FedorAS alone,
with N fine-tuning rounds per tier (Stage 1 and the search as in the cases, so the same seed
finds the same models), the baselines copied from ``--cases-from``; written to
``baselines.finetune-rounds-<N>.json``. FedorAS then spends more client compute than the
baselines (the printed ``client_flops_ratio`` says how much): it asks whether Stage 3's
budget is where FedorAS loses its points. With ``--stage1-rounds R`` too, Stage 1 runs R
rounds (``baselines.stage1-rounds-<R>.finetune-rounds-<N>.json``): another split of
FedorAS's client compute between the stages (the printed ratio says whether the total
moved; fine-tuning's 30 rounds are about half of it, benchmarks/README.md).
``--rand-init`` is the control that splits what is left: FedorAS alone on the cases of
``--cases-from`` (its supernet-init nets as there, to the digit), each tier's searched net
also trained from scratch on the tier's eligible clients for as many rounds as the case's
FjORD ran, at the baselines' clients per round and local recipe (FedorAS's rand-init:
``finetune-lr`` with its cosine decay); written to ``baselines.rand-init.json``. The net
from scratch against FjORD is what the space, the search and the tier rule cost; FedorAS
against it, what weight sharing and the stages' split of the compute cost. (The printed
FedorAS client FLOPs then include the rand-init runs.)

    python benchmarks/baselines.py --seeds 0 1 2 --alphas 0.1 --rand-init
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
from fedoras_tiers import file_defaults as fedoras_file_defaults
from fedoras_tiers import settings as fedoras_settings

ALPHAS = (0.1, 1.0)
BASELINES = ("heterofl", "fjord")
PROBE_ROUNDS = 2
#: widths tried for a tier: multiples of 1/64 (the ConvNet's channels are round(p x c))
WIDTH_STEPS = 64


#: FedorAS's Stage 1 in the full run: at the baselines' (and pyproject's) 2 local epochs, 5x
#: ``fedoras_tiers.py``'s 30 rounds of 10 epochs (the same local steps). With 10 epochs
#: (``--stage1-epochs 10``, the paper's ratio of Stage-1 to fine-tuning work) client drift
#: at alpha 0.1 left the supernet's paths at 0.58-0.74 on the server slice and FedorAS 9.7 pp
#: below FjORD (3 seeds); benchmarks/README.md has both.
STAGE1_EPOCHS = 2


def settings(quick: bool, stage1_epochs: int | None = None) -> dict[str, Any]:
    """The run config of every run: FedorAS's as in ``fedoras_tiers.py`` without rand-init,
    plus the baselines' local recipe (FedorAS's fine-tuning one: 2 epochs, lr 0.05).
    ``stage1_epochs``: Stage 1 at that many local epochs and proportionally more rounds
    (the same number of local steps in all); the full run's default `STAGE1_EPOCHS`, the
    quick run's ``fedoras_tiers.py``'s."""
    # fedoras_tiers' settings name the space's head and reduction and Stage 1's lr probe
    # (off: every recorded case trained at lr as given), which decide FedorAS's figures
    shared = {**fedoras_settings(quick), "fedoras.compare-rand-init": False}
    if stage1_epochs is None and not quick:
        stage1_epochs = STAGE1_EPOCHS
    if stage1_epochs is not None:
        steps = shared["fedoras.rounds"] * shared["fedoras.local-epochs"]
        if stage1_epochs < 1 or steps % stage1_epochs:
            raise SystemExit(
                f"--stage1-epochs {stage1_epochs}: must be a positive divisor of {steps} "
                "(Stage 1's rounds x local epochs)"
            )
        shared["fedoras.rounds"] = steps // stage1_epochs
        shared["fedoras.local-epochs"] = stage1_epochs
    recipe = {
        "clients-per-round": 2 if quick else 10,
        "local-epochs": 1 if quick else 2,
        "batch-size": 128 if quick else 32,
        "lr": 0.05,
    }
    for method in BASELINES:
        shared.update({f"{method}.{key}": value for key, value in recipe.items()})
        # the recipe's lr as given, as FedorAS's fine-tuning gets it (no lr probe), and the
        # paper's flatten head (--baseline-head: the scaled one)
        shared[f"{method}.lr-probe"] = False
        shared[f"{method}.head"] = "flatten"
    return shared


def stage1_suffix(quick: bool, stage1_epochs: int | None) -> str:
    """The result file's name part for a Stage 1 other than the run's default."""
    default = None if quick else STAGE1_EPOCHS
    if stage1_epochs is None or stage1_epochs == default:
        return ""
    return f".stage1-epochs-{stage1_epochs}"


def tier_widths(image: dict[str, int], ceilings: list[float]) -> list[float]:
    """For each tier's MACs ceiling, the largest width k / 64 whose ConvNet fits it."""
    from fedorasflwr.search_spaces.widths import width_costs

    macs = {k: width_costs(image, k / WIDTH_STEPS)["macs"] for k in range(1, WIDTH_STEPS + 1)}
    widths = []
    for ceiling in ceilings:
        fitting = [k for k, m in macs.items() if m <= ceiling]
        if not fitting:
            raise SystemExit(f"no ConvNet width fits a tier of {ceiling:.0f} MACs")
        widths.append(max(fitting) / WIDTH_STEPS)
    return widths


def client_flops(document: dict[str, Any]) -> int:
    from fedorasflwr.compare.leaderboard import client_flops as total

    return total(document)


def run_case(config: dict[str, Any], clients: int, out_dir: str) -> dict[str, Any]:
    """FedorAS, then HeteroFL and FjORD matched to it, for one (seed, alpha)."""
    import torch

    torch.set_num_threads(1)
    from fedorasflwr.client_app import app
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.inprocess import InProcessGrid
    from fedorasflwr.methods.fedoras.runner import run_fedoras
    from fedorasflwr.methods.widths.runner import image_spec
    from fedorasflwr.progress import setup_logging

    setup_logging(False)
    started = time.perf_counter()
    out = Path(out_dir)
    (out / "fedoras").mkdir(parents=True, exist_ok=True)
    settings_now = parse_run_config(config)
    fedoras = run_fedoras(InProcessGrid(app, config, clients), settings_now, out / "fedoras")
    tiers = fedoras["tiers"]
    ceilings = [float(t["high-macs"]) for t in tiers]
    budget = client_flops(fedoras)
    case: dict[str, Any] = {
        "tiers": tiers,
        "widths": tier_widths(image_spec(settings_now), ceilings),
        "tier-of-partition": fedoras["tier-of-partition"],
        "fedoras": {
            "models": [m for m in fedoras["models"] if m["init"] == "supernet"],
            "client-flops": budget,
        },
    }
    case.update(run_width_baselines(config, clients, out, case, budget=budget))
    case["seconds"] = round(time.perf_counter() - started, 1)
    return case


def run_width_baselines(
    config: dict[str, Any],
    clients: int,
    out: Path,
    case: dict[str, Any],
    *,
    budget: float | None = None,
    rounds: int | None = None,
) -> dict[str, Any]:
    """HeteroFL and FjORD on ``case``'s widths and tier-of-partition, each for ``rounds``
    rounds (0: as many as it ran in ``case``) or, given ``budget`` (client FLOPs), as many
    as a ``PROBE_ROUNDS`` probe says spend it."""
    from fedorasflwr.client_app import app
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.inprocess import InProcessGrid
    from fedorasflwr.methods.widths.runner import run_fjord, run_heterofl

    if (budget is None) == (rounds is None):
        raise ValueError("run_width_baselines: give a client-FLOPs budget or a number of rounds")
    listed = ",".join(str(w) for w in case["widths"])
    node_configs = {int(p): {"tier": int(t)} for p, t in case["tier-of-partition"].items()}
    runners = {"heterofl": run_heterofl, "fjord": run_fjord}
    served: dict[str, Any] = {}
    for method in BASELINES:
        own = {"method": method, f"{method}.widths": listed}
        if method == "fjord":
            own["fjord.tier-widths"] = listed
        if rounds is None:
            probe_config = {**config, **own, f"{method}.rounds": PROBE_ROUNDS}
            (out / f"{method}-probe").mkdir(parents=True, exist_ok=True)
            probe = runners[method](
                InProcessGrid(app, probe_config, clients, node_configs=node_configs),
                parse_run_config(probe_config),
                out / f"{method}-probe",
            )
            per_round = client_flops(probe) / PROBE_ROUNDS
            assert budget is not None  # checked above; for the type checker
            method_rounds = max(1, round(budget / per_round)) if per_round > 0 else PROBE_ROUNDS
        else:
            method_rounds = rounds or int(case[method]["rounds"])
        full = {**config, **own, f"{method}.rounds": method_rounds}
        (out / method).mkdir(parents=True, exist_ok=True)
        document = runners[method](
            InProcessGrid(app, full, clients, node_configs=node_configs),
            parse_run_config(full),
            out / method,
        )
        served[method] = {
            "tiers": document["tiers"],
            "rounds": method_rounds,
            "client-flops": client_flops(document),
        }
    return served


def run_baselines_only(
    config: dict[str, Any], clients: int, out_dir: str, case: dict[str, Any], rounds: int
) -> dict[str, Any]:
    """``--baseline-rounds`` (``--baseline-head``: ``rounds`` 0, each baseline's rounds in
    ``case``): the baselines alone at ``rounds`` rounds on an earlier case's tiers and
    clients; FedorAS's models are copied from that case (same seed, same split)."""
    import torch

    torch.set_num_threads(1)
    from fedorasflwr.progress import setup_logging

    setup_logging(False)
    started = time.perf_counter()
    kept = ("tiers", "widths", "tier-of-partition", "fedoras")
    redone = {key: case[key] for key in kept}
    redone.update(run_width_baselines(config, clients, Path(out_dir), case, rounds=rounds))
    redone["seconds"] = round(time.perf_counter() - started, 1)
    return redone


def run_fedoras_only(
    config: dict[str, Any], clients: int, out_dir: str, case: dict[str, Any]
) -> dict[str, Any]:
    """``--finetune-rounds``: FedorAS alone as ``config`` says, on an earlier case's seed and
    alpha; the baselines are copied from that case. Its tiers and clients must come out as
    the case's (same seed, same split), or the copied baselines would answer another
    question."""
    import torch

    torch.set_num_threads(1)
    from fedorasflwr.client_app import app
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.inprocess import InProcessGrid
    from fedorasflwr.methods.fedoras.runner import run_fedoras
    from fedorasflwr.progress import setup_logging

    setup_logging(False)
    started = time.perf_counter()
    out = Path(out_dir)
    (out / "fedoras").mkdir(parents=True, exist_ok=True)
    fedoras = run_fedoras(
        InProcessGrid(app, config, clients), parse_run_config(config), out / "fedoras"
    )
    tier_of = {str(p): t for p, t in fedoras["tier-of-partition"].items()}
    if tier_of != {str(p): t for p, t in case["tier-of-partition"].items()}:
        raise RuntimeError("FedorAS dealt the clients to other tiers than --cases-from's case")
    redone = {key: case[key] for key in ("tiers", "widths", "tier-of-partition", *BASELINES)}
    redone["fedoras"] = {
        "models": [m for m in fedoras["models"] if m["init"] == "supernet"],
        "client-flops": client_flops(fedoras),
        # --rand-init: each tier's searched net trained from scratch, beside
        "rand-init": [m for m in fedoras["models"] if m["init"] == "random"],
        "copied-from-case": {
            "client-flops": case["fedoras"]["client-flops"],
            "global-test-accuracy": {
                str(m["tier"]): m.get("global-test-accuracy") for m in case["fedoras"]["models"]
            },
        },
    }
    redone["seconds"] = round(time.perf_counter() - started, 1)
    return redone


def fedoras_accuracy(case: dict[str, Any], tier: int, models: str = "models") -> float | None:
    """FedorAS's tier ``tier`` (1-based) model on the global test set; ``models="rand-init"``:
    its net trained from scratch (``--rand-init``; None when the case has no such run)."""
    for model in case["fedoras"].get(models, []):
        if model["tier"] == tier:
            return model.get("global-test-accuracy")
    return None


def rand_init_accuracy(case: dict[str, Any], tier: int) -> float | None:
    return fedoras_accuracy(case, tier, "rand-init")


def baseline_accuracy(case: dict[str, Any], method: str, tier: int) -> float | None:
    for entry in case[method]["tiers"]:
        if entry["tier"] == tier:
            return entry.get("global_test_accuracy")
    return None


def baseline_macs(case: dict[str, Any], method: str, tier: int) -> int | None:
    for entry in case[method]["tiers"]:
        if entry["tier"] == tier:
            return entry["macs"]
    return None


def mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarise(cases: list[dict[str, Any]], num_tiers: int) -> tuple[dict[str, Any], list[str]]:
    """The headline and the printed tables (one per tier, a row per method, the
    mean over the cases with the spread)."""
    lines: list[str] = []
    summary: dict[str, Any] = {}
    gaps: dict[str, list[float]] = {method: [] for method in BASELINES}
    scratch_gaps: dict[str, list[float]] = {
        "randinit_minus_fjord": [],
        "fedoras_minus_randinit": [],
    }
    for tier in range(1, num_tiers + 1):
        lines.append(f"\nTier {tier} (global test accuracy, mean over seeds and alphas)\n")
        lines.append("| method | alpha | accuracy (mean +- sd) | MMACs | client GFLOPs | rounds |")
        lines.append("| --- | --- | --- | --- | --- | --- |")
        for alpha in sorted({c["alpha"] for c in cases}):
            at = [c for c in cases if c["alpha"] == alpha]
            fed = [a for c in at if (a := fedoras_accuracy(c, tier)) is not None]
            fed_macs = [m["macs"] for c in at for m in c["fedoras"]["models"] if m["tier"] == tier]
            lines.append(
                f"| FedorAS | {alpha} | {_spread(fed)} | {_mega(fed_macs)} | "
                f"{_giga([c['fedoras']['client-flops'] for c in at])} | - |"
            )
            earlier = [e for c in at if (e := c["fedoras"].get("copied-from-case"))]
            if earlier:  # --finetune-rounds: FedorAS as --cases-from had it, beside
                accs = [a for e in earlier if (a := e["global-test-accuracy"].get(str(tier)))]
                lines.append(
                    f"| FedorAS (--cases-from) | {alpha} | {_spread(accs)} | {_mega(fed_macs)} | "
                    f"{_giga([e['client-flops'] for e in earlier])} | - |"
                )
            scratch = [a for c in at if (a := rand_init_accuracy(c, tier)) is not None]
            if scratch:  # --rand-init: the same nets from scratch, at FjORD's rounds
                lines.append(
                    f"| FedorAS's net, rand-init | {alpha} | {_spread(scratch)} | "
                    f"{_mega(fed_macs)} | - | "
                    f"{'/'.join(str(c['fjord']['rounds']) for c in at)} |"
                )
            for method in BASELINES:
                accs = [a for c in at if (a := baseline_accuracy(c, method, tier)) is not None]
                macs = [m for c in at if (m := baseline_macs(c, method, tier)) is not None]
                lines.append(
                    f"| {method} | {alpha} | {_spread(accs)} | {_mega(macs)} | "
                    f"{_giga([c[method]['client-flops'] for c in at])} | "
                    f"{'/'.join(str(c[method]['rounds']) for c in at)} |"
                )
        for method in BASELINES:
            tier_gaps = [
                100 * (f - b)
                for c in cases
                if (f := fedoras_accuracy(c, tier)) is not None
                and (b := baseline_accuracy(c, method, tier)) is not None
            ]
            summary[f"t{tier}_fedoras_minus_{method}_pp"] = mean(tier_gaps)
            gaps[method].extend(tier_gaps)
        pairs = [
            (f, r, b)
            for c in cases
            if (f := fedoras_accuracy(c, tier)) is not None
            and (r := rand_init_accuracy(c, tier)) is not None
            and (b := baseline_accuracy(c, "fjord", tier)) is not None
        ]
        if pairs:
            summary[f"t{tier}_randinit_minus_fjord_pp"] = mean([100 * (r - b) for _, r, b in pairs])
            summary[f"t{tier}_fedoras_minus_randinit_pp"] = mean(
                [100 * (f - r) for f, r, _ in pairs]
            )
            scratch_gaps["randinit_minus_fjord"].extend(100 * (r - b) for _, r, b in pairs)
            scratch_gaps["fedoras_minus_randinit"].extend(100 * (f - r) for f, r, _ in pairs)
    for method in BASELINES:
        summary[f"fedoras_minus_{method}_pp"] = mean(gaps[method])
    for key, values in scratch_gaps.items():
        if values:
            summary[f"{key}_pp"] = mean(values)
    ratios = [c[m]["client-flops"] / c["fedoras"]["client-flops"] for c in cases for m in BASELINES]
    summary["client_flops_ratio_min"] = min(ratios) if ratios else None
    summary["client_flops_ratio_max"] = max(ratios) if ratios else None
    return summary, lines


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.4f} +- {sd:.4f} (n={len(values)})"


def _mega(values: list[float]) -> str:
    return f"{statistics.fmean(values) / 1e6:.3f}" if values else "-"


def _giga(values: list[float]) -> str:
    return f"{statistics.fmean(values) / 1e9:.1f}" if values else "-"


def merged(paths: list[Path], measured: dict[str, Any], clients: int) -> dict[tuple, dict]:
    """Finished cases of earlier result files, by (seed, alpha); other settings: an error."""
    done: dict[tuple, dict] = {}
    for path in paths:
        document = json.loads(path.read_text())
        # A file from before the head option was measured with the paper's GAP head; one
        # from before the reduction option with the paper's reduction. One from before the
        # lr probes trained the baselines and FedorAS's Stage 1 at lr as given.
        saved = {
            **fedoras_file_defaults(),
            **{f"{method}.lr-probe": False for method in BASELINES},
            **{f"{method}.head": "flatten" for method in BASELINES},
            **document.get("settings", {}),
        }
        if saved != measured or document.get("clients") != clients:
            raise SystemExit(f"{path}: measured with other settings or clients")
        for case in document["cases"]:
            done[(case["seed"], case["alpha"])] = case
    return done


def saver(path: Path, measured: dict[str, Any], clients: int) -> Callable[[dict], None]:
    done: list[dict[str, Any]] = []

    def save(case: dict[str, Any]) -> None:
        done.append(case)
        path.write_text(
            json.dumps({"clients": clients, "settings": measured, "cases": done}, indent=1)
        )

    return save


def main(argv: list[str] | None = None) -> int:
    from fedorasflwr.search_spaces.prunable_nets import CONVNET_HEADS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    parser.add_argument("--clients", type=int, default=None, help="default: 40 (quick: 8)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0 1 2")
    parser.add_argument("--jobs", type=int, default=None, help="cases at once (default 2)")
    parser.add_argument("--merge", type=Path, nargs="+", default=[], help="earlier results")
    parser.add_argument(
        "--alphas", type=float, nargs="+", default=None, help="default: 0.1 1.0 (quick: 0.1)"
    )
    parser.add_argument(
        "--stage1-epochs",
        type=int,
        default=None,
        help=f"FedorAS's Stage 1 at E local epochs and 300/E rounds (default {STAGE1_EPOCHS}; "
        "10: the paper's ratio, fedoras_tiers.py's)",
    )
    parser.add_argument(
        "--baseline-rounds",
        type=int,
        default=None,
        help="the baselines alone at N rounds on the cases of --cases-from (FedorAS copied)",
    )
    parser.add_argument(
        "--baseline-head",
        choices=CONVNET_HEADS[1:],
        default=None,
        help="the baselines alone with this ConvNet head (<method>.head) on the cases of "
        "--cases-from, each at that case's rounds (FedorAS copied)",
    )
    parser.add_argument(
        "--finetune-rounds",
        type=int,
        default=None,
        help="ablation: FedorAS alone with N fine-tuning rounds on the cases of --cases-from "
        "(baselines copied)",
    )
    parser.add_argument(
        "--stage1-rounds",
        type=int,
        default=None,
        help="with --finetune-rounds: FedorAS's Stage 1 at N rounds too (a split of its "
        "client compute between Stage 1 and fine-tuning)",
    )
    parser.add_argument(
        "--rand-init",
        action="store_true",
        help="control: FedorAS alone on the cases of --cases-from, each tier's searched net "
        "also trained from scratch for as many rounds as the case's FjORD (baselines copied)",
    )
    parser.add_argument(
        "--cases-from",
        type=Path,
        default=RESULTS / "baselines.json",
        help="with --baseline-rounds (--finetune-rounds): the run whose tiers, clients and "
        "FedorAS models (baselines) to use",
    )
    args = parser.parse_args(argv)
    clients = args.clients or (8 if args.quick else 40)
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    alphas = args.alphas or (ALPHAS[:1] if args.quick else ALPHAS)
    jobs = args.jobs if args.jobs is not None else (1 if args.quick else 2)
    measured = settings(args.quick, args.stage1_epochs)
    name = "baselines" + stage1_suffix(args.quick, args.stage1_epochs)
    identity = dict(measured)  # what a saved file was measured with (checked by --merge)
    earlier: dict[tuple, dict] = {}
    if args.rand_init and (args.baseline_rounds is not None or args.finetune_rounds is not None):
        raise SystemExit("--rand-init: not with --baseline-rounds or --finetune-rounds")
    if args.stage1_rounds is not None and args.stage1_rounds < 1:
        raise SystemExit(f"--stage1-rounds {args.stage1_rounds}: must be at least 1")
    if args.baseline_rounds is not None and args.finetune_rounds is not None:
        raise SystemExit("--baseline-rounds and --finetune-rounds: give one of them")
    if args.baseline_head is not None:
        if args.baseline_rounds is not None or args.finetune_rounds is not None:
            raise SystemExit("--baseline-head: not with --baseline-rounds or --finetune-rounds")
        earlier = merged([args.cases_from], measured, clients)
        name += f".head-{args.baseline_head}"
        measured = {**measured, **{f"{m}.head": args.baseline_head for m in BASELINES}}
        identity = dict(measured)
    if args.baseline_rounds is not None:
        if args.baseline_rounds < 1:
            raise SystemExit(f"--baseline-rounds {args.baseline_rounds}: must be at least 1")
        earlier = merged([args.cases_from], measured, clients)
        name += f".rounds-{args.baseline_rounds}"
        identity["baseline-rounds"] = args.baseline_rounds
    if args.finetune_rounds is not None:
        if args.finetune_rounds < 1:
            raise SystemExit(f"--finetune-rounds {args.finetune_rounds}: must be at least 1")
        earlier = merged([args.cases_from], measured, clients)
        if args.stage1_rounds is not None:
            name += f".stage1-rounds-{args.stage1_rounds}"
            measured = {**measured, "fedoras.rounds": args.stage1_rounds}
        name += f".finetune-rounds-{args.finetune_rounds}"
        measured = {**measured, "fedoras.finetune-rounds": args.finetune_rounds}
        identity = dict(measured)
    elif args.stage1_rounds is not None:
        raise SystemExit("--stage1-rounds: only with --finetune-rounds")
    if args.rand_init:
        earlier = merged([args.cases_from], measured, clients)
        name += ".rand-init"
        per_round = measured["fjord.clients-per-round"]  # the rounds are FjORD's too
        measured = {
            **measured,
            "fedoras.compare-rand-init": True,
            "fedoras.rand-init-clients-per-round": per_round,
        }
        # each case's rounds are its FjORD's (set below): the file's identity says so
        identity = {**measured, "fedoras.rand-init-rounds": "fjord"}
    baselines_only = args.baseline_rounds is not None or args.baseline_head is not None
    copying = args.rand_init or baselines_only or args.finetune_rounds is not None
    started = time.perf_counter()
    done = merged(args.merge, identity, clients)
    wanted = [(seed, alpha) for seed in seeds for alpha in alphas]
    todo = [key for key in wanted if key not in done]
    if missing := [key for key in todo if copying and key not in earlier]:
        raise SystemExit(f"--cases-from {args.cases_from}: no case for (seed, alpha) {missing}")
    partial = RESULTS / f"{name}{'.quick' if args.quick else ''}.partial.json"
    save = saver(partial, identity, clients)
    with tempfile.TemporaryDirectory() as tmp:
        base = run_config({**measured, "data.cache-dir": str(Path(tmp) / "cache")})
        configs = {
            key: {**base, "seed": key[0], "data.alpha": key[1], "method": "fedoras"} for key in todo
        }
        if args.rand_init:  # the searched nets from scratch for the case's FjORD rounds
            for key in todo:
                configs[key]["fedoras.rand-init-rounds"] = earlier[key]["fjord"]["rounds"]
        warm_data_cache(list(configs.values()), clients)
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=max(jobs, 1), mp_context=context) as pool:
            futures = {}
            for key in todo:
                where = str(Path(tmp) / f"{key[0]}-{key[1]}")
                if baselines_only:
                    future = pool.submit(
                        run_baselines_only,
                        configs[key],
                        clients,
                        where,
                        earlier[key],
                        args.baseline_rounds or 0,
                    )
                elif args.finetune_rounds is not None or args.rand_init:
                    future = pool.submit(
                        run_fedoras_only, configs[key], clients, where, earlier[key]
                    )
                else:
                    future = pool.submit(run_case, configs[key], clients, where)
                futures[future] = key
            for future in as_completed(futures):
                seed, alpha = futures[future]
                done[(seed, alpha)] = {"seed": seed, "alpha": alpha, **future.result()}
                save(done[(seed, alpha)])
    cases = [done[key] for key in wanted]
    summary, lines = summarise(cases, int(measured["fedoras.num-tiers"]))
    print("\n".join(lines))
    summary = {
        **summary,
        "seeds": "-".join(map(str, seeds)),
        "clients": clients,
        "seconds": round(time.perf_counter() - started, 1),
    }
    report(name, args.quick, summary, {"clients": clients, "settings": identity, "cases": cases})
    partial.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
