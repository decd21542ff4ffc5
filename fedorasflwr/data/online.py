"""Datasets loaded with ``flwr_datasets.FederatedDataset`` (Hugging Face hub, or a local folder).

Every dataset goes through the same steps as the offline ones::

    FederatedDataset(
        dataset=<hub id | "imagefolder">, subset=<config>,
        preprocessor=make_preprocessor(...),          # server slice removed first
        partitioners={"train": build_partitioner(...)},
        shuffle=False,                                # the preprocessor orders rows (seeded)
    ).load_partition(partition_id)

============== ======================== =============== ================ ==================
dataset        hub id (subset)          input column    label column     natural id
============== ======================== =============== ================ ==================
cifar10        uoft-cs/cifar10          ``img``         ``label``        -
cifar100       uoft-cs/cifar100         ``img``         ``fine_label``   -
speech-        speech_commands (v0.02)  ``audio``       ``label``        ``speaker_id``
commands(-12)
shakespeare    flwrlabs/shakespeare     ``x``, ``y``    -                ``character_id``
folder:<path>  imagefolder              ``image``       ``label``        -
============== ======================== =============== ================ ==================

Only the ``train`` split is partitioned: clients split their partitions into train / val /
test and the server slice comes out of it too. A hub ``test`` split is used only as the
global test set (``data.global-test``: cifar10, cifar100, speech-commands(-12)); the
datasets without one (shakespeare, folders) carve it out of ``train`` before partitioning.
Conversions: CIFAR images scaled to [0, 1] and normalised with the per-channel
statistics in :mod:`.catalog`; folder images (checked before anything runs:
:mod:`.folder`, which refuses images of different sizes) converted to L when every image
is grayscale, else RGB, normalised with mean 0.5 / std 0.5; speech clips (the
``_silence_`` class, which has no speaker, is dropped: 35 keywords; ``speech-commands-12``
keeps it as "silence", each such clip its own natural id ``_silence_<row>`` so natural
partitions spread them over the clients, and maps the other 25 words to "unknown") turned into
``1 x 40 x 51`` MFCCs by :func:`.audio.mfcc` (WAV bytes read with the stdlib ``wave``
module, so neither torchaudio nor torchcodec is needed); Shakespeare's LEAF samples (80
characters ``x`` and the next one ``y``, sliding by one character, so neighbouring
samples overlap) become ``x[-seq_len:]`` and its shifted targets.

The hub paths could not be exercised where this was written (no network): the
folder path runs through ``FederatedDataset`` in the tests, and the conversions
and partitioning run there on local tables with the hub's column layout. Hub
datasets need network access on first use and are cached by ``datasets``
(``$HF_DATASETS_CACHE``); a folder's Arrow cache goes under ``<cache dir>/hf``. The
disk cache of prepared partitions is keyed by the spec only: clear it if a
folder's content changes.
"""

from __future__ import annotations

import io
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Audio, Dataset, DatasetDict
from flwr_datasets import FederatedDataset
from flwr_datasets.partitioner import Partitioner

from .audio import mfcc
from .catalog import SPEECH_SILENCE, DatasetEntry, dataset_entry, speech_commands_12_ids
from .folder import FOLDER_PREFIX, folder_image_shape, folder_root
from .partition import (
    GLOBAL_TEST_SPLIT,
    SERVER_SPLIT,
    build_partitioner,
    load_partition,
    make_preprocessor,
)
from .spec import DataSpec
from .text import OOV_ID, encode

__all__ = ["federated_dataset", "client_rows", "global_test_rows", "server_rows", "to_tensors"]


def _entry(spec: DataSpec) -> DatasetEntry:
    entry = dataset_entry(spec.dataset)
    assert entry is not None
    return entry


def _drop_silence(splits: DatasetDict, test: bool = False) -> DatasetDict:
    """``train`` without the ``_silence_`` clips; with ``test`` (the global test set's
    source, ``data.global-test``) the ``test`` split too, else it is left out (not filtered)."""
    silence = splits["train"].features["label"].names.index("_silence_")
    names = ("train", "test") if test else ("train",)
    return DatasetDict(
        {
            name: splits[name].filter(lambda label: label != silence, input_columns="label")
            for name in names
        }
    )


def _silence_speakers(splits: DatasetDict) -> DatasetDict:
    """Give each ``_silence_`` clip (no speaker) its own natural id ``_silence_<row>``, so a
    natural partitioning spreads them over the clients instead of one client of ``None``."""
    train = splits["train"]
    silence = train.features["label"].names.index(SPEECH_SILENCE)
    # a new column in memory: ``map`` would rewrite the whole table, audio included
    speakers = [
        f"{SPEECH_SILENCE}{row}" if label == silence else speaker
        for row, (label, speaker) in enumerate(
            zip(train["label"], train["speaker_id"], strict=True)
        )
    ]
    named = train.remove_columns("speaker_id").add_column("speaker_id", speakers)
    return DatasetDict({"train": named, **({"test": splits["test"]} if "test" in splits else {})})


def federated_dataset(
    spec: DataSpec, num_partitions: int | None, cache_dir: Path
) -> FederatedDataset:
    """The ``FederatedDataset`` of ``spec`` (``num_partitions=None``: server slice only)."""
    entry = _entry(spec)
    stratify = entry.label_column or entry.natural_column
    prepare = make_preprocessor(spec, stratify, entry.natural_column, num_partitions)
    if spec.dataset == "speech-commands":

        def preprocess(splits: DatasetDict) -> DatasetDict:
            return prepare(_drop_silence(splits, spec.global_test))
    elif spec.dataset == "speech-commands-12":

        def preprocess(splits: DatasetDict) -> DatasetDict:
            return prepare(_silence_speakers(splits))
    else:
        preprocess = prepare
    kwargs: dict[str, Any] = {}
    path, subset = entry.hub_id, entry.subset
    if spec.dataset.startswith(FOLDER_PREFIX):
        path = "imagefolder"
        kwargs = {"data_dir": str(folder_root(spec.dataset)), "cache_dir": str(cache_dir / "hf")}
    # The server slice needs no partitioner; FederatedDataset wants one: 1 IID partition.
    partitioner: Partitioner | int = 1
    if num_partitions is not None:
        partitioner = build_partitioner(spec, entry.label_column, num_partitions)
    return FederatedDataset(
        dataset=path,
        subset=subset,
        preprocessor=preprocess,
        partitioners={"train": partitioner},
        shuffle=False,
        **kwargs,
    )


def client_rows(spec: DataSpec, partition_id: int, num_partitions: int, cache_dir: Path) -> Dataset:
    """The rows of client ``partition_id`` (before its train / val / test split)."""
    fds = federated_dataset(spec, num_partitions, cache_dir)
    fds.load_split("train")  # download + preprocess outside the partitioner's error handling
    return load_partition(spec, fds.load_partition, partition_id, num_partitions)


def server_rows(spec: DataSpec, cache_dir: Path) -> Dataset:
    """The rows of the held-out server slice."""
    return federated_dataset(spec, None, cache_dir).load_split(SERVER_SPLIT)


def global_test_rows(spec: DataSpec, cache_dir: Path) -> Dataset:
    """The rows of the global test set (``spec.global_test``): the hub's test split, or the
    rows carved out before partitioning where the dataset has none."""
    return federated_dataset(spec, None, cache_dir).load_split(GLOBAL_TEST_SPLIT)


def _images(values: Sequence[Any], shape: tuple[int, ...], entry: DatasetEntry) -> torch.Tensor:
    channels, height, width = shape
    mode = "L" if channels == 1 else "RGB"
    arrays = []
    for image in values:
        image = image.convert(mode)
        if image.size != (width, height):
            image = image.resize((width, height))
        arrays.append(np.asarray(image, dtype=np.uint8).reshape(height, width, channels))
    batch = np.stack(arrays).transpose(0, 3, 1, 2).astype(np.float32) / 255.0
    mean = np.asarray(entry.mean * channels if len(entry.mean) == 1 else entry.mean)
    std = np.asarray(entry.std * channels if len(entry.std) == 1 else entry.std)
    batch = (batch - mean[None, :, None, None]) / std[None, :, None, None]
    return torch.from_numpy(batch.astype(np.float32))


def _wav(audio: dict[str, Any]) -> np.ndarray:
    """Samples in [-1, 1) of a 16-bit PCM WAV file, read with the stdlib ``wave`` module.

    ``datasets`` >= 4 decodes audio with ``torchcodec``; reading the raw bytes keeps
    speech-commands free of both torchcodec and torchaudio.
    """
    source = io.BytesIO(audio["bytes"]) if audio.get("bytes") else audio["path"]
    with wave.open(source, "rb") as clip:
        if clip.getsampwidth() != 2 or clip.getnchannels() != 1 or clip.getframerate() != 16_000:
            raise ValueError(
                f"speech-commands clip {audio.get('path')!r}: expected 16 kHz mono 16-bit PCM,"
                f" got {clip.getframerate()} Hz, {clip.getnchannels()} channel(s),"
                f" {8 * clip.getsampwidth()}-bit"
            )
        frames = clip.readframes(clip.getnframes())
    return np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0


def _text(rows: Dataset, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    if len(rows) == 0:
        return torch.zeros(0, seq_len, dtype=torch.int64), torch.zeros(
            0, seq_len, dtype=torch.int64
        )
    ids = []
    for x, y in zip(rows["x"], rows["y"], strict=True):
        window = encode(x + y)[-(seq_len + 1) :]
        ids.append(np.pad(window, (seq_len + 1 - len(window), 0), constant_values=OOV_ID))
    stacked = np.stack(ids)
    return torch.from_numpy(stacked[:, :-1].copy()), torch.from_numpy(stacked[:, 1:].copy())


def to_tensors(spec: DataSpec, rows: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` tensors of hub / folder rows, in the layout of :func:`.offline.gather`."""
    entry = _entry(spec)
    if entry.kind == "text":
        return _text(rows, spec.seq_len)
    labels = torch.as_tensor(np.asarray(rows[entry.label_column], dtype=np.int64))
    if spec.dataset in ("speech-commands", "speech-commands-12"):
        if len(rows) == 0:
            return torch.zeros(0, 1, 40, 51), labels
        names = rows.features["label"].names
        if spec.dataset == "speech-commands-12":
            labels = torch.tensor(speech_commands_12_ids(names), dtype=torch.int64)[labels]
        else:  # 35 keyword ids whichever position "_silence_" (dropped) has in the hub's labels
            silence = names.index(SPEECH_SILENCE)
            labels = labels - (labels > silence).to(torch.int64)
        clips = [_wav(audio) for audio in rows.cast_column("audio", Audio(decode=False))["audio"]]
        length = max(16_000, *(len(clip) for clip in clips))
        padded = np.stack([np.pad(clip, (0, length - len(clip))) for clip in clips])
        return mfcc(torch.from_numpy(padded)), labels
    if spec.dataset.startswith(FOLDER_PREFIX):
        shape, column = folder_image_shape(spec.dataset), "image"
    else:
        assert entry.input_shape is not None
        shape, column = entry.input_shape, "img"
    if len(rows) == 0:
        return torch.zeros(0, *shape), labels
    return _images(rows[column], shape, entry), labels
