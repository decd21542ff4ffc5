"""Disk cache: hits return identical tensors, never rebuild, and need no datasets imports."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fedorasflwr.data import DataSpec, load_client_data, load_server_data
from fedorasflwr.data import build as build_module
from fedorasflwr.data.cache import cache_root, client_path, server_path

REPO = Path(__file__).resolve().parents[2]


def test_hit_returns_identical_tensors_without_rebuilding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = DataSpec(cache_dir=str(tmp_path))
    cold = load_client_data(spec, 4, 20)
    cold_server = load_server_data(spec)
    assert client_path(spec, 4, 20).is_file() and server_path(spec).is_file()

    def no_build(*args: object) -> None:
        raise AssertionError("cache hit expected")

    monkeypatch.setattr(build_module, "build_client", no_build)
    monkeypatch.setattr(build_module, "build_server", no_build)
    hot = load_client_data(spec, 4, 20)
    for name in ("train", "val", "test"):
        for a, b in zip(getattr(cold, name).tensors, getattr(hot, name).tensors, strict=True):
            assert torch.equal(a, b)
    assert hot.label_counts == cold.label_counts and hot.num_classes == cold.num_classes
    assert torch.equal(load_server_data(spec).tensors[0], cold_server.tensors[0])
    assert not list(tmp_path.rglob("*.tmp"))  # atomic writes leave nothing behind


def test_key_ignores_cache_dir_but_not_the_rest(tmp_path: Path) -> None:
    a, b = DataSpec(cache_dir=str(tmp_path / "a")), DataSpec(cache_dir=str(tmp_path / "b"))
    assert client_path(a, 0, 10).name == client_path(b, 0, 10).name
    names = {
        client_path(a, 0, 10).name,
        client_path(a, 1, 10).name,
        client_path(a, 0, 11).name,
        client_path(DataSpec(alpha=2.0), 0, 10).name,
        client_path(DataSpec(seed=1), 0, 10).name,
    }
    assert len(names) == 5
    # the server slice does not depend on the partitioning
    assert server_path(DataSpec(partitioner="iid")) == server_path(DataSpec(alpha=0.3))
    assert server_path(DataSpec(seed=1)) != server_path(DataSpec())


def test_cache_dir_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FEDORASFLWR_CACHE", str(tmp_path))
    assert cache_root(DataSpec()) == tmp_path
    monkeypatch.delenv("FEDORASFLWR_CACHE")
    assert cache_root(DataSpec()) == Path("~/.cache/fedorasflwr").expanduser()
    assert cache_root(DataSpec(cache_dir=str(tmp_path / "x"))) == tmp_path / "x"


def test_corrupt_file_is_rebuilt(tmp_path: Path) -> None:
    spec = DataSpec(partitioner="iid", cache_dir=str(tmp_path))
    first = load_client_data(spec, 0, 5)
    client_path(spec, 0, 5).write_bytes(b"not a torch file")
    again = load_client_data(spec, 0, 5)
    assert torch.equal(first.train.tensors[0], again.train.tensors[0])


_BLOCKED_HIT = """
import sys, time
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"datasets", "flwr_datasets", "mlxtend", "pyarrow"}:
            raise ImportError(f"blocked on a cache hit: {name}")
sys.meta_path.insert(0, Block())
start = time.perf_counter()
import torch
from fedorasflwr.data import DataSpec, load_client_data, load_server_data
spec = DataSpec(cache_dir=sys.argv[1])
client = load_client_data(spec, 4, 20)
server = load_server_data(spec)
torch.save([*client.train.tensors, *server.tensors], sys.argv[2])
print(f"{time.perf_counter() - start:.3f}")
"""


def test_hit_needs_no_datasets_imports(tmp_path: Path) -> None:
    spec = DataSpec(cache_dir=str(tmp_path / "cache"))
    client, server = load_client_data(spec, 4, 20), load_server_data(spec)
    out = tmp_path / "out.pt"
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_BLOCKED_HIT), spec.cache_dir, str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    tensors = torch.load(out)
    for a, b in zip(tensors, [*client.train.tensors, *server.tensors], strict=True):
        assert torch.equal(a, b)
