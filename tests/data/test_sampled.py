"""The ``sampled`` partitioner (``data.partition-size``): every client draws its rows on its
own, so a federation can have more clients than the dataset has rows (the 10,000-node scale
run on MNIST-5k); seeded per partition, outside the server slice, checked before any data is
read; unused, the cache keys and checkpoint bindings are what they were before the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from fedorasflwr.config import bound_settings
from fedorasflwr.data import DataSpec, cache, load_client_data, load_server_data
from fedorasflwr.data.catalog import num_client_samples

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _rows(dataset: TensorDataset) -> set[bytes]:
    """Content keys of the samples (the 5,000 mnist5k images are all distinct)."""
    return {row.numpy().tobytes() for row in dataset.tensors[0]}


def _all_rows(data) -> set[bytes]:
    return _rows(data.train) | _rows(data.val) | _rows(data.test)


@pytest.mark.parametrize(
    ("values", "key", "allowed"),
    [
        ({"partitioner": "sampled"}, "data.partition-size", ">= 3"),
        ({"partitioner": "sampled", "partition_size": 2}, "data.partition-size", ">= 3"),
        ({"partitioner": "iid", "partition_size": 20}, "data.partition-size", "only 'sampled'"),
        ({"partitioner": "sampled", "partition_size": -1}, "data.partition-size", ">= 0"),
        ({"partitioner": "sampled", "partition_size": True}, "data.partition-size", ">= 0"),
    ],
)
def test_bad_partition_size_names_the_key(values: dict, key: str, allowed: str) -> None:
    with pytest.raises(ValueError, match=key) as err:
        DataSpec(**values)
    assert allowed in str(err.value)


def test_more_clients_than_rows_pass_the_check_and_too_large_a_draw_fails() -> None:
    spec = DataSpec(partitioner="sampled", partition_size=20)
    available = num_client_samples(spec)
    assert available is not None and available < 10_000
    spec.check_partitionable(10_000)  # would fail for iid: 10,000 x 3 > 4,500
    with pytest.raises(ValueError, match="num-partitions = 10000 is too many"):
        DataSpec(partitioner="iid").check_partitionable(10_000)
    too_large = DataSpec(partitioner="sampled", partition_size=available + 1)
    expected = f"'data.partition-size' = {available + 1}.*<= {available}"
    with pytest.raises(ValueError, match=expected):
        too_large.check_partitionable(5)


def test_partitions_are_seeded_per_client_overlap_and_avoid_the_server_slice(
    data_cache: Path,
) -> None:
    spec = DataSpec(partitioner="sampled", partition_size=40, cache_dir=str(data_cache))
    last = load_client_data(spec, 9_999, 10_000)
    assert (len(last.train), len(last.val), len(last.test)) == (32, 4, 4)
    assert len(_all_rows(last)) == 40  # distinct rows within a client
    assert sum(last.label_counts) == 32
    # partition i depends on (seed, i) only: not on how many partitions there are
    again = load_client_data(spec, 7, 10_000)
    fewer = load_client_data(spec, 7, 12)
    assert torch.equal(again.train.tensors[0], fewer.train.tensors[0])
    assert torch.equal(again.test.tensors[1], fewer.test.tensors[1])
    # independent draws: clients differ, and many clients share rows
    clients = [_all_rows(load_client_data(spec, i, 10_000)) for i in range(60)]
    assert len({frozenset(c) for c in clients}) == 60
    union = set().union(*clients)
    assert len(union) < 60 * 40
    # never a row of the server slice
    assert not union & _rows(load_server_data(spec))
    # another seed, another draw
    other = DataSpec(partitioner="sampled", partition_size=40, seed=1, cache_dir=str(data_cache))
    assert _all_rows(load_client_data(other, 7, 10_000)) != clients[7]


def test_unused_key_keeps_cache_keys_and_checkpoint_bindings() -> None:
    spec = DataSpec(partitioner="iid")
    config = spec.to_config()
    assert config["partition-size"] == 0
    # the client cache file of a spec without the key is the one it had before the key
    config.pop("cache-dir")
    for name in ("partition-size", "global-test", "global-test-fraction"):
        config.pop(name)
    digest = cache._digest({"spec": config, "partition-id": 3, "num-partitions": 9})
    assert cache.client_path(spec, 3, 9).name.endswith(f"-{digest}.pt")
    sampled = DataSpec(partitioner="sampled", partition_size=20)
    assert cache.client_path(sampled, 3, 9) != cache.client_path(spec, 3, 9)
    # a checkpoint written before the key existed binds no partition-size, and resumes
    assert "data.partition-size" not in bound_settings("fedoras", {"data.partition-size": 0})
    assert bound_settings("fedoras", {"data.partition-size": 20}) == {"data.partition-size": 20}
