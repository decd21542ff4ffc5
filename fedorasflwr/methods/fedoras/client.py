"""FedorAS client: the three stages' local work (paper §3.1-3.3).

- Stage 1, ``train_supernet``: per batch the client samples one path of the
  subspace it received within its tier's FLOPs budget (``resource`` "latency":
  within its latency budget on its own latency table, both in the message) and takes one SGD step
  on it, counting the samples that went through each option.  It returns the
  fixed parts and the options it touched, with those counts, for OPA (or
  every key it received, for the plain-FedAvg comparison).
- Stage 2, ``score_paths_locally``: federated scoring of a generation's paths
  on the local validation split, BN recalibrated on local training batches.
- Stage 3, ``train_subnet`` / ``evaluate_subnet``: local epochs of an
  extracted subnet (FedAvg fine-tuning) and its test loss and accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from torch import nn
from torch.utils.data import Dataset

from ...arrays import record_of, state_dict_of
from ...costs import training_flops
from ...data import ClientData
from ...latency import LatencyTable
from ...protocol import ARRAYS, METRICS, space_from_config
from ...search_spaces import SearchSpace, Subspace, build_space, build_subnet
from ...seeding import numpy_generator, stream_words
from ...training import (
    clip_gradients,
    flatten_logits,
    held_out_metrics,
    local_sgd,
    ordered_loader,
    reply_state,
    seeded_loader,
    sgd,
    torch_device,
)
from .evaluation import score_paths
from .tiers import PathCost

__all__ = [
    "SupernetWork",
    "supernet_budget",
    "supernet_epochs",
    "evaluate_subnet",
    "load_supernet",
    "score_paths_locally",
    "train_subnet",
    "train_supernet",
]


def load_supernet(config: Mapping[str, Any], arrays: ArrayRecord) -> SearchSpace:
    """Build the supernet named in ``config`` and load the (partial) ``arrays`` into it."""
    space = build_space(**space_from_config(config))
    state = state_dict_of(arrays)
    unknown = set(state) - set(space.state_dict())
    if unknown:
        raise ValueError(
            f"received {len(unknown)} key(s) unknown to the supernet, e.g. {sorted(unknown)[0]!r}"
        )
    space.load_state_dict(state, strict=False)
    return space


@dataclass(frozen=True)
class SupernetWork:
    """What ``supernet_epochs`` did: samples per option (flat, layer by layer), summed
    training loss, samples seen and training FLOPs."""

    counts: np.ndarray
    loss_sum: float
    examples: int
    flops: int


def supernet_epochs(
    space: SearchSpace,
    train: Dataset,
    config: Mapping[str, Any],
    words: Sequence[int],
    subspace: Subspace,
    max_flops: float,
    cost: PathCost | None = None,
) -> SupernetWork:
    """The Stage-1 loop on ``torch_device()``: per batch one path of ``subspace`` within
    ``max_flops`` (of ``cost``, default FLOPs: with a latency table, milliseconds), one
    SGD step on it, and the samples it sent through each option.

    The loss is summed on the device and read once at the end (no host sync per step)."""
    rng = numpy_generator(words)
    cost = PathCost(space) if cost is None else cost
    device = torch_device()
    space.to(device).train()
    optimizer = sgd(space.parameters(), config)
    criterion = nn.CrossEntropyLoss()
    offsets = np.cumsum([0, *space.num_options()])[:-1]
    counts = np.zeros(sum(space.num_options()), dtype=np.int64)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    examples, flops = 0, 0
    loader = seeded_loader(train, int(config["batch-size"]), words)
    max_norm = float(config.get("grad-clip", 0.0))
    for _ in range(int(config["local-epochs"])):
        for inputs, targets in loader:
            path = cost.sample_path(rng, max_flops, subspace)
            optimizer.zero_grad(set_to_none=True)
            logits, flat = flatten_logits(space(inputs.to(device), path), targets.to(device))
            loss = criterion(logits, flat)
            loss.backward()
            clip_gradients(space.parameters(), max_norm)
            optimizer.step()
            batch = int(inputs.shape[0])
            counts[offsets + np.asarray(path)] += batch
            loss_sum += loss.detach() * batch
            examples += batch
            flops += training_flops(space.cost(path).flops, batch)
    return SupernetWork(counts, float(loss_sum), examples, flops)


def supernet_budget(space: SearchSpace, config: Mapping[str, Any]) -> tuple[PathCost, float]:
    """What a Stage-1 client's paths must fit: ``max-flops`` FLOPs, or with ``resource``
    "latency", ``max-latency-ms`` milliseconds of the node's own latency table
    (``latency-option-ms``, flat and layer-major, and ``latency-fixed-ms``)."""
    if str(config.get("resource", "flops")) != "latency":
        return PathCost(space), float(config["max-flops"])
    flat = [float(v) for v in config["latency-option-ms"]]
    sizes = space.num_options()
    if len(flat) != sum(sizes):
        raise ValueError(f"'latency-option-ms' has {len(flat)} entries, the space {sum(sizes)}")
    budget = float(config["max-latency-ms"])
    fixed = float(config["latency-fixed-ms"])
    if not all(math.isfinite(v) and v > 0 for v in flat):
        raise ValueError("'latency-option-ms' has an entry that is not a finite number > 0")
    if not (math.isfinite(fixed) and fixed >= 0 and math.isfinite(budget) and budget > 0):
        raise ValueError(
            f"'latency-fixed-ms' = {fixed!r} / 'max-latency-ms' = {budget!r}: "
            "expected finite numbers, >= 0 and > 0"
        )
    offsets = np.cumsum([0, *sizes])
    table = LatencyTable(
        spec=space.spec,
        device="",
        threads=0,
        option_ms=tuple(tuple(flat[a:b]) for a, b in zip(offsets[:-1], offsets[1:], strict=True)),
        fixed_ms=fixed,
    )
    return PathCost(space, table), budget


def train_supernet(content: RecordDict, data: ClientData, partition_id: int) -> RecordDict:
    """Run the local Stage-1 epochs described by ``content``'s config; return the reply."""
    config: ConfigRecord = content.config_records["config"]
    space = load_supernet(config, content.array_records[ARRAYS])
    subspace = space.subspace_from_mask([int(v) for v in config["subspace-mask"]])
    words = stream_words(config["seed"], "fedoras-supernet", config["server-round"], partition_id)
    cost, budget = supernet_budget(space, config)
    work = supernet_epochs(space, data.train, config, words, subspace, budget, cost)
    offsets = np.cumsum([0, *space.num_options()])
    keys = set(space.fixed_keys())
    for layer, size in enumerate(space.num_options()):
        for option in range(size):
            if work.counts[offsets[layer] + option] > 0:
                keys.update(space.op_keys(layer, option))
    if bool(config.get("return-all", False)):  # plain FedAvg of supernets: send back all
        keys = set(content.array_records[ARRAYS].keys())
    state = {k: v.detach().cpu() for k, v in space.state_dict().items() if k in keys}
    metrics = MetricRecord(
        {
            "num-examples": work.examples,
            "train-loss": work.loss_sum / max(work.examples, 1),
            "train-flops": work.flops,
            "option-counts": work.counts.tolist(),
        }
    )
    return RecordDict({ARRAYS: record_of(state), METRICS: metrics})


def score_paths_locally(content: RecordDict, data: ClientData, partition_id: int) -> RecordDict:
    """Stage 2, federated scoring: each path's correct predictions and loss on the
    local validation split, its BN statistics first re-estimated on a few local
    training batches (``calibration-batches``; 0 turns recalibration off)."""
    config: ConfigRecord = content.config_records["config"]
    space = load_supernet(config, content.array_records[ARRAYS])
    subspace = space.subspace_from_mask([int(v) for v in config["subspace-mask"]])
    layers = len(space.num_options())
    flat = [int(v) for v in config["paths"]]
    if not flat or len(flat) % layers:
        raise ValueError(f"'paths' has {len(flat)} entries, not a multiple of {layers} layers")
    paths = [tuple(flat[i : i + layers]) for i in range(0, len(flat), layers)]
    for path in paths:
        if any(o not in kept for o, kept in zip(path, subspace, strict=True)):
            raise ValueError(f"path {path} uses an option outside the supernet sent")
    words = stream_words(config["seed"], "fedoras-score", config["server-round"], partition_id)
    batch_size = int(config["batch-size"])
    calibration = None
    if int(config["calibration-batches"]) > 0:
        loader = seeded_loader(data.train, batch_size, words)
        calibration = [x for x, _ in loader][: int(config["calibration-batches"])]
    scored = ordered_loader(data.val)
    results = score_paths(space, paths, scored, calibration, torch_device())
    count = results[0].count if results else 0
    metrics = MetricRecord(
        {
            "num-examples": count,
            "correct": [r.correct for r in results],
            "loss-sum": [r.loss_sum for r in results],
        }
    )
    return RecordDict({METRICS: metrics})


def _load_subnet(config: Mapping[str, Any], arrays: ArrayRecord) -> nn.Module:
    net = build_subnet(space_from_config(config), [int(v) for v in config["arch"]])
    net.load_state_dict(state_dict_of(arrays), strict=True)
    return net


def train_subnet(content: RecordDict, data: ClientData, partition_id: int) -> RecordDict:
    """Stage 3: local epochs of the extracted subnet at the round's learning rate."""
    config: ConfigRecord = content.config_records["config"]
    received = content.array_records[ARRAYS]
    net = _load_subnet(config, received)
    words = stream_words(config["seed"], "fedoras-finetune", config["server-round"], partition_id)
    done = local_sgd(net, data.train, config, words)
    metrics = MetricRecord(
        {
            "num-examples": len(data.train),
            "train-loss": done.loss,
            "train-flops": done.flops(int(config["net-flops"])),
        }
    )
    return RecordDict({ARRAYS: record_of(reply_state(net, received)), METRICS: metrics})


def evaluate_subnet(content: RecordDict, data: ClientData) -> RecordDict:
    """Stage 3: test loss and accuracy of the received subnet on the local test split, its
    BatchNorm statistics re-estimated on the training split first (``held_out_metrics``)."""
    config: ConfigRecord = content.config_records["config"]
    net = _load_subnet(config, content.array_records[ARRAYS])
    return RecordDict({METRICS: MetricRecord(held_out_metrics(net, data.test, data.train))})
