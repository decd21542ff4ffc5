"""Why FedorAS's supernet start can lose to a random one: the same searched path fine-tuned
from variants of the supernet's weights (issue 40, item 3).

At Dirichlet alpha 1.0 (``benchmarks/fedoras_tiers.py``, flatten head, seed 0) every tier's
model fine-tuned from the supernet scored below the same path trained from scratch with the
same recipe (0.927 against 0.960 over the tiers). This benchmark runs FedorAS with
``fedoras_tiers.py``'s settings and, for each tier's searched path, fine-tunes it with the
same recipe from these starts:

- ``supernet``: the path's weights cut from the supernet (FedorAS);
- ``random``: a fresh initialisation (rand-init, as ``fedoras_tiers.py``);
- ``rescaled``: the supernet's weights with every convolution that feeds a BatchNorm scaled
  to the norm of the fresh initialisation's same convolution (and the BatchNorm's running
  statistics with it). The net computes the same function (BatchNorm divides the scale out),
  but a gradient step of a given lr moves it as far as it moves a freshly initialised net:
  if this start fine-tunes as well as ``random`` or better, the supernet's start loses by
  the growth of its weights during Stage 1 (lr 0.1, momentum 0.9, no weight decay), which
  shrinks every later step;
- ``fresh-head``: the supernet's features with a freshly initialised classifier;
- ``cool-head``: ``rescaled``, and the classifier's weight and bias scaled so the weight has
  the fresh classifier's norm: the same predictions (argmax), at a fresh net's temperature;
- ``mix-0.5``: the mean of the supernet's and the fresh initialisation's weights (every
  weight and buffer; a partial reset: no ReLU stays dead);
- ``lr-2x``, ``lr-0.5x``, ``lr-0.2x``: the supernet start at twice, half or a fifth of the
  fine-tuning lr (a fifth: 0.01, the paper's fine-tuning lr against its rand-init's 0.1).

``--central-epochs N`` adds the centralised control: after the run, each tier's path is
trained on all clients' training data pooled (N epochs, batch 32, SGD at the fine-tuning lr,
momentum 0.9, constant lr) from the ``supernet``, ``random``, ``rescaled`` and ``mix-0.5``
starts, with each epoch's training loss, the share of the path's ReLU channels that are
dead at the start (zero on every one of 512 training digits) and the global-test accuracy
(BatchNorm re-estimated on the server slice): if the supernet start loses here too, the
cause is the supernet's weights, not the federation of the fine-tuning.

``--weight-decay`` sets ``fedoras.weight-decay`` (Stage 1 and every fine-tuning);
``--stage1-epochs E`` runs Stage 1 at E local epochs a round for 300 / E rounds (the same
local steps as the 30 rounds of 10 epochs).

Printed per tier and seed: global-test accuracy of each start, and the norms of the path's
convolutions and classifier relative to a fresh initialisation's (median and largest over
the convolutions; printed when ``rescaled`` is among the starts). One torch thread a run,
``--jobs`` runs at once in fresh processes.

    python benchmarks/finetune_start.py --alpha 1.0 --seeds 0 1 2
    python benchmarks/finetune_start.py --quick          # smoke run, about a minute
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from common import report, run_config, warm_data_cache
from fedoras_tiers import settings

LR_FACTORS = {"lr-2x": 2.0, "lr-0.5x": 0.5, "lr-0.2x": 0.2}
"""The starts that are the supernet start at another fine-tuning lr: the lr's factor."""

STARTS = ("supernet", "random", "rescaled", "fresh-head", "cool-head", "mix-0.5", *LR_FACTORS)
"""Every start a path can be fine-tuned from, in the printed order (``supernet`` and
``random`` always run: they are FedorAS and its rand-init comparison)."""

VARIANTS = STARTS[2:]
"""The starts this benchmark adds to FedorAS's two."""


def bn_convs(net: Any) -> list[tuple[str, Any]]:
    """``net``'s ``ops.ConvNormAct`` modules whose norm is a BatchNorm, with their names."""
    from torch import nn

    from fedorasflwr.search_spaces.ops import ConvNormAct

    return [
        (name, module)
        for name, module in net.named_modules()
        if isinstance(module, ConvNormAct) and isinstance(module.norm, nn.BatchNorm2d)
    ]


def conv_norms(subnet: Any, fresh: Any) -> tuple[list[float], float]:
    """Per convolution that feeds a BatchNorm (``ops.ConvNormAct``), the norm of its weight
    in ``subnet`` over that in ``fresh`` (same structure); and the classifier's ratio."""
    fresh_modules = dict(fresh.named_modules())
    ratios = [
        float(module.conv.weight.detach().norm() / fresh_modules[name].conv.weight.detach().norm())
        for name, module in bn_convs(subnet)
    ]
    head, fresh_head = classifier_of(subnet).weight, classifier_of(fresh).weight
    return ratios, float(head.detach().norm() / fresh_head.detach().norm())


def rescaled(subnet: Any, fresh: Any) -> None:
    """Scale, in place, every convolution of ``subnet`` that feeds a BatchNorm to the norm
    of ``fresh``'s same convolution, and that BatchNorm's running mean and variance with it,
    so that the net's function (train and eval mode, up to BatchNorm's eps) is unchanged."""
    import torch

    fresh_modules = dict(fresh.named_modules())
    with torch.no_grad():
        for name, module in bn_convs(subnet):
            scale = fresh_modules[name].conv.weight.norm() / module.conv.weight.norm()
            module.conv.weight.mul_(scale)
            module.norm.running_mean.mul_(scale)
            module.norm.running_var.mul_(scale**2)


def start_variants(finetune: Any, original: Any, diagnostics: list[dict[str, Any]]) -> Any:
    """A stand-in for ``finetune.initial_subnet`` that builds each start of
    :data:`VARIANTS` from the supernet start (:func:`transform`; every other init
    unchanged), recording each path's norm ratios in ``diagnostics`` once per tier (as its
    ``rescaled`` start is built)."""
    from flwr.app import ArrayRecord

    from fedorasflwr.seeding import seed_torch

    def initial(context, supernet, arch, init, tier, candidate=0):  # noqa: ANN001, ANN202
        if init not in VARIANTS:
            return original(context, supernet, arch, init, tier, candidate)
        start = original(context, supernet, arch, finetune.SUPERNET_INIT, tier, candidate)
        if init in LR_FACTORS:
            return start
        subnet = context.space.subnet(arch)
        subnet.load_state_dict(start.to_torch_state_dict())
        seed_torch(context.federation.seed, "rand-init", tier, candidate)  # rand-init's init
        fresh = context.space.fresh().subnet(arch)
        if init == "rescaled":
            ratios, head = conv_norms(subnet, fresh)
            diagnostics.append(
                {
                    "tier": tier + 1,
                    "conv_norm_ratio_median": statistics.median(ratios),
                    "conv_norm_ratio_max": max(ratios),
                    "conv_norm_ratio_min": min(ratios),
                    "classifier_norm_ratio": head,
                }
            )
        transform(init, subnet, fresh)
        return ArrayRecord(subnet.state_dict())

    return initial


def transform(start: str, subnet: Any, fresh: Any) -> None:
    """Make ``subnet`` (the supernet's path weights) the start ``start`` of
    :data:`VARIANTS`, in place; ``fresh``: rand-init's net of the same path."""
    import torch

    if start in ("rescaled", "cool-head"):
        rescaled(subnet, fresh)
    if start == "cool-head":
        _, head = conv_norms(subnet, fresh)
        classifier = classifier_of(subnet)
        with torch.no_grad():
            classifier.weight.div_(head)
            classifier.bias.div_(head)
    if start == "fresh-head":
        classifier_of(subnet).load_state_dict(classifier_of(fresh).state_dict())
    if start == "mix-0.5":
        mine, other = subnet.state_dict(), fresh.state_dict()
        subnet.load_state_dict(
            {k: (v + other[k]) / 2 if v.is_floating_point() else v for k, v in mine.items()}
        )


def classifier_of(net: Any) -> Any:
    """The net's last ``nn.Linear``: its classifier."""
    from torch import nn

    return [m for m in net.modules() if isinstance(m, nn.Linear)][-1]


CENTRAL_STARTS = ("supernet", "random", "rescaled", "mix-0.5")
"""The starts of the centralised control."""


def dead_share(net: Any, batch: Any) -> float:
    """The share of ``net``'s ReLU channels (outputs of ``ops.ConvNormAct`` with a ReLU)
    that are zero on every sample and position of ``batch``, in train mode (as a client
    trains)."""
    import torch
    from torch import nn

    from fedorasflwr.search_spaces.ops import ConvNormAct

    outputs: list[Any] = []
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: outputs.append(out))
        for m in net.modules()
        if isinstance(m, ConvNormAct) and isinstance(m.act, nn.ReLU)
    ]
    net.train()
    with torch.no_grad():
        net(batch)
    for hook in hooks:
        hook.remove()
    dead = [(out > 0).transpose(0, 1).flatten(1).any(1).logical_not() for out in outputs]
    return float(torch.cat(dead).float().mean())


def central_control(
    config: dict[str, Any], clients: int, out_dir: str, searches: list[dict[str, Any]], epochs: int
) -> list[dict[str, Any]]:
    """Each tier's path trained centrally from each of :data:`CENTRAL_STARTS` (module
    docstring): per tier and start, the epochs' training losses, the dead ReLU share at the
    start and the global-test accuracy."""
    import copy

    import torch
    from torch.utils.data import ConcatDataset

    from fedorasflwr.artifacts import load_checkpoint
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.data import load_client_data, load_global_test, load_server_data
    from fedorasflwr.runs import build_supernet
    from fedorasflwr.seeding import seed_torch, stream_words
    from fedorasflwr.training import evaluate, local_sgd, ordered_loader, refresh_batchnorm

    settings = parse_run_config(config)
    space = build_supernet(settings)
    space.load_state_dict(load_checkpoint(Path(out_dir) / "supernet.pt")["state_dict"])
    pooled = ConcatDataset(
        [load_client_data(settings.data, i, clients).train for i in range(clients)]
    )
    server, test = load_server_data(settings.data), load_global_test(settings.data)
    batch = torch.stack([pooled[i][0] for i in range(min(512, len(pooled)))])
    recipe = settings.method_settings.finetune
    sgd = {"lr": recipe.lr, "momentum": 0.9, "batch-size": 32, "local-epochs": 1}
    rows = []
    for search in searches:
        tier, arch = search["tier"] - 1, search["best"]
        seed_torch(settings.seed, "rand-init", tier, 0)  # rand-init's initialisation
        fresh = space.fresh().subnet(arch)
        for start in CENTRAL_STARTS:
            net = copy.deepcopy(fresh) if start == "random" else space.subnet(arch)
            if start not in ("supernet", "random"):
                transform(start, net, fresh)
            dead = dead_share(net, batch)
            losses = [
                local_sgd(net, pooled, sgd, stream_words(settings.seed, "central", e)).loss
                for e in range(epochs)
            ]
            refresh_batchnorm(net, server)
            net.eval()
            with torch.no_grad():
                result = evaluate(net, ordered_loader(test), torch.device("cpu"))
            rows.append(
                {
                    "tier": tier + 1,
                    "start": start,
                    "dead_relu_share": dead,
                    "losses": losses,
                    "accuracy": result.correct / result.count,
                }
            )
    return rows


def run_case(
    config: dict[str, Any],
    clients: int,
    out_dir: str,
    variants: list[str],
    central_epochs: int = 0,
) -> dict[str, Any]:
    """One FedorAS run whose Stage 3 fine-tunes each tier's path from its two starts and
    from each of ``variants``; with ``central_epochs``, then the centralised control."""
    import dataclasses
    from unittest import mock

    import torch

    torch.set_num_threads(1)
    from fedorasflwr.client_app import app
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.inprocess import InProcessGrid
    from fedorasflwr.methods.fedoras import finetune, runner, strategy
    from fedorasflwr.progress import setup_logging

    setup_logging(False)
    started = time.perf_counter()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    diagnostics: list[dict[str, Any]] = []
    plain = strategy.finetune_tier

    def every_start(context, grid, supernet, tier, arch, accuracy, *, init, **kwargs):  # noqa: ANN001, ANN202
        if init != finetune.RANDOM_INIT:
            return plain(context, grid, supernet, tier, arch, accuracy, init=init, **kwargs)
        models = [plain(context, grid, supernet, tier, arch, accuracy, init=init, **kwargs)]
        same = {k: v for k, v in kwargs.items() if k not in ("rounds", "clients_per_round")}
        for variant in variants:
            # the supernet start's recipe (fine-tuning rounds, lr and clients), as FedorAS's;
            # LR_FACTORS: a start other than "supernet" trains at rand-init-lr, set to the
            # factor times the fine-tuning lr
            at = context
            if variant in LR_FACTORS:
                s = context.settings
                lr = LR_FACTORS[variant] * s.finetune.lr
                at = dataclasses.replace(context, settings=dataclasses.replace(s, rand_init_lr=lr))
            models.append(plain(at, grid, supernet, tier, arch, accuracy, init=variant, **same))
        return models

    def finetune_all(self, grid, arrays, searches):  # noqa: ANN001, ANN202
        # the strategy appends what each call returns: a model, or (rand-init) several
        flat: list[Any] = []
        for item in original_finetune(self, grid, arrays, searches):
            flat.extend(item if isinstance(item, list) else [item])
        return flat

    original_finetune = strategy.FedorAS.finetune
    initial = start_variants(finetune, finetune.initial_subnet, diagnostics)
    with (
        mock.patch.object(runner, "fedoras_plots", lambda *_: []),
        mock.patch.object(finetune, "initial_subnet", initial),
        mock.patch.object(strategy, "finetune_tier", every_start),
        mock.patch.object(strategy.FedorAS, "_with_latency", lambda self, m: m),
        mock.patch.object(strategy.FedorAS, "finetune", finetune_all),
    ):
        document = runner.run_fedoras(
            InProcessGrid(app, config, clients), parse_run_config(config), Path(out_dir)
        )
    return {
        "models": [
            {
                **{k: m.get(k) for k in ("tier", "init", "arch", "macs", "global-test-accuracy")},
                "history": [
                    {k: h.get(k) for k in ("round", "lr", "train-loss", "val-accuracy")}
                    for h in m["history"]
                ],
            }
            for m in document["models"]
        ],
        "norms": diagnostics,
        "central": (
            central_control(config, clients, out_dir, document["search"], central_epochs)
            if central_epochs
            else []
        ),
        "seconds": round(time.perf_counter() - started, 1),
    }


def print_central(
    outcomes: dict[int, dict[str, Any]], seeds: list[int], epochs: int
) -> dict[str, float]:
    """The centralised control's table; its mean accuracy and last loss per start."""
    print(
        f"\nCentralised control: {epochs} epochs on the pooled training data; last epoch's "
        "training loss / global-test accuracy (dead ReLU share at the start)\n"
    )
    print("| seed | tier | " + " | ".join(CENTRAL_STARTS) + " |")
    print("| --- " * (len(CENTRAL_STARTS) + 2) + "|")
    acc: dict[str, list[float]] = {s: [] for s in CENTRAL_STARTS}
    loss: dict[str, list[float]] = {s: [] for s in CENTRAL_STARTS}
    for seed in seeds:
        rows = outcomes[seed]["central"]
        for tier in sorted({r["tier"] for r in rows}):
            cells = []
            for start in CENTRAL_STARTS:
                row = next(r for r in rows if r["tier"] == tier and r["start"] == start)
                acc[start].append(row["accuracy"])
                loss[start].append(row["losses"][-1])
                cells.append(
                    f"{row['losses'][-1]:.3f} / {row['accuracy']:.4f} "
                    f"({row['dead_relu_share']:.3f})"
                )
            print(f"| {seed} | T{tier} | " + " | ".join(cells) + " |")
    out: dict[str, float] = {}
    for start in CENTRAL_STARTS:
        key = start.replace("-", "_").replace(".", "")
        out[f"central_{key}_mean_acc"] = statistics.fmean(acc[start])
        out[f"central_{key}_mean_last_loss"] = statistics.fmean(loss[start])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    parser.add_argument("--alpha", type=float, default=1.0, help="Dirichlet alpha (default 1.0)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="run-config seeds")
    parser.add_argument("--clients", type=int, default=None, help="default: 40 (quick: 8)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (fresh processes)")
    parser.add_argument(
        "--starts",
        nargs="+",
        default=["rescaled", "fresh-head"],
        choices=VARIANTS,
        help="starts besides supernet and random (default: rescaled fresh-head)",
    )
    parser.add_argument(
        "--central-epochs",
        type=int,
        default=0,
        help="epochs of the centralised control (module docstring; default 0: none)",
    )
    parser.add_argument(
        "--stage1-epochs",
        type=int,
        default=None,
        help="Stage 1's local epochs a round, its rounds scaled to keep the local steps "
        "(default: fedoras_tiers.py's 10 epochs x 30 rounds)",
    )
    parser.add_argument(
        "--weight-decay", type=float, default=0.0, help="fedoras.weight-decay (default 0)"
    )
    args = parser.parse_args(argv)
    clients = args.clients or (8 if args.quick else 40)
    started = time.perf_counter()
    measured = {**settings(args.quick), "fedoras.weight-decay": args.weight_decay}
    if args.stage1_epochs:
        steps = measured["fedoras.rounds"] * measured["fedoras.local-epochs"]
        measured["fedoras.local-epochs"] = args.stage1_epochs
        measured["fedoras.rounds"] = max(1, steps // args.stage1_epochs)
    starts = ["supernet", "random", *[s for s in VARIANTS if s in args.starts]]
    with tempfile.TemporaryDirectory() as tmp:
        base = run_config({**measured, "data.cache-dir": str(Path(tmp) / "cache")})
        configs = [{**base, "seed": seed, "data.alpha": args.alpha} for seed in args.seeds]
        warm_data_cache(configs, clients)
        outcomes: dict[int, dict[str, Any]] = {}
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool:
            futures = {
                pool.submit(
                    run_case,
                    config,
                    clients,
                    str(Path(tmp) / f"seed{seed}"),
                    starts[2:],
                    args.central_epochs,
                ): seed
                for config, seed in zip(configs, args.seeds, strict=True)
            }
            for future in as_completed(futures):
                outcomes[futures[future]] = future.result()
    num_tiers = base["fedoras.num-tiers"]
    print(
        f"\nMNIST-5k, {clients} clients, alpha {args.alpha}, weight decay {args.weight_decay}: "
        "global-test accuracy per start\n"
    )
    print(
        "| seed | tier | " + " | ".join(starts) + " | conv norm / fresh (median, max) "
        "| classifier norm / fresh |"
    )
    print("| --- " * (len(starts) + 4) + "|")
    means: dict[str, list[float]] = {start: [] for start in starts}
    for seed in args.seeds:
        outcome = outcomes[seed]
        for tier in range(1, num_tiers + 1):
            acc = {
                m["init"]: m["global-test-accuracy"] for m in outcome["models"] if m["tier"] == tier
            }
            if not acc:
                continue
            norms = next((n for n in outcome["norms"] if n["tier"] == tier), {})
            for start in starts:
                if acc.get(start) is not None:
                    means[start].append(acc[start])
            cells = " | ".join("-" if acc.get(s) is None else f"{acc[s]:.4f}" for s in starts)
            ratios = (  # measured as the rescaled start is built
                f"{norms['conv_norm_ratio_median']:.2f}, {norms['conv_norm_ratio_max']:.2f} | "
                f"{norms['classifier_norm_ratio']:.2f}"
                if norms
                else "- | -"
            )
            print(f"| {seed} | T{tier} | {cells} | {ratios} |")
    mean = {s: statistics.fmean(v) if v else None for s, v in means.items()}
    print(
        "\nmean over seeds and tiers: "
        + ", ".join(f"{s} {'-' if v is None else f'{v:.4f}'}" for s, v in mean.items())
    )
    summary: dict[str, Any] = {
        "alpha": args.alpha,
        "seeds": len(args.seeds),
        **{f"{s.replace('-', '_')}_mean_acc": v for s, v in mean.items()},
    }
    if args.central_epochs:
        summary.update(print_central(outcomes, args.seeds, args.central_epochs))
    name = f"finetune_start.alpha-{args.alpha}.seeds-" + "-".join(map(str, args.seeds))
    if starts[2:]:
        name += "." + "-".join(starts[2:])
    name += f".wd-{args.weight_decay}" if args.weight_decay else ""
    name += f".stage1-epochs-{args.stage1_epochs}" if args.stage1_epochs else ""
    report(
        name,
        args.quick,
        summary,
        {
            "settings": measured,
            "clients": clients,
            "alpha": args.alpha,
            "starts": starts,
            "runs": {str(seed): outcomes[seed] for seed in args.seeds},
            "seconds": round(time.perf_counter() - started, 1),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
