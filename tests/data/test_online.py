"""The online code path, driven offline: a local image folder through ``FederatedDataset``,
and hub-shaped local tables (Shakespeare, Speech Commands) through the same partitioning
and conversion code. Nothing here touches the network.
"""

from __future__ import annotations

import io
import wave
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from datasets import Audio, ClassLabel, Dataset, DatasetDict, Features, Value
from flwr_datasets.common import telemetry
from flwr_datasets.partitioner import NaturalIdPartitioner
from PIL import Image

from fedorasflwr.data import (
    DataSpec,
    dataset_info,
    load_client_data,
    load_global_test,
    load_server_data,
)
from fedorasflwr.data.audio import mel_filterbank, mfcc
from fedorasflwr.data.catalog import SPEECH_COMMANDS_12, speech_commands_12_ids
from fedorasflwr.data.online import _drop_silence, _silence_speakers, to_tensors
from fedorasflwr.data.partition import (
    SERVER_SPLIT,
    NaturalIdColumnPartitioner,
    build_partitioner,
    load_partition,
    make_preprocessor,
)
from fedorasflwr.data.text import decode


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No telemetry, no hub look-ups, whatever the environment says."""
    monkeypatch.setattr(telemetry, "FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    root = tmp_path / "images"
    for name in ("ant", "bee", "cat"):
        (root / name).mkdir(parents=True)
        for i in range(20):
            pixels = rng.integers(0, 256, size=(6, 5, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def test_folder_through_federated_dataset(image_folder: Path, tmp_path: Path) -> None:
    spec = DataSpec(
        dataset=f"folder:{image_folder}", partitioner="iid", cache_dir=str(tmp_path / "cache")
    )
    info = dataset_info(spec)
    assert (info.kind, info.num_classes, info.input_shape) == ("image", 3, (3, 6, 5))
    server = load_server_data(spec)
    assert server.tensors[1].tolist() == [0, 0, 1, 1, 2, 2]  # floor(0.1 * 20) per class
    keys = {row.numpy().tobytes() for row in server.tensors[0]}
    seen = 0
    for i in range(4):
        client = load_client_data(spec, i, 4)
        assert client.train.tensors[0].shape[1:] == (3, 6, 5)
        assert min(len(client.train), len(client.val), len(client.test)) >= 1
        for split in (client.train, client.val, client.test):
            assert not keys & {row.numpy().tobytes() for row in split.tensors[0]}
            seen += len(split)
    assert seen == 54
    again = load_client_data(
        DataSpec(
            dataset=f"folder:{image_folder}", partitioner="iid", cache_dir=str(tmp_path / "b")
        ),
        2,
        4,
    )
    assert torch.equal(again.train.tensors[0], load_client_data(spec, 2, 4).train.tensors[0])


def test_folder_global_test_set_is_carved_through_federated_dataset(
    image_folder: Path, tmp_path: Path
) -> None:
    # a folder has no test split: floor(0.25 x 18) = 4 of the 18 images a class leaves after
    # the server slice's 2, never a client's
    spec = DataSpec(
        dataset=f"folder:{image_folder}",
        partitioner="iid",
        global_test=True,
        global_test_fraction=0.25,
        cache_dir=str(tmp_path / "cache"),
    )
    test = load_global_test(spec)
    assert test.tensors[1].tolist() == [0] * 4 + [1] * 4 + [2] * 4
    held = {row.numpy().tobytes() for row in test.tensors[0]}
    held |= {row.numpy().tobytes() for row in load_server_data(spec).tensors[0]}
    assert len(held) == 18
    seen = 0
    for i in range(4):
        client = load_client_data(spec, i, 4)
        for split in (client.train, client.val, client.test):
            assert not held & {row.numpy().tobytes() for row in split.tensors[0]}
            seen += len(split)
    assert seen == 60 - 18


def test_folder_class_groups_default_to_one_class_each(image_folder: Path, tmp_path: Path) -> None:
    spec = DataSpec(
        dataset=f"folder:{image_folder}", partitioner="class-groups", cache_dir=str(tmp_path)
    )
    with pytest.raises(ValueError, match="num-partitions = 2 is too few"):
        spec.check_partitionable(2)
    assert load_server_data(spec).tensors[1].tolist() == [0, 0, 1, 1, 2, 2]
    counts = [load_client_data(spec, i, 3).label_counts for i in range(3)]
    assert [tuple(c > 0 for c in row) for row in counts] == [
        (True, False, False),
        (False, True, False),
        (False, False, True),
    ]


def test_folder_errors(tmp_path: Path) -> None:
    spec = DataSpec(dataset=f"folder:{tmp_path / 'missing'}")
    with pytest.raises(ValueError, match=r"'data\.dataset' = .*is not a directory"):
        dataset_info(spec)
    with pytest.raises(ValueError, match=r"'data\.dataset' = .*is not a directory"):
        spec.check_partitionable(2)
    with pytest.raises(ValueError, match=r"'data\.partitioner' = 'natural'.*no natural ids"):
        DataSpec(dataset=f"folder:{tmp_path}", partitioner="natural")


def _shakespeare_like() -> Dataset:
    text = "To be, or not to be, that is the question: whether 'tis nobler in the mind"
    rows = {"x": [], "y": [], "character_id": []}
    for i in range(60):
        start = i % (len(text) - 21)
        rows["x"].append(text[start : start + 20])
        rows["y"].append(text[start + 20])
        rows["character_id"].append(f"ROLE_{i % 7}")
    return Dataset.from_dict(rows)


def test_shakespeare_rows_partition_and_convert() -> None:
    spec = DataSpec(dataset="shakespeare", partitioner="natural", seq_len=16, server_fraction=0.2)
    prepare = make_preprocessor(spec, "character_id", "character_id", num_partitions=3)
    splits = prepare(DatasetDict({"train": _shakespeare_like()}))
    # stratified by role: floor(0.2 * 8 or 9) = 1 sample of each of the 7 roles
    assert sorted(splits[SERVER_SPLIT]["character_id"]) == [f"ROLE_{i}" for i in range(7)]
    assert len(splits["train"]) == 53
    partitioner = build_partitioner(spec, None, 3)
    partitioner.dataset = splits["train"]
    rows = load_partition(spec, partitioner.load_partition, 1, 3)
    assert set(rows["character_id"]) == {"ROLE_1", "ROLE_4"}  # roles 1, 4 of 0..6, mod 3
    x, y = to_tensors(spec, rows)
    assert x.shape == y.shape == (len(rows), 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    first = rows[0]
    assert decode(x[0]) == first["x"][-16:]
    assert decode(y[0]) == (first["x"] + first["y"])[-16:]


def test_natural_column_partitioner_matches_flwr_datasets() -> None:
    table = Dataset.from_dict({"who": ["b", "a", "c", "a", "b", "b", "c"], "v": list(range(7))})
    stock, fast = NaturalIdPartitioner("who"), NaturalIdColumnPartitioner("who")
    stock.dataset, fast.dataset = table, table
    assert fast.num_partitions == stock.num_partitions == 3
    for i in range(3):
        assert fast.load_partition(i)["v"] == stock.load_partition(i)["v"]


def _wav(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(2)
        clip.setframerate(16_000)
        clip.writeframes((samples * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def test_speech_rows_drop_silence_and_become_mfcc() -> None:
    rng = np.random.default_rng(0)
    # Stored as the hub stores it (an Audio column of WAV bytes) without needing
    # torchcodec, which datasets uses to *encode* audio.
    features = Features(
        {
            "audio": {"bytes": Value("binary"), "path": Value("string")},
            "label": ClassLabel(names=["yes", "_silence_", "no"]),
            "speaker_id": Value("string"),
        }
    )
    lengths = [16_000, 12_000, 16_000, 16_000]
    table = Dataset.from_dict(
        {
            "audio": [{"bytes": _wav(rng.uniform(-0.5, 0.5, n)), "path": None} for n in lengths],
            "label": [0, 2, 1, 0],
            "speaker_id": ["s1", "s2", None, "s1"],
        },
        features=features,
    ).cast_column("audio", Audio())
    assert list(_drop_silence(DatasetDict({"train": table, "test": table}))) == ["train"]
    dropped = _drop_silence(DatasetDict({"train": table, "test": table}), test=True)
    words = dropped["train"]
    assert words["label"] == [0, 2, 0]
    assert dropped["test"]["label"] == [0, 2, 0]  # the global test set's source too
    spec = DataSpec(dataset="speech-commands", partitioner="natural")
    x, y = to_tensors(spec, words)
    assert x.shape == (3, 1, 40, 51) and x.dtype == torch.float32
    assert torch.isfinite(x).all() and y.tolist() == [0, 1, 0]  # "no" becomes id 1


def test_speech_commands_12_maps_words_to_keywords_unknown_and_silence() -> None:
    # hub-like labels in another order than the 12 classes, and words of the "unknown" set
    names = ["backward", "yes", "go", "_silence_", "zero", "no", "off"]
    assert speech_commands_12_ids(names) == [10, 0, 9, 11, 10, 1, 7]
    assert SPEECH_COMMANDS_12[10:] == ("unknown", "silence")
    assert dataset_info(DataSpec(dataset="speech-commands-12")).num_classes == 12
    rng = np.random.default_rng(1)
    features = Features(
        {
            "audio": {"bytes": Value("binary"), "path": Value("string")},
            "label": ClassLabel(names=names),
            "speaker_id": Value("string"),
        }
    )
    table = Dataset.from_dict(
        {
            "audio": [
                {"bytes": _wav(rng.uniform(-0.5, 0.5, 16_000)), "path": None} for _ in range(5)
            ],
            "label": [1, 3, 0, 6, 3],  # yes, silence, backward, off, silence
            "speaker_id": ["s1", None, "s2", "s1", None],
        },
        features=features,
    ).cast_column("audio", Audio())
    rows = _silence_speakers(DatasetDict({"train": table}))["train"]
    assert len(rows) == 5  # silence is a class here, not dropped
    # each silence clip its own natural id, so natural partitions spread them
    assert rows["speaker_id"] == ["s1", "_silence_1", "s2", "s1", "_silence_4"]
    x, y = to_tensors(DataSpec(dataset="speech-commands-12", partitioner="natural"), rows)
    assert x.shape == (5, 1, 40, 51)
    assert y.tolist() == [0, 11, 10, 7, 11]


def test_mfcc_shape_and_filters() -> None:
    assert (mel_filterbank().sum(dim=0) > 0).all()  # no empty mel filter
    time = torch.arange(16_000) / 16_000
    low, high = torch.sin(2 * torch.pi * 440 * time), torch.sin(2 * torch.pi * 2000 * time)
    features = mfcc(torch.stack([low, high, torch.zeros(16_000)]))
    assert features.shape == (3, 1, 40, 51) and torch.isfinite(features).all()
    assert features[:2].mean(dim=(1, 2, 3)).abs().max() < 1e-4  # per-clip standardised
    assert not torch.allclose(features[0], features[1], atol=0.1)
    assert mfcc(low[None, :8_000]).shape == (1, 1, 40, 51)  # short clips are padded
