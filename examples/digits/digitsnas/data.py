"""The example's own data: scikit-learn's 8x8 digits, split by the app itself.

Every process makes the same split from the run config's ``seed``: the digits shuffled, a
held-out server slice first, the rest dealt into ``num-partitions`` disjoint shards, each
cut 80 / 10 / 10 into a node's train, val and test splits. Nothing is downloaded (the
digits ship with scikit-learn).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch
from flwr.app import Context
from sklearn.datasets import load_digits
from torch.utils.data import TensorDataset

NUM_CLASSES = 10


@cache
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1797 digits: float32 ``(N, 1, 8, 8)`` in [0, 1] and int64 labels."""
    digits = load_digits()
    images = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    return images, torch.tensor(digits.target, dtype=torch.int64)


def split(
    num_samples: int, seed: int, server_fraction: float, num_partitions: int
) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Sample indices: the server slice's, and each partition's (train, val, test)."""
    order = np.random.default_rng(seed).permutation(num_samples)
    num_server = int(round(server_fraction * num_samples))
    parts = []
    for shard in np.array_split(order[num_server:], num_partitions):
        held = max(1, len(shard) // 10)
        parts.append((shard[: -2 * held], shard[-2 * held : -held], shard[-held:]))
    return order[:num_server], parts


def _subset(indices: np.ndarray) -> TensorDataset:
    images, labels = _digits()
    index = torch.from_numpy(indices)
    return TensorDataset(images[index], labels[index])


def server_slice(seed: int, server_fraction: float) -> TensorDataset:
    """The server's validation slice (no node trains on it)."""
    server, _ = split(len(_digits()[1]), seed, server_fraction, 1)
    return _subset(server)


def partition(
    seed: int, server_fraction: float, partition_id: int, num_partitions: int
) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    """Node ``partition_id``'s (train, val, test), one of ``num_partitions`` shards."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} not in [0, {num_partitions})")
    _, parts = split(len(_digits()[1]), seed, server_fraction, num_partitions)
    train, val, test = (_subset(indices) for indices in parts[partition_id])
    return train, val, test


def load_data(context: Context) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    """``make_client_app``'s loader: this node's partition (node config ``partition-id`` and
    ``num-partitions``, which the simulation engine sets) of the run's split."""
    return partition(
        int(context.run_config["seed"]),
        float(context.run_config["server-fraction"]),
        int(context.node_config["partition-id"]),
        int(context.node_config["num-partitions"]),
    )
