"""Text: vocabulary, windows with next-character targets, pydoc-topics partitions."""

from __future__ import annotations

import math
import string
from collections import Counter
from pathlib import Path
from pydoc_data.topics import topics

import numpy as np
import pytest
import torch

from fedorasflwr.data import OOV_ID, VOCAB, DataSpec, load_client_data, load_server_data
from fedorasflwr.data.text import decode, encode, num_windows, windows

TOPICS = sorted(topics)


def test_vocabulary() -> None:
    assert len(VOCAB) == 97 and OOV_ID == 97
    assert set(VOCAB) == set(string.printable) - {"\r", "\x0b", "\x0c"}
    ids = encode("a\tZ\n~é—")
    assert ids.dtype == np.int64
    assert ids.tolist() == [VOCAB.index(c) for c in "a\tZ\n~"] + [OOV_ID, OOV_ID]
    assert decode(encode("Hello, world!\n")) == "Hello, world!\n"


def test_windows_shift_and_tail() -> None:
    ids = np.arange(23, dtype=np.int64)
    x, y = windows(ids, 5)
    # starts 0, 5, 10, 15 (non-overlapping inputs), then 17: aligned to the end
    assert x[:, 0].tolist() == [0, 5, 10, 15, 17]
    assert torch.equal(torch.from_numpy(y), torch.from_numpy(x) + 1)
    assert len(x) == num_windows(23, 5) == math.ceil(22 / 5)
    assert num_windows(21, 5) == 4 and windows(np.arange(21), 5)[1][-1, -1] == 20  # exact fit
    assert num_windows(6, 5) == 1 and num_windows(5, 5) == 0


def _texts(tensor: torch.Tensor) -> list[str]:
    return [decode(row) for row in tensor]


@pytest.fixture(scope="module")
def natural(tmp_path_factory: pytest.TempPathFactory) -> list:
    spec = DataSpec(
        dataset="pydoc-topics",
        partitioner="natural",
        cache_dir=str(tmp_path_factory.mktemp("cache")),
    )
    return [load_client_data(spec, i, 79) for i in range(79)]


def test_natural_partition_is_one_topic_per_client(natural: list) -> None:
    for topic, client in zip(TOPICS, natural, strict=True):
        assert min(len(client.train), len(client.val), len(client.test)) >= 1
        assert client.num_classes == 98
        assert sum(client.label_counts) == client.train.tensors[1].numel()
        x, y = client.train.tensors
        assert x.dtype == y.dtype == torch.int64 and x.shape[1] == 80
        assert torch.equal(x[:, 1:], y[:, :-1])  # next character at every position
        text = "".join(c if c in VOCAB else "\ufffd" for c in topics[topic])
        for window_x, window_y in zip(_texts(x), _texts(y), strict=True):
            assert window_x + window_y[-1] in text


def _size(client: object) -> int:
    return sum(len(getattr(client, name)) for name in ("train", "val", "test"))


def test_round_robin_topics_with_fewer_clients(tmp_path: Path) -> None:
    spec = DataSpec(dataset="pydoc-topics", partitioner="natural", cache_dir=str(tmp_path))
    client = load_client_data(spec, 3, 10)
    mine = TOPICS[3::10]  # topics 3, 13, 23, ... in sorted order
    windows_of = {t: num_windows(len(topics[t]), 80) for t in mine}
    assert _size(client) == sum(n - math.floor(0.1 * n) for n in windows_of.values())
    texts = ["".join(c if c in VOCAB else "\ufffd" for c in topics[t]) for t in mine]
    for x, y in zip(_texts(client.train.tensors[0]), _texts(client.train.tensors[1]), strict=True):
        assert any(x + y[-1] in text for text in texts)


def test_iid_text_partitions_every_window_once(tmp_path: Path) -> None:
    spec = DataSpec(dataset="pydoc-topics", partitioner="iid", seq_len=40, cache_dir=str(tmp_path))
    server = load_server_data(spec)
    assert server.tensors[0].shape[1] == 40 and len(server) > 0
    used: Counter[bytes] = Counter(row.numpy().tobytes() for row in server.tensors[0])
    for i in range(30):
        client = load_client_data(spec, i, 30)
        assert min(len(client.train), len(client.val), len(client.test)) >= 1
        for split in (client.train, client.val, client.test):
            used.update(row.numpy().tobytes() for row in split.tensors[0])
    every = Counter()
    for topic in TOPICS:
        every.update(row.tobytes() for row in windows(encode(topics[topic]), 40)[0])
    assert used == every  # server + clients = every window, each exactly once


def test_text_reproducible(tmp_path: Path) -> None:
    spec = DataSpec(dataset="pydoc-topics", partitioner="natural", cache_dir=str(tmp_path / "a"))
    again = DataSpec(dataset="pydoc-topics", partitioner="natural", cache_dir=str(tmp_path / "b"))
    first, second = load_client_data(spec, 5, 20), load_client_data(again, 5, 20)
    assert torch.equal(first.train.tensors[0], second.train.tensors[0])
    reseeded = DataSpec(
        dataset="pydoc-topics", partitioner="natural", seed=3, cache_dir=str(tmp_path / "a")
    )
    assert not torch.equal(
        first.train.tensors[0], load_client_data(reseeded, 5, 20).train.tensors[0]
    )


def test_more_partitions_than_topics_is_an_error(tmp_path: Path) -> None:
    spec = DataSpec(dataset="pydoc-topics", partitioner="natural", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"num-partitions = 80 is too many.*'data\.partitioner'"):
        load_client_data(spec, 0, 80)
