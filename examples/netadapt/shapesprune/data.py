"""The example's own data: synthetic 12x12 images of a line, made by each node itself.

Each image holds one line of 5 to 8 pixels at a random place, in one of four directions
(the class: horizontal, vertical, diagonal, anti-diagonal), on Gaussian noise. A node
draws its own samples from the run config's ``seed`` and its ``partition-id``, with a
label skew (its "own" class, ``partition-id`` mod 4, is twice as likely as each other
one), so the nodes' label histograms differ, as DecNAS's grouping expects. Nothing is
downloaded and no node sees another's samples.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Context
from torch.utils.data import TensorDataset

CLASSES = ("horizontal", "vertical", "diagonal", "anti-diagonal")
NUM_CLASSES = len(CLASSES)
SIZE = 12  # images are 1 x SIZE x SIZE
INPUT_SHAPE = (1, SIZE, SIZE)


def make_images(labels: np.ndarray, rng: np.random.Generator, noise: float) -> np.ndarray:
    """One float32 ``(1, SIZE, SIZE)`` image per label: a line of that class on noise."""
    images = rng.normal(0.0, noise, (len(labels), 1, SIZE, SIZE)).astype(np.float32)
    for image, label in zip(images, labels, strict=True):
        length = int(rng.integers(5, 9))
        steps = np.arange(length)
        row, col = rng.integers(0, SIZE - length + 1, 2)
        across = int(rng.integers(0, SIZE))  # the fixed coordinate of a straight line
        rows, cols = {
            0: (np.full(length, across), col + steps),  # horizontal
            1: (row + steps, np.full(length, across)),  # vertical
            2: (row + steps, col + steps),  # diagonal
            3: (row + steps, col + length - 1 - steps),  # anti-diagonal
        }[int(label)]
        image[0, rows, cols] += 1.0
    return images


def partition(
    seed: int, partition_id: int, num_samples: int, noise: float
) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    """Node ``partition_id``'s (train, val, test): ``num_samples`` images cut 80 / 10 / 10."""
    if partition_id < 0:
        raise ValueError(f"partition-id {partition_id} must be >= 0")
    if num_samples < 10:
        raise ValueError(f"samples-per-node {num_samples} must be >= 10")
    rng = np.random.default_rng([seed, partition_id])
    weights = np.ones(NUM_CLASSES)
    weights[partition_id % NUM_CLASSES] = 2.0  # this node's own class, twice as likely
    labels = rng.choice(NUM_CLASSES, size=num_samples, p=weights / weights.sum())
    images = torch.from_numpy(make_images(labels, rng, noise))
    targets = torch.from_numpy(labels.astype(np.int64))
    held = num_samples // 10
    cuts = [(0, num_samples - 2 * held), (num_samples - 2 * held, num_samples - held)]
    cuts.append((num_samples - held, num_samples))
    train, val, test = (TensorDataset(images[a:b], targets[a:b]) for a, b in cuts)
    return train, val, test


def load_data(context: Context) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    """``make_client_app``'s loader: this node's samples (node config ``partition-id``,
    which the simulation engine and ``InProcessGrid`` set)."""
    return partition(
        int(context.run_config["seed"]),
        int(context.node_config["partition-id"]),
        int(context.run_config["samples-per-node"]),
        float(context.run_config["noise"]),
    )
