"""The server's global test set (``data.global-test``): carved for mnist5k and pydoc-topics,
stratified, seeded, disjoint from the server slice and every client, cached under its own key;
off, the data (and every cache key) is what it was before the keys existed."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset, DatasetDict
from torch.utils.data import TensorDataset

from fedorasflwr.data import DataSpec, cache, load_client_data, load_global_test, load_server_data
from fedorasflwr.data.catalog import num_client_samples, text_num_windows
from fedorasflwr.data.partition import (
    GLOBAL_TEST_SPLIT,
    global_test_indices,
    make_preprocessor,
    server_split_indices,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _rows(dataset: TensorDataset) -> set[bytes]:
    """Content keys of the samples (the 5,000 mnist5k images are all distinct)."""
    return {row.numpy().tobytes() for row in dataset.tensors[0]}


def test_mnist5k_slice_is_stratified_disjoint_and_seeded(data_cache: Path) -> None:
    spec = DataSpec(global_test=True, cache_dir=str(data_cache))
    test = load_global_test(spec)
    # 500 digits a class; the server slice takes floor(0.1 x 500) = 50 of each, the global
    # test set floor(0.1 x 450) = 45 of each of the 450 left
    assert torch.bincount(test.tensors[1]).tolist() == [45] * 10
    keys = _rows(test)
    assert len(keys) == 450
    server = load_server_data(spec)
    assert torch.equal(server.tensors[0], load_server_data(DataSpec()).tensors[0])  # unchanged
    assert not keys & _rows(server)
    clients = [load_client_data(spec, i, 10) for i in range(10)]
    seen = set()
    for client in clients:
        for split in (client.train, client.val, client.test):
            rows = _rows(split)
            assert not rows & keys
            seen |= rows
    # every digit is somewhere: the clients hold all but the two slices
    assert len(seen) == 5000 - 500 - 450
    # seeded: the same seed the same slice, another seed another
    again = load_global_test(DataSpec(global_test=True, cache_dir=str(data_cache / "again")))
    assert all(torch.equal(a, b) for a, b in zip(test.tensors, again.tensors, strict=True))
    other = load_global_test(DataSpec(global_test=True, seed=1, cache_dir=str(data_cache)))
    assert _rows(other) != keys


def test_fraction_sets_the_size_and_server_fraction_zero_is_fine(data_cache: Path) -> None:
    spec = DataSpec(
        global_test=True, global_test_fraction=0.2, server_fraction=0.0, cache_dir=str(data_cache)
    )
    assert torch.bincount(load_global_test(spec).tensors[1]).tolist() == [100] * 10
    assert num_client_samples(spec) == 4000
    assert num_client_samples(DataSpec(global_test=True)) == 5000 - 500 - 450


def test_off_leaves_every_key_and_partition_unchanged(data_cache: Path) -> None:
    off = DataSpec(cache_dir=str(data_cache))
    # a spec without the keys hashes as before they existed: the cached partitions are reused
    # (the name main's cache.client_path gave before the keys existed, FORMAT_VERSION 3)
    assert (
        cache.client_path(off, 0, 20).name == "client-mnist5k-0-of-20-a1cf8623648e9bcd2d426056.pt"
    )
    assert cache.client_path(off, 3, 20) == cache.client_path(
        DataSpec(global_test_fraction=0.3, cache_dir=str(data_cache)), 3, 20
    )
    on = DataSpec(global_test=True, cache_dir=str(data_cache))
    assert cache.client_path(on, 3, 20) != cache.client_path(off, 3, 20)
    assert cache.client_path(on, 3, 20) != cache.client_path(
        DataSpec(global_test=True, global_test_fraction=0.2, cache_dir=str(data_cache)), 3, 20
    )
    assert cache.server_path(on) == cache.server_path(off)  # the slice does not move
    assert cache.global_test_path(on) != cache.global_test_path(
        DataSpec(global_test=True, global_test_fraction=0.2, cache_dir=str(data_cache))
    )
    # a partition built with the slice is never the one built without it
    with_slice = load_client_data(on, 3, 20)
    without = load_client_data(off, 3, 20)
    assert _rows(with_slice.train) != _rows(without.train)


def test_off_has_no_global_test_set() -> None:
    with pytest.raises(ValueError, match=r"'data.global-test' = false"):
        load_global_test(DataSpec())


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"data.global-test": "yes"}, r"'data.global-test' = 'yes' is invalid: true or false"),
        ({"data.global-test": 1}, r"'data.global-test' = 1 is invalid: true or false"),
        ({"data.global-test-fraction": 0}, r"'data.global-test-fraction' = 0.0 .*\(0, 1\)"),
        ({"data.global-test-fraction": 1.0}, r"'data.global-test-fraction' = 1.0 .*\(0, 1\)"),
        ({"data.global-test-fraction": -0.1}, r"'data.global-test-fraction' = -0.1"),
        ({"data.global-test-fraction": True}, r"'data.global-test-fraction' = True"),
    ],
)
def test_bad_values_are_refused(config: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DataSpec.from_config(config)


def test_too_large_a_slice_is_caught_before_training() -> None:
    spec = DataSpec(global_test=True, global_test_fraction=0.9)  # 10 x (450 - 405) = 450 left
    assert num_client_samples(spec) == 450
    with pytest.raises(ValueError, match=r"450 samples outside the server slice and the global"):
        spec.check_partitionable(200)  # 200 x 3 > 450


def test_pydoc_topics_carves_every_topic(data_cache: Path) -> None:
    spec = DataSpec(
        dataset="pydoc-topics",
        partitioner="natural",
        global_test=True,
        global_test_fraction=0.25,
        cache_dir=str(data_cache),
    )
    counts = text_num_windows("pydoc-topics", 80)
    assert counts is not None
    rest = [n - math.floor(0.1 * n) for n in counts.values()]
    expected = sum(math.floor(0.25 * m + 1e-9) for m in rest)
    test = load_global_test(spec)
    assert len(test) == expected
    assert num_client_samples(spec) == sum(rest) - expected
    client = load_client_data(spec, 0, 5)
    assert not _rows(client.train) & _rows(test)


def test_indices_by_hand() -> None:
    # 3 strata of 10, 20 and 4 rows; server 0.1 -> 1, 2, 0; the global test set takes
    # floor(0.5 x 9) = 4, floor(0.5 x 18) = 9, floor(0.5 x 4) = 2 of the rest
    strata = np.array([0] * 10 + [1] * 20 + [2] * 4)
    rest, server = server_split_indices(strata, 0.1, 7)
    kept, held = global_test_indices(strata, rest, 0.5, 7)
    assert np.bincount(strata[held], minlength=3).tolist() == [4, 9, 2]
    assert not set(held) & set(server) and not set(held) & set(kept)
    assert sorted([*kept, *held, *server]) == list(range(34))
    # the clients' rows keep the seeded order of rest
    assert kept.tolist() == [r for r in rest.tolist() if r not in set(held.tolist())]


def test_a_dataset_with_a_test_split_uses_it_whole() -> None:
    """The online path (cifar10's hub layout, in memory): the preprocessor hands the ``test``
    split on as the global test set and the clients' rows are those without the key."""
    train = Dataset.from_dict({"img": list(range(40)), "label": [i % 10 for i in range(40)]})
    test = Dataset.from_dict({"img": list(range(100, 120)), "label": [i % 10 for i in range(20)]})
    splits = DatasetDict({"train": train, "test": test})
    on = make_preprocessor(DataSpec(dataset="cifar10", global_test=True), "label", None, None)
    off = make_preprocessor(DataSpec(dataset="cifar10"), "label", None, None)
    got, plain = on(splits), off(splits)
    assert got[GLOBAL_TEST_SPLIT]["img"] == list(range(100, 120))
    assert got["train"]["img"] == plain["train"]["img"]
    assert GLOBAL_TEST_SPLIT not in plain
