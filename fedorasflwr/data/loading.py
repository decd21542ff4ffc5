"""``load_client_data`` / ``load_server_data`` / ``load_global_test``: disk cache first,
build on a miss.

A cache hit reads one ``torch.load`` file and imports neither ``datasets``,
``flwr_datasets`` nor ``mlxtend``: the builders (:mod:`.build`) are imported only
on a miss.  A file is used only if its checksum matches and its content is in
range for the dataset (:mod:`.integrity`); a bad one is rebuilt with a WARNING
naming the file and the fault.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.utils.data import TensorDataset

from . import cache
from .catalog import DatasetInfo, dataset_info
from .integrity import client_problem, global_test_problem, server_problem
from .spec import DataSpec

__all__ = ["ClientData", "load_client_data", "load_global_test", "load_server_data"]

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClientData:
    """One client's data.

    Attributes
    ----------
    train, val, test : TensorDataset
        ``(x, y)`` pairs. Images: ``x`` float32 ``(N, C, H, W)`` (scaled to [0, 1], then
        normalised per channel), ``y`` int64 ``(N,)``. Text: ``x`` int64 ``(N, seq_len)``
        character ids, ``y`` int64 ``(N, seq_len)`` the next character at every position.
        ``val`` / ``test`` are empty only when their fraction is 0.
    num_classes : int
        Classes (text: vocabulary size, 98).
    label_counts : tuple of int
        Histogram of the training labels (text: of all next-character targets),
        length ``num_classes`` - what DecNAS clients share for grouping.
    """

    train: TensorDataset
    val: TensorDataset
    test: TensorDataset
    num_classes: int
    label_counts: tuple[int, ...]


def _check_partition_id(partition_id: int, num_partitions: int) -> None:
    if isinstance(partition_id, bool) or not isinstance(partition_id, int):
        raise ValueError(f"partition-id = {partition_id!r} is invalid: an integer")
    if not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"partition-id = {partition_id} is out of range: must be in"
            f" [0, num-partitions = {num_partitions})"
        )


def load_client_data(spec: DataSpec, partition_id: int, num_partitions: int) -> ClientData:
    """Train / val / test of client ``partition_id`` of ``num_partitions``.

    Same spec and ids, same tensors (seeded throughout). The server slice is never
    part of any client's data.

    Raises
    ------
    ValueError
        Before loading anything if ``num_partitions`` / ``partition_id`` cannot work
        for ``spec`` (see :meth:`DataSpec.check_partitionable`); when building, if the
        partitioner cannot give this client enough samples.
    """
    spec.check_partitionable(num_partitions)
    _check_partition_id(partition_id, num_partitions)

    def build() -> dict[str, Any]:
        from .build import build_client

        return build_client(spec, partition_id, num_partitions, cache.cache_root(spec))

    path = cache.client_path(spec, partition_id, num_partitions)
    return _client_data(_cached(path, dataset_info(spec), client_problem, build))


def _cached(
    path: Path,
    info: DatasetInfo,
    problem_of: Callable[[Mapping[str, Any], DatasetInfo], str | None],
    build: Callable[[], dict[str, Any]],
) -> dict[str, Any]:
    """The valid payload at ``path``, else a freshly built (and checked) one, cached."""
    payload = cache.read(path)
    if payload is not None:
        problem = problem_of(payload, info)
        if problem is None:
            return payload
        _LOG.warning("data cache file %s is invalid (%s): rebuilding it", path, problem)
    payload = build()
    problem = problem_of(payload, info)
    if problem is not None:  # a builder bug: never cache or train on such data
        raise RuntimeError(f"built data for {path.name} is invalid: {problem}")
    cache.write(path, payload)
    return payload


def _client_data(payload: dict[str, Any]) -> ClientData:
    return ClientData(
        train=TensorDataset(*payload["train"]),
        val=TensorDataset(*payload["val"]),
        test=TensorDataset(*payload["test"]),
        num_classes=int(payload["num-classes"]),
        label_counts=tuple(int(count) for count in payload["label-counts"]),
    )


def load_server_data(spec: DataSpec) -> TensorDataset:
    """The held-out server validation slice (``spec.server_fraction`` of the data).

    Identical for every partitioner and number of partitions: it depends only on
    the dataset, ``server_fraction``, ``seq_len`` and ``seed``. Empty when
    ``server_fraction`` is 0.
    """

    def build() -> dict[str, Any]:
        from .build import build_server

        return build_server(spec, cache.cache_root(spec))

    payload = _cached(cache.server_path(spec), dataset_info(spec), server_problem, build)
    return TensorDataset(*payload["server"])


def load_global_test(spec: DataSpec) -> TensorDataset:
    """The server's global test set (run config ``data.global-test`` = true): the dataset's
    own test split where it has one, else ``spec.global_test_fraction`` of the rows left
    after the server slice, carved out before partitioning (stratified, seeded by
    ``spec.seed``; disjoint from the server slice and from every client).

    Raises
    ------
    ValueError
        If ``spec.global_test`` is off (naming the key).
    """
    if not spec.global_test:
        raise ValueError(
            "run config 'data.global-test' = false: there is no global test set; set it to"
            " true to hold one on the server"
        )

    def build() -> dict[str, Any]:
        from .build import build_global_test

        return build_global_test(spec, cache.cache_root(spec))

    path = cache.global_test_path(spec)
    payload = _cached(path, dataset_info(spec), global_test_problem, build)
    return TensorDataset(*payload["global-test"])
