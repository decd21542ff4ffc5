"""Server slice, partitioners and per-client splits: the code the offline and online paths share.

The pipeline on a ``datasets.Dataset`` (the offline index table, or the hub's
``train`` split inside ``flwr_datasets.FederatedDataset``):

1. :func:`make_preprocessor` removes the server slice (seeded, stratified by
   label or natural id, floor per stratum) *before* partitioning, puts the rest in
   a seeded random order, and, for natural partitions, adds a column mapping each
   natural id (sorted) round-robin to a client. It is a ``FederatedDataset``
   preprocessor: ``DatasetDict -> DatasetDict`` with splits ``train`` and ``server``.
2. :func:`build_partitioner` returns flwr-datasets' own partitioner
   (``IidPartitioner``, ``DirichletPartitioner``, ``NaturalIdPartitioner`` - with a
   vectorised id scan, :class:`NaturalIdColumnPartitioner`) or
   :class:`ClassGroupPartitioner` for the FDNAS split, or :class:`SampledPartitioner`
   (overlapping partitions drawn on their own, for more clients than rows).
3. :func:`load_partition` loads one partition, turning flwr-datasets' failures into
   errors that name the run-config key; :func:`client_split_indices` then splits it
   into train / val / test with a generator seeded by ``(seed, partition id)``.

This module imports ``datasets`` and ``flwr_datasets``; it is imported only when a
partition has to be built (a cache miss), never on a cache hit.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np
from datasets import Dataset, DatasetDict
from flwr_datasets.partitioner import (
    DirichletPartitioner,
    IidPartitioner,
    NaturalIdPartitioner,
    Partitioner,
)

from ..seeding import numpy_stream
from .catalog import dataset_entry
from .groups import even_sizes
from .spec import DataSpec

__all__ = [
    "SERVER_SPLIT",
    "GLOBAL_TEST_SPLIT",
    "NATURAL_COLUMN",
    "column_values",
    "ClassGroupPartitioner",
    "NaturalIdColumnPartitioner",
    "SampledPartitioner",
    "make_preprocessor",
    "build_partitioner",
    "load_partition",
    "client_split_indices",
    "server_split_indices",
    "global_test_indices",
]

SERVER_SPLIT = "server"
GLOBAL_TEST_SPLIT = "global-test"
NATURAL_COLUMN = "natural-partition"
_EPS = 1e-9  # so that 0.1 * 70 counts as 7, not 7.000000000000001 or 6.999...


def column_values(table: Dataset, name: str) -> np.ndarray:
    """Column ``name`` of ``table`` as a numpy array (through Arrow: ~10x faster than a list)."""
    return table.with_format("arrow")[name].to_numpy(zero_copy_only=False)


def _as_keys(values: Sequence[object] | np.ndarray) -> np.ndarray:
    """Sortable array of column values (``None`` and mixed objects become strings)."""
    array = np.asarray(values)
    return array.astype(str) if array.dtype.kind == "O" else array


def _pick_per_stratum(
    rng: np.random.Generator, strata: Sequence[object] | np.ndarray, fraction: float
) -> np.ndarray:
    """Positions (sorted) of ``floor(fraction * n_s)`` rows drawn from every stratum ``s``."""
    _, inverse = np.unique(_as_keys(strata), return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse))[:-1]
    chosen = [
        rng.choice(rows, size=math.floor(fraction * len(rows) + _EPS), replace=False)
        for rows in np.split(order, bounds)
    ]
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


def server_split_indices(
    strata: Sequence[object] | np.ndarray, fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rows kept for the clients (seeded random order) and server rows (sorted).

    ``floor(fraction * n_s)`` rows of every stratum ``s`` go to the server, chosen by
    a generator seeded by ``seed`` alone: the slice never depends on the partitioning.
    """
    rng = numpy_stream(seed, "server-split")
    server = _pick_per_stratum(rng, strata, fraction)
    keep = np.ones(len(strata), dtype=bool)
    keep[server] = False
    return rng.permutation(np.flatnonzero(keep)), server


def global_test_indices(
    strata: Sequence[object] | np.ndarray, rest: np.ndarray, fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The global test set carved out of the client rows ``rest`` (``server_split_indices``'
    first value): ``(rest without it, in rest's order; its rows, sorted)``.

    ``floor(fraction * m_s)`` of the ``m_s`` rows of every stratum ``s`` in ``rest``, drawn
    by a generator seeded by ``seed`` alone (its own stream, so the server slice is the same
    with or without it): disjoint from the server slice, and no client ever sees them.
    """
    picked = _pick_per_stratum(
        numpy_stream(seed, "global-test-split"), np.asarray(strata)[rest], fraction
    )
    held = np.zeros(len(rest), dtype=bool)
    held[picked] = True
    return rest[~held], np.sort(rest[held])


def make_preprocessor(
    spec: DataSpec,
    stratify_column: str | None,
    natural_column: str | None,
    num_partitions: int | None,
) -> Callable[[DatasetDict], DatasetDict]:
    """``DatasetDict -> {"train": client rows, "server": server slice}`` for ``spec``.

    Only the input's ``train`` split is partitioned. With ``spec.global_test`` the output
    also has :data:`GLOBAL_TEST_SPLIT`: the input's own test split (the catalog's
    ``test_split``) when the dataset has one, else the rows ``global_test_indices`` carves
    out of the client rows. With ``num_partitions`` given and a natural partitioner, the
    client rows gain :data:`NATURAL_COLUMN`: the rank of the row's natural id among the
    sorted ids, modulo ``num_partitions``.
    """
    entry = dataset_entry(spec.dataset)
    assert entry is not None

    def preprocess(splits: DatasetDict) -> DatasetDict:
        table = splits["train"]
        strata = column_values(table, stratify_column) if stratify_column else np.zeros(len(table))
        rest, server = server_split_indices(strata, spec.server_fraction, spec.seed)
        held: Dataset | None = None
        if spec.global_test and entry.test_split is not None:
            held = splits[entry.test_split]
        elif spec.global_test:
            rest, carved = global_test_indices(strata, rest, spec.global_test_fraction, spec.seed)
            held = table.select(carved)
        if spec.partitioner == "natural" and num_partitions is not None:
            assert natural_column is not None
            # Before select(): adding a column to a selection copies the table. Ids are
            # ranked over all rows; when the slice is stratified by natural id (text) it
            # takes floor(f * n) < n rows of each, so every id keeps rows.
            table = _add_natural_partition(table, natural_column, num_partitions)
        out = {"train": table.select(rest), SERVER_SPLIT: table.select(server)}
        if held is not None:
            out[GLOBAL_TEST_SPLIT] = held
        return DatasetDict(out)

    return preprocess


def _add_natural_partition(table: Dataset, natural_column: str, num_partitions: int) -> Dataset:
    ids, inverse = np.unique(_as_keys(column_values(table, natural_column)), return_inverse=True)
    if num_partitions > len(ids):
        raise ValueError(
            f"num-partitions = {num_partitions} is too many for run config 'data.partitioner' ="
            f" 'natural': the data has {len(ids)} natural ids ({natural_column!r}); use <="
            f" {len(ids)} or 'data.partitioner' = 'iid'"
        )
    return table.add_column(NATURAL_COLUMN, (inverse % num_partitions).tolist())


class ClassGroupPartitioner(Partitioner):
    """The FDNAS class-group split: each client sees only its group's classes.

    Clients ``0..num_partitions-1`` are split evenly and in order over the groups
    (remainder to the last groups: 10 clients over 3 groups -> 3, 3, 4). Each
    group's samples are shuffled (seeded) and split IID among its clients. Samples
    whose class is in no group are not used.

    Parameters
    ----------
    num_partitions : int
        Number of clients, at least the number of groups.
    partition_by : str
        Label column.
    groups : sequence of sequence of int
        Disjoint class groups, e.g. ``((0, 1, 2), (3, 4, 5), (6, 7, 8, 9))``.
    seed : int
        Seeds the within-group shuffle.
    """

    def __init__(
        self, num_partitions: int, partition_by: str, groups: Sequence[Sequence[int]], seed: int
    ) -> None:
        super().__init__()
        if not 1 <= len(groups) <= num_partitions:
            raise ValueError(
                f"num-partitions = {num_partitions} is too few for {len(groups)} class groups:"
                " every group needs >= 1 client"
            )
        self._num_partitions = num_partitions
        self._partition_by = partition_by
        self._groups = tuple(tuple(group) for group in groups)
        self._seed = seed
        self._indices: list[np.ndarray] | None = None

    @property
    def num_partitions(self) -> int:
        """Total number of partitions."""
        return self._num_partitions

    def group_of(self, partition_id: int) -> int:
        """Index of the class group client ``partition_id`` belongs to."""
        ends = np.cumsum(even_sizes(self._num_partitions, len(self._groups)))
        return int(np.searchsorted(ends, partition_id, side="right"))

    def _assign(self) -> list[np.ndarray]:
        rng = numpy_stream(self._seed, "natural-groups")
        labels = column_values(self.dataset, self._partition_by)
        assigned: list[np.ndarray] = []
        sizes = even_sizes(self._num_partitions, len(self._groups))
        for group, clients in zip(self._groups, sizes, strict=True):
            rows = rng.permutation(np.flatnonzero(np.isin(labels, group)))
            assigned.extend(np.array_split(rows, clients))
        return assigned

    def load_partition(self, partition_id: int) -> Dataset:
        """The rows of client ``partition_id``."""
        if self._indices is None:
            self._indices = self._assign()
        return self.dataset.select(self._indices[partition_id])


class NaturalIdColumnPartitioner(NaturalIdPartitioner):
    """flwr-datasets' ``NaturalIdPartitioner`` with its scan of the id column vectorised.

    Same partitions (partition ``i`` holds the rows of the ``i``-th smallest id); the
    stock scan walks the column row by row (~20 us a row, a minute per client on
    Shakespeare's 3.3M rows), this one reads it once through Arrow.
    """

    def _create_int_partition_id_to_natural_id(self) -> None:
        ids = np.unique(_as_keys(column_values(self.dataset, self._partition_by)))
        self._partition_id_to_natural_id = dict(enumerate(ids.tolist()))

    def _create_partition_id_to_indices(self) -> None:
        values = _as_keys(column_values(self.dataset, self._partition_by))
        ids, inverse = np.unique(values, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        rows = np.split(order, np.cumsum(np.bincount(inverse))[:-1])
        self._partition_id_to_indices = {
            self._natural_id_to_partition_id[natural_id]: indices
            for natural_id, indices in zip(ids.tolist(), rows, strict=True)
        }


class SampledPartitioner(Partitioner):
    """Every partition is ``partition_size`` distinct rows drawn uniformly, on its own.

    Partitions overlap (a row can be in many of them), so there can be more partitions
    than rows: a stand-in for a very large federation on a small dataset. Partition ``i``
    is drawn from the named stream ``(seed, "sampled-partition", i)``: it does not depend
    on how many partitions there are, nor on which were loaded before.
    """

    def __init__(self, num_partitions: int, partition_size: int, seed: int) -> None:
        super().__init__()
        self._num_partitions = num_partitions
        self._size = partition_size
        self._seed = seed

    @property
    def num_partitions(self) -> int:
        """Total number of partitions."""
        return self._num_partitions

    def load_partition(self, partition_id: int) -> Dataset:
        """The rows of client ``partition_id``, in dataset order."""
        rows = self.dataset.num_rows
        if self._size > rows:
            raise ValueError(
                f"run config 'data.partition-size' = {self._size} is more than the {rows}"
                " rows the clients share"
            )
        rng = numpy_stream(self._seed, "sampled-partition", partition_id)
        return self.dataset.select(np.sort(rng.choice(rows, size=self._size, replace=False)))


def build_partitioner(spec: DataSpec, label_column: str | None, num_partitions: int) -> Partitioner:
    """The flwr-datasets partitioner of ``spec.partitioner`` for ``num_partitions`` clients.

    Dirichlet uses ``partition_by=label_column``, ``seed=spec.seed``, no
    self-balancing, and ``min_partition_size = spec.min_partition_size()`` (enough
    for non-empty train / val / test); flwr-datasets redraws up to 10 times to meet it.
    """
    if spec.partitioner == "iid":
        return IidPartitioner(num_partitions)
    if spec.partitioner == "natural":
        return NaturalIdColumnPartitioner(partition_by=NATURAL_COLUMN)
    if spec.partitioner == "sampled":
        return SampledPartitioner(num_partitions, spec.partition_size, spec.seed)
    assert label_column is not None  # DataSpec.validate rejects labelled splits of text
    if spec.partitioner == "dirichlet":
        return DirichletPartitioner(
            num_partitions,
            partition_by=label_column,
            alpha=float(spec.alpha),
            min_partition_size=spec.min_partition_size(),
            self_balancing=False,
            shuffle=True,
            seed=spec.seed,
        )
    return ClassGroupPartitioner(num_partitions, label_column, spec.class_group_layout(), spec.seed)


def load_partition(
    spec: DataSpec, load: Callable[[int], Dataset], partition_id: int, num_partitions: int
) -> Dataset:
    """``load(partition_id)`` (a partitioner's or a ``FederatedDataset``'s), checked.

    Raises
    ------
    ValueError
        If the Dirichlet draws cannot give every client ``spec.min_partition_size()``
        samples, or the partition is too small for train / val / test.
    """
    need = spec.min_partition_size()
    try:
        with warnings.catch_warnings():
            # flwr-datasets warns on every Dirichlet redraw; the outcome is what matters.
            warnings.simplefilter("ignore", UserWarning)
            partition = load(partition_id)
    except ValueError as err:
        if spec.partitioner != "dirichlet":
            raise
        raise ValueError(
            f"run config 'data.alpha' = {spec.alpha} with num-partitions = {num_partitions}:"
            f" 10 Dirichlet draws (seed {spec.seed}) all left some client with fewer than"
            f" {need} samples (train/val/test); raise data.alpha, lower num-partitions or"
            f" change data.seed ({err})"
        ) from err
    if len(partition) < need:
        raise ValueError(
            f"partition {partition_id} of num-partitions = {num_partitions} has"
            f" {len(partition)} samples, fewer than the {need} train/val/test need"
            f" (run config 'data.partitioner' = {spec.partitioner!r}); use fewer partitions"
        )
    return partition


def _split_count(size: int, fraction: float) -> int:
    return 0 if fraction == 0 else max(1, round(fraction * size))


def client_split_indices(size: int, spec: DataSpec, partition_id: int) -> dict[str, np.ndarray]:
    """Positions of a client's ``train`` / ``val`` / ``test`` rows in its partition.

    ``val`` and ``test`` get ``round(fraction * size)`` rows, at least one when the
    fraction is positive; ``train`` the rest. Seeded by ``(spec.seed, partition_id)``.
    """
    rng = numpy_stream(spec.seed, "client-split", partition_id)
    order = rng.permutation(size)
    num_val = _split_count(size, spec.val_fraction)
    num_test = _split_count(size, spec.test_fraction)
    if size - num_val - num_test < 1:
        raise ValueError(
            f"partition {partition_id} has {size} samples: run config 'data.val-fraction' ="
            f" {spec.val_fraction} and 'data.test-fraction' = {spec.test_fraction} leave no"
            " training sample; lower them or use fewer partitions"
        )
    return {
        "train": order[num_val + num_test :],
        "val": order[num_test : num_test + num_val],
        "test": order[:num_test],
    }
