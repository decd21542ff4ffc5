"""Why one learning rate trains MNIST and kills a net on another dataset (issue 40, item 4).

The methods' presets train at SGD lr 0.05 with momentum 0.9 (effective step lr / (1 - m) =
0.5), chosen on MNIST-5k. On a synthetic image folder of 32x32 RGB shapes
(``fedorasflwr.data.shapes``, 6 classes) the same recipe leaves the width baselines' ConvNet
at chance. This trains each net centrally from its seeded initialisation on the pooled
training data of 20 clients (batch 32, momentum 0.9) at a halving grid of learning rates,
and records per step what happens from the first update on:

- ``first3`` / ``max48``: the mean training loss of the first 3 steps and the highest of the
  first 48 (an untrained net's is ln(classes): a higher value means the first updates threw
  the net far off);
- after ``--epochs`` epochs, ``train_loss`` (the last epoch's mean) and the global-test
  ``accuracy`` after re-estimating BatchNorm statistics on the server slice;
- ``collapsed``: accuracy at most 1.5 x chance (what the leaderboard flags).

Nets: the ConvNet at width 1.0 (HeteroFL's and FjORD's full model) and the ``cnn_s`` path
of ``space_ablation.py`` (flatten head). The headline gives, per dataset and net, the
largest learning rate of the grid that does not collapse.

    python benchmarks/lr_stability.py            # 2 datasets x 2 nets x 6 lrs, 3 epochs
    python benchmarks/lr_stability.py --quick    # smoke: shapes, 150 a class, ConvNet, 2 lrs
    python benchmarks/lr_stability.py --shapes-only --nets cnn_s convnet-tier convnet \
        --lrs 0.05 0.0125 0.003125 --epochs 10   # the nets' reach on shapes, given steps

``convnet-tier``: the ConvNet at the ``cnn_s`` path's MACs (the hand-made net of the same
cost); ``convnet-scaled`` / ``convnet-tier-scaled``: those with the classifier's input
divided by sqrt(H x W) of the map it reads (the package's ``head="flatten-scaled"``,
``prunable_nets.ConvNet``). ``--grad-clip``
clips each step's gradient, ``--warmup`` raises the rate linearly over the first steps, and
``--seeds`` draws the init and batch order (the data stay seed 0's). A run other than the
default grid writes ``lr_stability.epochs-<e>.<nets>[.shapes][.clip-<c>][.warmup-<w>]
[.seeds-<s>].json``.

Writes ``benchmarks/results/lr_stability.json`` (``.quick.json``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from common import ROOT, dataset_label, report

sys.path.insert(0, str(ROOT))

NUM_CLIENTS = 20
GRID = (0.1, 0.05, 0.025, 0.0125, 0.00625, 0.003125)
SHAPES_PER_CLASS = 300


def shapes_folder(per_class: int = SHAPES_PER_CLASS) -> str:
    """``folder:<path>`` of the shapes set (seed 0) under ``outputs/``, written once."""
    from fedorasflwr.data.shapes import CLASSES, write_shapes

    root = ROOT / "outputs" / f"shapes-{per_class}-seed-0"
    if not all((root / name / f"{per_class - 1:05d}.png").exists() for name in CLASSES):
        write_shapes(root, per_class, seed=0)
    return f"folder:{root}"


def _data(dataset: str) -> tuple[Any, Any, Any, dict[str, int]]:
    """The pooled training data of the clients, the server slice, the global test set and
    the image of ``dataset`` (IID split, seed 0)."""
    from common import run_config
    from torch.utils.data import ConcatDataset

    from fedorasflwr.config import parse_run_config
    from fedorasflwr.data import load_client_data, load_global_test, load_server_data
    from fedorasflwr.methods.widths.runner import image_spec

    config = run_config(
        {"data.dataset": dataset, "data.partitioner": "iid", "data.global-test": True, "seed": 0}
    )
    settings = parse_run_config(config)
    spec = settings.data
    clients = [load_client_data(spec, i, NUM_CLIENTS).train for i in range(NUM_CLIENTS)]
    pooled = ConcatDataset(clients)
    return pooled, load_server_data(spec), load_global_test(spec), image_spec(settings)


NETS = ("convnet", "cnn_s", "convnet-tier", "convnet-scaled", "convnet-tier-scaled")


def build(net: str, image: dict[str, int]) -> Any:
    """The ConvNet at width 1.0 (``convnet``), ``space_ablation``'s ``cnn_s`` path (flatten
    head), or the ConvNet at the widest multiple of 1/64 within that path's MACs
    (``convnet-tier``: the hand-made net of the same cost)."""
    from space_ablation import cnn_s_path

    from fedorasflwr.search_spaces import build_space
    from fedorasflwr.search_spaces.cnn import PAPER_REDUCTION
    from fedorasflwr.search_spaces.widths import width_costs, width_net

    head = "flatten"
    if net.endswith("-scaled"):  # the ConvNet's scaled head (prunable_nets.ConvNet)
        net, head = net.removesuffix("-scaled"), "flatten-scaled"
    if net == "convnet":
        return width_net(image, 1.0, head)
    # the paper's reduction: the net recorded before the reduction was a choice
    space = build_space("cnn_s", **image, width=0.5, reduction=PAPER_REDUCTION)
    path = cnn_s_path(image, 0.5)
    if net == "cnn_s":
        return space.subnet(path)
    macs = space.cost(path).flops / 2
    fits = [k for k in range(1, 65) if width_costs(image, k / 64)["macs"] <= macs]
    return width_net(image, max(fits) / 64, head)


def warmed_lr(lr: float, step: int, warmup: int) -> float:
    """The rate of (0-based) ``step``: ``lr * (step + 1) / warmup`` over the first ``warmup``
    steps, then ``lr`` (``warmup`` 0: ``lr`` throughout)."""
    return lr * min(1.0, (step + 1) / warmup) if warmup > 0 else lr


def train(
    dataset: str,
    net_name: str,
    lr: float,
    epochs: int,
    grad_clip: float = 0.0,
    warmup: int = 0,
    seed: int = 0,
) -> dict[str, Any]:
    """Central SGD of one net at ``lr`` from its seeded init; the losses and accuracy.
    ``seed`` draws the init and the batch order (the data and its split stay seed 0's).
    ``grad_clip``: each step's gradient scaled to this L2 norm at most (0: off);
    ``warmup``: the rate rises linearly over the first this many steps to ``lr`` (step k
    of them at ``lr * (k + 1) / warmup``; 0: off)."""
    import numpy as np
    import torch

    from fedorasflwr.compare.leaderboard import CHANCE_FACTOR
    from fedorasflwr.seeding import seed_torch, stream_words
    from fedorasflwr.training import (
        clip_gradients,
        evaluate,
        ordered_loader,
        refresh_batchnorm,
        seeded_loader,
    )

    torch.set_num_threads(1)
    started = time.monotonic()
    pooled, server, test, image = _data(dataset)
    seed_torch(seed, "lr-stability-init")
    net = build(net_name, image)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()
    losses: list[float] = []
    epoch_loss = math.nan
    for epoch in range(epochs):
        net.train()
        seen = []
        for inputs, targets in seeded_loader(pooled, 32, stream_words(seed, "lr-stability", epoch)):
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(net(inputs), targets)
            loss.backward()
            clip_gradients(net.parameters(), grad_clip)
            for group in optimizer.param_groups:
                group["lr"] = warmed_lr(lr, len(losses) + len(seen), warmup)
            optimizer.step()
            seen.append(loss.item())
        losses.extend(seen)
        epoch_loss = float(np.mean(seen))
    refresh_batchnorm(net, server)
    net.eval()
    with torch.no_grad():
        result = evaluate(net, ordered_loader(test), torch.device("cpu"))
    accuracy = result.correct / result.count
    chance = 1 / image["num_classes"]
    return {
        "dataset": dataset_label(dataset),
        "net": net_name,
        "lr": lr,
        "epochs": epochs,
        "grad_clip": grad_clip,
        "warmup": warmup,
        "seed": seed,
        "untrained_loss": math.log(image["num_classes"]),
        "first3": float(np.mean(losses[:3])),
        "max48": float(np.max(losses[:48])),
        "train_loss": epoch_loss,
        "accuracy": accuracy,
        "chance": chance,
        "collapsed": bool(accuracy <= CHANCE_FACTOR * chance + 1e-9),  # the leaderboard's flag
        "steps": len(losses),
        "losses": [round(value, 4) for value in losses],  # per step: rules are read off these
        "seconds": round(time.monotonic() - started, 1),
    }


def _job(args: tuple[str, str, float, int, float, int, int]) -> dict[str, Any]:
    return train(*args)


def largest_stable(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """``<dataset>_<net>_largest_stable_lr``: the largest lr at which no run (no seed)
    collapsed (None where every lr had a collapsed run)."""
    collapsed: dict[str, dict[float, bool]] = {}
    for run in runs:
        key = f"{run['dataset']}_{run['net']}_largest_stable_lr"
        by_lr = collapsed.setdefault(key, {})
        by_lr[run["lr"]] = by_lr.get(run["lr"], False) or bool(run["collapsed"])
    return {
        key: max((lr for lr, fell in by_lr.items() if not fell), default=None)
        for key, by_lr in collapsed.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--shapes-only", action="store_true", help="the shapes folder only")
    parser.add_argument("--nets", nargs="+", choices=NETS, default=["convnet", "cnn_s"])
    parser.add_argument("--lrs", nargs="+", type=float, default=list(GRID))
    parser.add_argument(
        "--grad-clip", type=float, default=0.0, help="max gradient norm of each step (0: off)"
    )
    parser.add_argument(
        "--warmup", type=int, default=0, help="steps over which the rate rises to lr (0: off)"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="init and batch order")
    args = parser.parse_args(argv)
    datasets = [shapes_folder(150 if args.quick else SHAPES_PER_CLASS)]
    nets, grid = args.nets, tuple(args.lrs)
    if args.quick:
        nets, grid, args.epochs, args.seeds = ["convnet"], (0.05, 0.003125), 3, [0]
        args.grad_clip, args.warmup = 0.0, 0  # the quick file records the plain recipe only
    elif not args.shapes_only:
        datasets.insert(0, "mnist5k")
    for dataset in datasets:  # fill the data cache once, before the workers race for it
        _data(dataset)
    jobs = [
        (d, n, lr, args.epochs, args.grad_clip, args.warmup, seed)
        for d in datasets
        for n in nets
        for lr in grid
        for seed in args.seeds
    ]
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        runs = list(pool.map(_job, jobs))
    print(f"{'dataset':<22} {'net':<8} {'lr':>8} seed {'first3':>7} {'max48':>7} {'loss':>6} acc")
    for run in runs:
        print(
            f"{run['dataset']:<22} {run['net']:<8} {run['lr']:>8.5f} {run['seed']:>4} "
            f"{run['first3']:>7.2f} "
            f"{run['max48']:>7.2f} {run['train_loss']:>6.3f} {run['accuracy']:.3f}"
            + ("  collapsed" if run["collapsed"] else "")
        )
    summary = {"runs": len(runs), "epochs": args.epochs, **largest_stable(runs)}
    options = (nets, grid, args.epochs, args.shapes_only, args.grad_clip, args.warmup, args.seeds)
    default = options == (["convnet", "cnn_s"], GRID, 3, False, 0.0, 0, [0])
    name = "lr_stability" if args.quick or default else f"lr_stability.epochs-{args.epochs}"
    if not default and not args.quick:
        name += "." + "-".join(nets) + (".shapes" if args.shapes_only else "")
        name += f".clip-{args.grad_clip:g}" if args.grad_clip else ""
        name += f".warmup-{args.warmup}" if args.warmup else ""
        name += ".seeds-" + "-".join(map(str, args.seeds)) if args.seeds != [0] else ""
    report(name, args.quick, summary, {"runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
