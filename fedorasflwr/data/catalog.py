"""What is known about each dataset without loading it: kind, classes, shape, columns.

``dataset_info`` is what the server builds the search space from, so it must stay
cheap: it reads no samples (a local folder is inspected by listing it and opening
its image headers: `.folder.inspect_folder`, kept while the folder is unchanged).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from .folder import FOLDER_PREFIX, folder_classes, inspect_folder
from .folder import IMAGE_SUFFIXES as IMAGE_SUFFIXES  # their home was here: still found here
from .folder import folder_image_shape as folder_image_shape
from .folder import folder_root as folder_root
from .text import OOV_ID, VOCAB, num_windows

__all__ = [
    "DATASETS",
    "SPEECH_COMMANDS_12",
    "speech_commands_12_ids",
    "FOLDER_PREFIX",
    "PARTITIONERS",
    "LABELLED_PARTITIONERS",
    "DatasetInfo",
    "DatasetChoice",
    "DatasetEntry",
    "carved_global_fraction",
    "dataset_entry",
    "dataset_info",
    "num_classes_of",
    "num_client_samples",
    "text_num_windows",
    "folder_classes",
]

PARTITIONERS = ("iid", "dirichlet", "class-groups", "natural", "sampled")
LABELLED_PARTITIONERS = ("dirichlet", "class-groups")


class DatasetChoice(Protocol):
    """What this module reads of a ``DataSpec`` (``spec`` imports this module, not back)."""

    @property
    def dataset(self) -> str: ...

    @property
    def seq_len(self) -> int: ...

    @property
    def server_fraction(self) -> float: ...

    @property
    def global_test(self) -> bool: ...

    @property
    def global_test_fraction(self) -> float: ...


@dataclass(frozen=True)
class DatasetInfo:
    """Shape of the learning problem, for building a search space.

    Attributes
    ----------
    name : str
        The ``data.dataset`` value.
    kind : str
        ``"image"`` (float tensors ``(C, H, W)``; speech MFCCs count as 1-channel
        images) or ``"text"`` (int64 character ids ``(seq_len,)``).
    num_classes : int
        Output classes; for text the vocabulary size including the OOV id.
    input_shape : tuple of int
        Shape of one input sample.
    vocab : str or None
        Text only: character ``i`` of ``vocab`` has id ``i``; id ``len(vocab)`` is OOV.
    """

    name: str
    kind: str
    num_classes: int
    input_shape: tuple[int, ...]
    vocab: str | None = None


@dataclass(frozen=True)
class DatasetEntry:
    """Static facts about one dataset (internal to the data layer)."""

    kind: str
    num_classes: int | None
    input_shape: tuple[int, ...] | None  # None: text (seq_len,) or a folder (read it)
    label_column: str | None
    natural_column: str | None
    hub_id: str | None = None
    subset: str | None = None
    num_train: int | None = None  # samples in the split that is partitioned, if fixed
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    test_split: str | None = None  # the source's own test split (the global test set)


# Normalisation: the usual per-channel statistics of each dataset's training set
# (MNIST's also match mnist5k: 0.1313 / 0.3086). Folders use 0.5 / 0.5.
_ENTRIES: dict[str, DatasetEntry] = {
    "mnist5k": DatasetEntry(
        "image", 10, (1, 28, 28), "label", None, num_train=5000, mean=(0.1307,), std=(0.3081,)
    ),
    "pydoc-topics": DatasetEntry("text", OOV_ID + 1, None, None, "topic"),
    "cifar10": DatasetEntry(
        "image",
        10,
        (3, 32, 32),
        "label",
        None,
        hub_id="uoft-cs/cifar10",
        num_train=50000,
        test_split="test",
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
    ),
    "cifar100": DatasetEntry(
        "image",
        100,
        (3, 32, 32),
        "fine_label",
        None,
        hub_id="uoft-cs/cifar100",
        num_train=50000,
        test_split="test",
        mean=(0.5071, 0.4865, 0.4409),
        std=(0.2673, 0.2564, 0.2762),
    ),
    # 35 keywords: the "_silence_" clips (no speaker) are dropped, as in FedorAS.
    "speech-commands": DatasetEntry(
        "image",
        35,
        (1, 40, 51),
        "label",
        "speaker_id",
        "speech_commands",
        "v0.02",
        test_split="test",
    ),
    # The 12-class task (FedorAS's main table; Warden 2018): the 10 keywords, "unknown" (the
    # other 25 words) and "silence" (the "_silence_" clips, kept): SPEECH_COMMANDS_12.
    "speech-commands-12": DatasetEntry(
        "image",
        12,
        (1, 40, 51),
        "label",
        "speaker_id",
        "speech_commands",
        "v0.02",
        test_split="test",
    ),
    "shakespeare": DatasetEntry(
        "text", OOV_ID + 1, None, None, "character_id", "flwrlabs/shakespeare"
    ),
}
DATASETS = tuple(_ENTRIES)

#: The classes of ``speech-commands-12`` in id order: the ten keywords, then the
#: other 25 words as "unknown" and the background-noise clips as "silence".
SPEECH_COMMANDS_12 = (
    "yes",
    "no",
    "up",
    "down",
    "left",
    "right",
    "on",
    "off",
    "stop",
    "go",
    "unknown",
    "silence",
)
SPEECH_SILENCE = "_silence_"  # the hub's label of the background-noise clips


def speech_commands_12_ids(names: Sequence[str]) -> list[int]:
    """The ``speech-commands-12`` id of each of the hub's label ``names``: a keyword's own
    id, ``"_silence_"`` -> "silence", any other word -> "unknown"."""
    keywords = SPEECH_COMMANDS_12[:10]
    return [
        keywords.index(name)
        if name in keywords
        else SPEECH_COMMANDS_12.index("silence" if name == SPEECH_SILENCE else "unknown")
        for name in names
    ]


_FOLDER = DatasetEntry("image", None, None, "label", None, mean=(0.5,), std=(0.5,))


def dataset_entry(dataset: str) -> DatasetEntry | None:
    """The static entry of ``dataset`` (``None`` if unknown)."""
    if dataset.startswith(FOLDER_PREFIX) and dataset[len(FOLDER_PREFIX) :].strip():
        return _FOLDER
    return _ENTRIES.get(dataset)


def num_classes_of(dataset: str) -> int | None:
    """Class count known without touching the disk (``None`` for a folder)."""
    entry = dataset_entry(dataset)
    return None if entry is None else entry.num_classes


def dataset_info(spec: DatasetChoice) -> DatasetInfo:
    """Kind, classes and input shape of ``spec.dataset``; reads no samples.

    ``mnist5k`` -> image, 10, ``(1, 28, 28)``; ``pydoc-topics`` / ``shakespeare`` ->
    text, 98 (97 printable characters + OOV), ``(seq_len,)``; ``cifar10`` /
    ``cifar100`` -> image, 10 / 100, ``(3, 32, 32)``; ``speech-commands`` -> image
    (MFCC), 35, ``(1, 40, 51)``; ``speech-commands-12`` -> the same with 12 classes;
    ``folder:<path>`` -> image, its sub-directory count, its images' ``(C, H, W)``
    (`.folder.inspect_folder`, which refuses a folder the run could not use).
    """
    entry = dataset_entry(spec.dataset)
    if entry is None:  # unreachable for a validated spec
        raise ValueError(f"run config 'data.dataset' = {spec.dataset!r} is unknown")
    if entry.kind == "text":
        return DatasetInfo(spec.dataset, "text", OOV_ID + 1, (spec.seq_len,), VOCAB)
    if entry is _FOLDER:
        folder = inspect_folder(spec.dataset)
        return DatasetInfo(spec.dataset, "image", len(folder.classes), folder.shape)
    assert entry.num_classes is not None and entry.input_shape is not None
    return DatasetInfo(spec.dataset, "image", entry.num_classes, entry.input_shape)


@lru_cache(maxsize=4)
def _pydoc_topic_lengths() -> tuple[tuple[str, int], ...]:
    from pydoc_data.topics import topics

    return tuple(sorted((name, len(text)) for name, text in topics.items()))


def text_num_windows(dataset: str, seq_len: int) -> dict[str, int] | None:
    """Windows per natural id, when cheap to know (pydoc-topics only)."""
    if dataset != "pydoc-topics":
        return None
    return {name: num_windows(length, seq_len) for name, length in _pydoc_topic_lengths()}


def carved_global_fraction(spec: DatasetChoice) -> float:
    """The fraction of the rows left after the server slice that is carved out as the global
    test set: ``global_test_fraction`` when the global test set is on and the dataset has no
    test split of its own, else 0."""
    entry = dataset_entry(spec.dataset)
    if not spec.global_test or entry is None or entry.test_split is not None:
        return 0.0
    return float(spec.global_test_fraction)


def _carved(count: int, fraction: float) -> int:
    return math.floor(fraction * count + 1e-9)  # as partition.server_split_indices floors


def num_client_samples(spec: DatasetChoice) -> int | None:
    """Samples left for the clients once the server slice (and a carved global test set,
    ``carved_global_fraction``) is removed, when known cheaply.

    Exact for pydoc-topics (floor per topic) and for datasets with equal class counts
    (mnist5k, cifar); ``None`` when only loading the data would tell.
    """
    carve = carved_global_fraction(spec)
    counts = text_num_windows(spec.dataset, spec.seq_len)
    if counts is not None:
        rest = [n - math.floor(spec.server_fraction * n) for n in counts.values()]
        return sum(n - _carved(n, carve) for n in rest)
    entry = dataset_entry(spec.dataset)
    if entry is None or entry.num_train is None:
        return None
    if carve == 0:
        return entry.num_train - math.floor(spec.server_fraction * entry.num_train)
    assert entry.num_classes is not None
    per_class = entry.num_train // entry.num_classes
    rest = per_class - math.floor(spec.server_fraction * per_class)
    return entry.num_classes * (rest - _carved(rest, carve))
