"""Partitioning mnist5k: every partitioner, reproducibility, the server slice, FDNAS groups."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from fedorasflwr.data import ClientData, DataSpec, load_client_data, load_server_data
from fedorasflwr.data.partition import ClassGroupPartitioner, client_split_indices

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _rows(dataset: TensorDataset) -> set[bytes]:
    """Content keys of the samples (the 5,000 mnist5k images are all distinct)."""
    return {row.numpy().tobytes() for row in dataset.tensors[0]}


def _all(spec: DataSpec, num_partitions: int) -> list[ClientData]:
    return [load_client_data(spec, i, num_partitions) for i in range(num_partitions)]


def _assert_tensors_equal(a: ClientData, b: ClientData) -> None:
    for name in ("train", "val", "test"):
        for left, right in zip(getattr(a, name).tensors, getattr(b, name).tensors, strict=True):
            assert torch.equal(left, right)


@pytest.mark.parametrize("partitioner", ["iid", "dirichlet", "class-groups"])
@pytest.mark.parametrize("num_partitions", [20, 50])
def test_every_partitioner_gives_disjoint_nonempty_clients(
    tmp_path: Path, partitioner: str, num_partitions: int
) -> None:
    spec = DataSpec(partitioner=partitioner, alpha=0.1, cache_dir=str(tmp_path))
    clients = _all(spec, num_partitions)
    server = _rows(load_server_data(spec))
    assert len(server) == 500
    seen: set[bytes] = set()
    total = 0
    for client in clients:
        assert min(len(client.train), len(client.val), len(client.test)) >= 1
        assert client.num_classes == 10
        assert len(client.label_counts) == 10
        assert sum(client.label_counts) == len(client.train)
        assert client.label_counts == tuple(
            torch.bincount(client.train.tensors[1], minlength=10).tolist()
        )
        x, y = client.train.tensors
        assert x.dtype == torch.float32 and x.shape[1:] == (1, 28, 28)
        assert y.dtype == torch.int64
        for split in (client.train, client.val, client.test):
            rows = _rows(split)
            assert not rows & server, "a client holds a server-slice sample"
            assert not rows & seen, "two clients (or splits) share a sample"
            seen |= rows
            total += len(split)
    assert total == len(seen) == 4500  # every non-server sample is used exactly once


def test_images_are_normalised(tmp_path: Path) -> None:
    x = load_server_data(DataSpec(cache_dir=str(tmp_path))).tensors[0]
    assert abs(x.mean().item()) < 0.1 and abs(x.std().item() - 1) < 0.1
    assert x.min().item() == pytest.approx(-0.1307 / 0.3081, abs=1e-5)


def test_same_spec_same_tensors_anywhere(tmp_path: Path) -> None:
    first = DataSpec(alpha=0.5, cache_dir=str(tmp_path / "a"))
    second = DataSpec(alpha=0.5, cache_dir=str(tmp_path / "b"))
    _assert_tensors_equal(load_client_data(first, 7, 20), load_client_data(second, 7, 20))


def test_different_seeds_give_different_splits(tmp_path: Path) -> None:
    base = load_client_data(DataSpec(cache_dir=str(tmp_path)), 3, 20)
    other = load_client_data(DataSpec(seed=1, cache_dir=str(tmp_path)), 3, 20)
    assert _rows(base.train) != _rows(other.train)
    server = load_server_data(DataSpec(cache_dir=str(tmp_path)))
    assert _rows(server) != _rows(load_server_data(DataSpec(seed=1, cache_dir=str(tmp_path))))


def test_server_slice_is_stratified_and_independent_of_partitioning(tmp_path: Path) -> None:
    server = load_server_data(DataSpec(cache_dir=str(tmp_path / "a")))
    assert torch.bincount(server.tensors[1]).tolist() == [50] * 10
    for other in (
        DataSpec(partitioner="iid", cache_dir=str(tmp_path / "b")),
        DataSpec(partitioner="class-groups", val_fraction=0.3, cache_dir=str(tmp_path / "c")),
    ):
        again = load_server_data(other)
        assert all(torch.equal(a, b) for a, b in zip(server.tensors, again.tensors, strict=True))
    # ... and no client of any partitioning ever trains on it
    keys = _rows(server)
    for num_partitions in (1, 7):
        for client in _all(DataSpec(cache_dir=str(tmp_path / "a")), num_partitions):
            assert not _rows(client.train) & keys


def test_server_fraction_zero_gives_empty_slice(tmp_path: Path) -> None:
    spec = DataSpec(server_fraction=0.0, partitioner="iid", cache_dir=str(tmp_path))
    server = load_server_data(spec)
    assert len(server) == 0 and server.tensors[0].shape == (0, 1, 28, 28)
    assert sum(len(c.train) + len(c.val) + len(c.test) for c in _all(spec, 4)) == 5000


def test_class_groups_is_the_fdnas_layout(tmp_path: Path) -> None:
    spec = DataSpec(partitioner="class-groups", cache_dir=str(tmp_path))
    clients = _all(spec, 10)
    layout = [(0, 1, 2)] * 3 + [(3, 4, 5)] * 3 + [(6, 7, 8, 9)] * 4
    for client, classes in zip(clients, layout, strict=True):
        labels = torch.cat([client.train.tensors[1], client.val.tensors[1], client.test.tensors[1]])
        assert set(labels.tolist()) == set(classes)
    for start, stop, classes in ((0, 3, 3), (3, 6, 3), (6, 10, 4)):
        group_total = sum(len(c.train) + len(c.val) + len(c.test) for c in clients[start:stop])
        assert group_total == 450 * classes  # the group's samples, split among its clients
        sizes = [len(c.train) + len(c.val) + len(c.test) for c in clients[start:stop]]
        assert max(sizes) - min(sizes) <= 1  # IID within the group


def test_class_groups_custom_and_group_of() -> None:
    partitioner = ClassGroupPartitioner(5, "label", ((0,), (1, 2)), seed=0)
    assert [partitioner.group_of(i) for i in range(5)] == [0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="num-partitions = 1 is too few"):
        ClassGroupPartitioner(1, "label", ((0,), (1,)), seed=0)


def test_dirichlet_small_alpha_is_skewed(tmp_path: Path) -> None:
    def skew(alpha: float) -> float:
        spec = DataSpec(alpha=alpha, cache_dir=str(tmp_path))
        counts = np.array([c.label_counts for c in _all(spec, 10)], dtype=float)
        return float(np.mean(counts.max(axis=1) / counts.sum(axis=1)))

    assert skew(0.1) > 0.4 > 0.2 > skew(1000.0)


def test_dirichlet_failure_is_a_clear_error(tmp_path: Path) -> None:
    spec = DataSpec(alpha=0.01, cache_dir=str(tmp_path))
    spec.check_partitionable(1000)  # enough samples on paper ...
    with pytest.raises(ValueError, match=r"'data\.alpha' = 0\.01 with num-partitions = 1000"):
        load_client_data(spec, 0, 1000)  # ... but the draws cannot feed every client


def test_client_split_sizes() -> None:
    spec = DataSpec(val_fraction=0.2, test_fraction=0.1)
    parts = client_split_indices(100, spec, 0)
    assert [len(parts[name]) for name in ("train", "val", "test")] == [70, 20, 10]
    assert sorted(np.concatenate(list(parts.values())).tolist()) == list(range(100))
    tiny = client_split_indices(3, spec, 0)
    assert [len(tiny[name]) for name in ("train", "val", "test")] == [1, 1, 1]
    no_val = client_split_indices(10, DataSpec(val_fraction=0.0), 0)
    assert len(no_val["val"]) == 0 and len(no_val["test"]) == 1
    crowded = DataSpec(val_fraction=0.49, test_fraction=0.49)
    with pytest.raises(ValueError, match=r"'data\.val-fraction' = 0\.49"):
        client_split_indices(4, crowded, 2)
