"""A FedorAS client's Stage-1 local training against a plain PyTorch loop.

Side by side in one process, same seed, same client partition (mnist5k, Dirichlet):

- **ours**: the client's Stage-1 loop, ``fedorasflwr.methods.fedoras.client.supernet_epochs``
  (what ``train_supernet`` runs between loading the message and building the reply):
  per batch sample a path within the tier's FLOPs budget, load the batch, take the
  SGD step, count the samples per option and the training FLOPs;
- **plain**: the textbook PyTorch loop on the same supernet, the same batches
  (the same seeded ``DataLoader``) and the same paths (drawn beforehand, outside
  the timing): ``zero_grad``, forward the path, cross-entropy, ``backward``,
  ``step`` - nothing else;
- **ours, whole call** (reported, not the headline): all of ``train_supernet`` on the
  message a Stage-1 round sends, i.e. also building the supernet, decoding the
  received weights and encoding the reply (Flower's ``ArrayRecord``).

Both loops start from a freshly loaded supernet (loading untimed).
Each repeat times all three, rotating which goes first (interleaved, so a change in
the shared machine's load hits both sides alike); samples per second is the
number of training samples seen over the wall time.  ``ours_over_plain`` is the
median over repeats of ours / plain samples per second (>= 0.9 is the goal).
One torch thread on both sides.  Prints a Markdown table and ``headline: ...``;
writes ``benchmarks/results/client_throughput.json`` (``.quick.json`` for ``--quick``).

    python benchmarks/client_throughput.py            # width 0.5, 1 epoch, 5 repeats
    python benchmarks/client_throughput.py --quick    # CI smoke run (seconds)
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import report, run_config, warm_data_cache
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

NUM_CLIENTS = 10


def settings(quick: bool, cache_dir: Path) -> dict[str, Any]:
    return {
        "data.cache-dir": str(cache_dir),
        "space.width": 0.25 if quick else 0.5,
        "fedoras.local-epochs": 1,
    }


def stage1_content(run: Any, space: Any, budget: float) -> RecordDict:
    """What a Stage-1 round sends one client: the whole supernet, the full subspace, a
    FLOPs budget between the cheapest and the largest path."""
    from fedorasflwr.protocol import ARRAYS, CONFIG, space_to_config

    fedoras = run.method_settings
    low, high = space.min_flops(), space.max_flops()
    config = {
        "seed": run.seed,
        "server-round": 1,
        "subspace-mask": [1] * sum(space.num_options()),
        "max-flops": float(low + budget * (high - low)),
        **fedoras.train.client_config(),
        **space_to_config(space.spec),
    }
    return RecordDict({ARRAYS: ArrayRecord(space.state_dict()), CONFIG: ConfigRecord(config)})


def ours(content: RecordDict, data: Any) -> tuple[float, int]:
    """Seconds and samples of the client's Stage-1 loop (``supernet_epochs``: path
    sampling, data loading, the steps, option counts and FLOPs), on a freshly loaded
    supernet (loading is not timed, as for the plain loop)."""
    from fedorasflwr.methods.fedoras.client import load_supernet, supernet_epochs
    from fedorasflwr.protocol import ARRAYS, CONFIG

    config = content.config_records[CONFIG]
    space = load_supernet(config, content.array_records[ARRAYS])
    subspace = space.subspace_from_mask([int(v) for v in config["subspace-mask"]])
    words = (int(config["seed"]), int(config["server-round"]), 0)
    started = time.perf_counter()
    work = supernet_epochs(space, data.train, config, words, subspace, float(config["max-flops"]))
    return time.perf_counter() - started, work.examples


def ours_call(content: RecordDict, data: Any) -> tuple[float, int]:
    """Seconds and samples of the whole ``train_supernet`` call (the ClientApp's work:
    building and loading the supernet, the loop, the reply's weights and metrics)."""
    from fedorasflwr.methods.fedoras.client import train_supernet
    from fedorasflwr.protocol import METRICS

    started = time.perf_counter()
    reply = train_supernet(content, data, partition_id=0)
    seconds = time.perf_counter() - started
    return seconds, int(reply.metric_records[METRICS]["num-examples"])


def plain(content: RecordDict, data: Any) -> tuple[float, int]:
    """Seconds and samples of the plain loop: same supernet, batches and paths; the
    optimizer and loader are made inside the timing, as ``supernet_epochs`` makes them."""
    from fedorasflwr.methods.fedoras.client import load_supernet
    from fedorasflwr.protocol import ARRAYS, CONFIG
    from fedorasflwr.training import seeded_loader, torch_device

    config = content.config_records[CONFIG]
    space = load_supernet(config, content.array_records[ARRAYS])
    device = torch_device()  # where ours computes (supernet_epochs): the same for both sides
    subspace = space.subspace_from_mask([int(v) for v in config["subspace-mask"]])
    words = (int(config["seed"]), int(config["server-round"]), 0)
    rng = np.random.default_rng(words)
    epochs = int(config["local-epochs"])
    batches = len(seeded_loader(data.train, int(config["batch-size"]), words))
    budget = float(config["max-flops"])
    paths = [space.sample_path(rng, budget, subspace) for _ in range(epochs * batches)]
    started = time.perf_counter()
    space.to(device)  # inside the timing, as supernet_epochs moves it
    loader = seeded_loader(data.train, int(config["batch-size"]), words)
    optimizer = torch.optim.SGD(
        space.parameters(),
        lr=float(config["lr"]),
        momentum=float(config["momentum"]),
        weight_decay=float(config["weight-decay"]),
    )
    criterion = torch.nn.CrossEntropyLoss()
    space.train()
    seen, step = 0, 0
    for _ in range(epochs):
        for inputs, targets in loader:
            optimizer.zero_grad(set_to_none=True)
            inputs, targets = inputs.to(device), targets.to(device)
            loss = criterion(space(inputs, paths[step]), targets)
            loss.backward()
            optimizer.step()
            seen += len(targets)
            step += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the queued kernels are part of the work
    return time.perf_counter() - started, seen


SIDES = {"ours": ours, "ours_call": ours_call, "plain": plain}


def measure(quick: bool, cache: Path) -> dict[str, Any]:
    config = run_config(settings(quick, cache))  # first: puts this checkout on sys.path
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.data import load_client_data
    from fedorasflwr.runs import build_supernet

    warm_data_cache([config], NUM_CLIENTS)
    run = parse_run_config(config)
    data = load_client_data(run.data, 0, NUM_CLIENTS)
    torch.manual_seed(run.seed)
    space = build_supernet(run)
    content = stage1_content(run, space, budget=0.5)
    repeats = 3 if quick else 5
    for side in SIDES.values():  # warm-up: cost tables, allocator, kernels
        side(content, data)
    rows = []
    for repeat in range(repeats):
        order = list(SIDES)[repeat % 3 :] + list(SIDES)[: repeat % 3]  # rotate who goes first
        timed = {name: SIDES[name](content, data) for name in order}
        samples = {n for _, n in timed.values()}
        assert len(samples) == 1, f"the sides saw different sample counts: {timed}"
        row: dict[str, Any] = {"repeat": repeat, "first": order[0], "samples": samples.pop()}
        for name, (seconds, seen) in timed.items():
            row[f"{name}_seconds"] = seconds
            row[f"{name}_samples_per_second"] = seen / seconds
        plain_rate = row["plain_samples_per_second"]
        row["ours_over_plain"] = row["ours_samples_per_second"] / plain_rate
        row["ours_call_over_plain"] = row["ours_call_samples_per_second"] / plain_rate
        rows.append(row)
    return {
        "rows": rows,
        "train_samples": len(data.train),
        "settings": {**settings(quick, cache), "repeats": repeats, "num-clients": NUM_CLIENTS},
        "space": space.spec,
        "batch_size": run.method_settings.train.batch_size,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| repeat | first | samples | plain samples/s | ours samples/s | ours / plain "
        "| whole call samples/s | call / plain |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['repeat']} | {row['first']} | {row['samples']} "
            f"| {row['plain_samples_per_second']:.1f} | {row['ours_samples_per_second']:.1f} "
            f"| {row['ours_over_plain']:.3f} | {row['ours_call_samples_per_second']:.1f} "
            f"| {row['ours_call_over_plain']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(args.quick, Path(tmp) / "cache")
    rows = result["rows"]
    print(table(rows))
    summary = {
        "ours_over_plain": statistics.median(r["ours_over_plain"] for r in rows),
        "ours_call_over_plain": statistics.median(r["ours_call_over_plain"] for r in rows),
        "ours_samples_per_second": statistics.median(r["ours_samples_per_second"] for r in rows),
        "plain_samples_per_second": statistics.median(r["plain_samples_per_second"] for r in rows),
        "repeats": len(rows),
        "load_average": os.getloadavg()[0],
    }
    report("client_throughput", args.quick, summary, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
