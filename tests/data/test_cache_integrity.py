"""Every cached partition is checked before use: a corrupt or out-of-range file is rebuilt
with a WARNING naming the file and the fault, and the rebuilt data equals the original."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fedorasflwr.data import DataSpec, cache, dataset_info, load_client_data, load_server_data
from fedorasflwr.data import build as build_module
from fedorasflwr.data.integrity import client_problem, server_problem
from fedorasflwr.data.loading import ClientData

PARTITIONS = 5


def _equal(a: ClientData, b: ClientData) -> bool:
    return (
        all(
            torch.equal(x, y)
            for name in ("train", "val", "test")
            for x, y in zip(getattr(a, name).tensors, getattr(b, name).tensors, strict=True)
        )
        and a.label_counts == b.label_counts
        and a.num_classes == b.num_classes
    )


@pytest.fixture
def mnist(tmp_path: Path) -> tuple[DataSpec, ClientData, Path]:
    spec = DataSpec(partitioner="iid", cache_dir=str(tmp_path))
    original = load_client_data(spec, 0, PARTITIONS)
    return spec, original, cache.client_path(spec, 0, PARTITIONS)


def _rewrite(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change the payload and store it with a *valid* checksum: only the range checks
    can tell."""
    payload = cache.read(path)
    assert payload is not None
    payload.pop("format")
    change(payload)
    cache.write(path, payload)


def _flip_a_bit_in_the_images(path: Path, images: torch.Tensor) -> None:
    raw = bytearray(path.read_bytes())
    offset = raw.find(images[0].numpy().tobytes()[:256])  # torch.save stores tensors verbatim
    assert offset > 0
    raw[offset + 200] ^= 0x04
    path.write_bytes(bytes(raw))


def _set_label(value: int) -> Callable[[dict[str, Any]], None]:
    def change(payload: dict[str, Any]) -> None:
        payload["train"][1][0] = value

    return change


def _cut_images(payload: dict[str, Any]) -> None:
    x, y = payload["val"]
    payload["val"] = [x[:, :, :20, :].contiguous(), y]


def _nan_pixel(payload: dict[str, Any]) -> None:
    payload["test"][0][2, 0, 14, 14] = float("nan")


def _drop_val(payload: dict[str, Any]) -> None:
    del payload["val"]


def _wrong_counts(payload: dict[str, Any]) -> None:
    payload["label-counts"][0] += 1


@pytest.mark.parametrize(
    ("corrupt", "fault"),
    [
        ("bit-flip", "checksum mismatch"),
        ("cut-file", "unreadable"),
        ("label-too-large", "split 'train' labels range over [0, 10]"),
        ("label-negative", "split 'train' labels range over [-1, 9]"),
        ("cut-image", "split 'val' inputs have shape"),
        ("nan-image", "split 'test' has non-finite input values"),
        ("missing-split", "split 'val' is missing"),
        ("wrong-label-counts", "label-counts do not match"),
    ],
)
def test_corruption_is_caught_and_rebuilt(mnist, caplog, corrupt, fault):
    spec, original, path = mnist
    if corrupt == "bit-flip":
        _flip_a_bit_in_the_images(path, original.train.tensors[0])
        damaged = torch.load(path, weights_only=True)  # torch itself loads it silently
        assert not torch.equal(damaged["train"][0], original.train.tensors[0])
    elif corrupt == "cut-file":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        change = {
            "label-too-large": _set_label(10),
            "label-negative": _set_label(-1),
            "cut-image": _cut_images,
            "nan-image": _nan_pixel,
            "missing-split": _drop_val,
            "wrong-label-counts": _wrong_counts,
        }[corrupt]
        _rewrite(path, change)
        assert cache.read(path) is not None  # the checksum is valid: only the range check sees it
    with caplog.at_level(logging.WARNING, logger="fedorasflwr.data"):
        again = load_client_data(spec, 0, PARTITIONS)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(path) in m and fault in m for m in warnings), warnings
    assert _equal(again, original)
    stored = cache.read(path)  # the rebuilt file is valid again
    assert stored is not None and client_problem(stored, dataset_info(spec)) is None


def test_intact_file_is_used_without_warning_or_rebuild(mnist, caplog, monkeypatch):
    spec, original, _ = mnist

    def no_build(*args: object) -> None:
        raise AssertionError("cache hit expected")

    monkeypatch.setattr(build_module, "build_client", no_build)
    with caplog.at_level(logging.WARNING, logger="fedorasflwr.data"):
        assert _equal(load_client_data(spec, 0, PARTITIONS), original)
    assert not caplog.records


def test_server_slice_is_checked_too(tmp_path, caplog):
    spec = DataSpec(cache_dir=str(tmp_path))
    original = load_server_data(spec)
    path = cache.server_path(spec)
    _rewrite(path, lambda payload: payload["server"][1].fill_(12))
    with caplog.at_level(logging.WARNING, logger="fedorasflwr.data"):
        again = load_server_data(spec)
    assert any(
        str(path) in r.getMessage() and "labels range over [12, 12]" in r.getMessage()
        for r in caplog.records
    )
    for a, b in zip(again.tensors, original.tensors, strict=True):
        assert torch.equal(a, b)
    stored = cache.read(path)
    assert stored is not None and server_problem(stored, dataset_info(spec)) is None


def test_text_ids_out_of_the_vocabulary_are_caught(tmp_path, caplog):
    spec = DataSpec(dataset="pydoc-topics", partitioner="natural", cache_dir=str(tmp_path))
    original = load_client_data(spec, 1, PARTITIONS)
    path = cache.client_path(spec, 1, PARTITIONS)

    def change(payload: dict[str, Any]) -> None:
        payload["train"][0][0, 0] = 98  # ids are 0..97

    _rewrite(path, change)
    with caplog.at_level(logging.WARNING, logger="fedorasflwr.data"):
        again = load_client_data(spec, 1, PARTITIONS)
    assert "split 'train' inputs range over [0, 98]" in caplog.text
    assert _equal(again, original)


def test_invalid_freshly_built_data_is_never_cached(tmp_path, monkeypatch):
    spec = DataSpec(partitioner="iid", cache_dir=str(tmp_path))
    real = build_module.build_client

    def broken(*args: object) -> dict[str, Any]:
        payload = real(*args)
        payload["train"][0][0, 0, 0, 0] = float("inf")
        return payload

    monkeypatch.setattr(build_module, "build_client", broken)
    with pytest.raises(RuntimeError, match="non-finite input values"):
        load_client_data(spec, 0, PARTITIONS)
    assert not cache.client_path(spec, 0, PARTITIONS).exists()


def test_an_empty_directory_where_a_cache_file_belongs_is_rebuilt(mnist, caplog):
    spec, original, path = mnist
    path.unlink()
    path.mkdir()  # e.g. left by a tool that made the path a directory
    with caplog.at_level(logging.WARNING, logger="fedorasflwr.data"):
        again = load_client_data(spec, 0, PARTITIONS)
    assert any(
        str(path) in r.getMessage() and "empty directory" in r.getMessage() for r in caplog.records
    )
    assert _equal(again, original)
    assert path.is_file() and cache.read(path) is not None


def test_a_directory_holding_files_where_a_cache_file_belongs_is_a_clear_error(tmp_path):
    spec = DataSpec(partitioner="iid", cache_dir=str(tmp_path))
    path = cache.server_path(spec)
    path.mkdir(parents=True)
    (path / "notes.txt").write_text("someone's")
    with pytest.raises(IsADirectoryError, match="not empty") as caught:
        load_server_data(spec)
    assert str(path) in str(caught.value) and "data.cache-dir" in str(caught.value)
    assert (path / "notes.txt").read_text() == "someone's"  # nothing of theirs deleted


def test_a_cache_directory_that_is_a_file_is_a_clear_error(tmp_path):
    spec = DataSpec(cache_dir=str(tmp_path))
    (tmp_path / "data").write_text("not a directory")
    with pytest.raises(NotADirectoryError, match="is a file, not a directory") as caught:
        load_server_data(spec)
    assert str(tmp_path / "data") in str(caught.value)
