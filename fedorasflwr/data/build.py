"""Build a client's partition or the server slice from scratch (the cache-miss path).

Offline datasets are partitioned as an index table with the very functions the
online ``FederatedDataset`` path uses (:mod:`.partition`); only where the rows
come from and how they become tensors differ. Imports ``datasets`` and
``flwr_datasets`` (through :mod:`.partition`), so it is imported lazily.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Dataset, DatasetDict
from datasets.utils import (
    are_progress_bars_disabled,
    disable_progress_bars,
    enable_progress_bars,
)
from flwr_datasets.partitioner import Partitioner

from . import offline
from .catalog import dataset_entry, dataset_info
from .partition import (
    GLOBAL_TEST_SPLIT,
    SERVER_SPLIT,
    build_partitioner,
    client_split_indices,
    column_values,
    load_partition,
    make_preprocessor,
)
from .spec import DataSpec

__all__ = ["build_client", "build_global_test", "build_server", "offline_splits"]


@contextmanager
def _quiet() -> Iterator[None]:
    """No ``datasets`` progress bars for index bookkeeping (restored afterwards)."""
    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            enable_progress_bars()


def offline_splits(spec: DataSpec, num_partitions: int | None) -> DatasetDict:
    """The offline index table after :func:`.partition.make_preprocessor`."""
    entry = dataset_entry(spec.dataset)
    assert entry is not None
    stratify = entry.label_column or entry.natural_column
    preprocess = make_preprocessor(spec, stratify, entry.natural_column, num_partitions)
    return preprocess(DatasetDict({"train": offline.index_table(spec)}))


@lru_cache(maxsize=4)
def _offline_partitioner(spec: DataSpec, num_partitions: int) -> Partitioner:
    """One partitioner per spec and count in a process: it assigns every client's rows
    on its first ``load_partition`` and keeps them, so the clients of one process (the
    in-process grid, a test loading every client) partition the table once, not once each
    (before, loading the 50 clients of a Dirichlet split drew the assignment 50 times)."""
    entry = dataset_entry(spec.dataset)
    assert entry is not None
    partitioner = build_partitioner(spec, entry.label_column, num_partitions)
    partitioner.dataset = offline_splits(spec, num_partitions)["train"]
    return partitioner


def _offline_rows(spec: DataSpec, partition_id: int, num_partitions: int) -> Dataset:
    partitioner = _offline_partitioner(spec, num_partitions)
    return load_partition(spec, partitioner.load_partition, partition_id, num_partitions)


def _tensors(spec: DataSpec, rows: Dataset, positions: np.ndarray) -> list[torch.Tensor]:
    if spec.dataset in offline.OFFLINE_DATASETS:
        return list(offline.gather(spec, column_values(rows, "index")[positions]))
    from . import online

    return list(online.to_tensors(spec, rows.select(positions)))


def build_client(
    spec: DataSpec, partition_id: int, num_partitions: int, cache_dir: Path
) -> dict[str, Any]:
    """Cache payload of one client: ``train`` / ``val`` / ``test`` as ``[x, y]``, label counts."""
    if spec.dataset in offline.OFFLINE_DATASETS:
        with _quiet():
            rows = _offline_rows(spec, partition_id, num_partitions)
    else:
        from . import online

        rows = online.client_rows(spec, partition_id, num_partitions, cache_dir)
    num_classes = dataset_info(spec).num_classes
    payload: dict[str, Any] = {"num-classes": num_classes}
    for name, positions in client_split_indices(len(rows), spec, partition_id).items():
        payload[name] = _tensors(spec, rows, positions)
    targets = payload["train"][1].reshape(-1)
    payload["label-counts"] = torch.bincount(targets, minlength=num_classes).tolist()
    return payload


def build_server(spec: DataSpec, cache_dir: Path) -> dict[str, Any]:
    """Cache payload of the server slice: ``server`` as ``[x, y]``."""
    if spec.dataset in offline.OFFLINE_DATASETS:
        with _quiet():
            rows = offline_splits(spec, None)[SERVER_SPLIT]
    else:
        from . import online

        rows = online.server_rows(spec, cache_dir)
    return {"server": _tensors(spec, rows, np.arange(len(rows)))}


def build_global_test(spec: DataSpec, cache_dir: Path) -> dict[str, Any]:
    """Cache payload of the global test set: ``global-test`` as ``[x, y]``."""
    if spec.dataset in offline.OFFLINE_DATASETS:
        with _quiet():
            rows = offline_splits(spec, None)[GLOBAL_TEST_SPLIT]
    else:
        from . import online

        rows = online.global_test_rows(spec, cache_dir)
    return {GLOBAL_TEST_SPLIT: _tensors(spec, rows, np.arange(len(rows)))}
