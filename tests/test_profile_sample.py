"""A node's samples are checked against the model at profiling, not one round in.

The profile declares one sample's shape and dtype kind (``sample-shape``, ``sample-dtype``)
beside ``label-counts``; the server refuses a node whose data the model cannot take (here
channels-last images, or another class count) with a log line naming the node, what it has
and what the model expects, and fails the run before any training when no node fits. A
profile without the new fields (an older client) is accepted with a warning."""

from __future__ import annotations

import logging
import re
from collections import Counter
from typing import Any

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from torch.utils.data import TensorDataset

from fedorasflwr.clients import make_client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.federation.base import NodeProfile, ProfileRules, StageFailedError
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.decnas.strategy import DecNAS
from fedorasflwr.methods.fedoras.strategy import FedorAS
from fedorasflwr.protocol import PROFILE, QUERY_PROFILE
from fedorasflwr.search_spaces import build_space
from fedorasflwr.search_spaces.prunable import build_prunable
from tests.runconfig import tiny_decnas, tiny_fedoras
from tests.test_client_factory import NUM_CLASSES, NUM_NODES, profile_of, recorded, splits

CHANNELS_LAST = "sample-shape = [8, 8, 3]: the model expects samples of shape [3, 8, 8]"


def rgb_splits(pid: int, channels_last: bool) -> tuple[TensorDataset, ...]:
    """The digits of ``splits`` as 3-channel images, channels first or last."""
    out = []
    for split in splits(pid):
        images = split.images.float().expand(-1, 3, -1, -1)
        if channels_last:
            images = images.permute(0, 2, 3, 1)
        out.append(TensorDataset(images.contiguous(), split.labels))
    return tuple(out)


def rgb_grid(run_config: dict[str, Any], channels_last: set[int], faults: dict | None = None):
    """Every node's data as 3x8x8 images; the partitions in ``channels_last`` as 8x8x3."""

    def load_data(context: Context) -> tuple[TensorDataset, ...]:
        pid = int(context.node_config["partition-id"])
        return rgb_splits(pid, pid in channels_last)

    replies: list[Message] = []
    app = make_client_app(load_data, num_classes=NUM_CLASSES)
    keep = {pid: (faults or {}).get(pid, recorded(replies)) for pid in range(NUM_NODES)}
    return InProcessGrid(app, run_config, NUM_NODES, faults=keep), replies


@pytest.fixture(scope="module")
def fedoras_config(tmp_path_factory):
    return tiny_fedoras(
        tmp_path_factory.mktemp("data"),
        **{
            "fedoras.rounds": 1,
            "fedoras.clients-per-round": 2,
            "fedoras.stop-after": "supernet",
            "fedoras.min-replies": 1,
        },
    )


def fedoras(config: dict[str, Any], num_classes: int = NUM_CLASSES) -> FedorAS:
    torch.manual_seed(0)
    space = build_space(
        "cnn_s", num_classes=num_classes, in_channels=3, input_height=8, input_width=8, width=0.25
    )
    return FedorAS(space=space, settings=parse_run_config(config).method_settings, seed=0)


def test_the_profile_declares_the_sample_shape_and_dtype(fedoras_config):
    grid, _ = rgb_grid(fedoras_config, channels_last={1})
    first = profile_of(grid, grid.node_of_partition[0])
    assert (list(first["sample-shape"]), first["sample-dtype"]) == ([3, 8, 8], "float")
    assert len(first["label-counts"]) == NUM_CLASSES
    assert list(profile_of(grid, grid.node_of_partition[1])["sample-shape"]) == [8, 8, 3]


def test_a_channels_last_node_is_refused_naming_what_it_has(fedoras_config, caplog):
    grid, _ = rgb_grid(fedoras_config, channels_last={2})
    strategy = fedoras(fedoras_config)
    with caplog.at_level(logging.WARNING):
        strategy.setup(grid)
    node = grid.node_of_partition[2]
    assert sorted(p.partition_id for p in strategy.profiles.values()) == [0, 1, 3]
    assert (
        f"dropped reply of node {node}: profile refused: {CHANNELS_LAST}: channels last, "
        "the model takes channels first (C, H, W)" in caplog.text
    )


def test_channels_last_data_on_every_node_fails_the_run_before_training(fedoras_config):
    grid, replies = rgb_grid(fedoras_config, channels_last=set(range(NUM_NODES)))
    strategy = fedoras(fedoras_config)
    with pytest.raises(
        StageFailedError, match=rf"\[profile\] 0 usable replies .*{re.escape(CHANNELS_LAST)}"
    ):
        strategy.start(grid, ArrayRecord(strategy.space.state_dict()), num_rounds=1)
    assert Counter(r.metadata.message_type for r in replies) == {QUERY_PROFILE: NUM_NODES}


def test_another_class_count_fails_the_run_before_training(fedoras_config):
    grid, replies = rgb_grid(fedoras_config, channels_last=set())
    strategy = fedoras(fedoras_config, num_classes=12)
    match = r"0 usable replies .*label-counts has 10 entries: the run's task has 12 classes"
    with pytest.raises(StageFailedError, match=match):
        strategy.start(grid, ArrayRecord(strategy.space.state_dict()), num_rounds=1)
    assert Counter(r.metadata.message_type for r in replies) == {QUERY_PROFILE: NUM_NODES}


def test_decnas_checks_the_nets_input_shape(tmp_path, caplog):
    config = tiny_decnas(tmp_path, **{"decnas.num-groups": 1, "decnas.min-replies": 1})
    net = build_prunable(
        "convnet", num_classes=NUM_CLASSES, in_channels=3, input_height=8, input_width=8
    )
    strategy = DecNAS(net=net, settings=parse_run_config(config).method_settings, seed=0)
    grid, _ = rgb_grid(config, channels_last={0})
    with caplog.at_level(logging.WARNING):
        strategy.profile_nodes(grid, ConfigRecord({"method": "decnas"}))
    assert sorted(p.partition_id for p in strategy.profiles.values()) == [1, 2, 3]
    assert f"node {grid.node_of_partition[0]}: profile refused: {CHANNELS_LAST}" in caplog.text


def without_sample_fields(reply: Message) -> Message:
    """A client older than ``sample-shape`` / ``sample-dtype``: its profile lacks them."""
    record = reply.content.config_records.get(PROFILE)
    if record is not None:
        reply.content[PROFILE] = ConfigRecord(
            {k: v for k, v in record.items() if k not in ("sample-shape", "sample-dtype")}
        )
    return reply


def test_a_profile_without_the_sample_fields_is_accepted_with_a_warning(fedoras_config, caplog):
    grid, _ = rgb_grid(fedoras_config, channels_last={3}, faults={3: without_sample_fields})
    strategy = fedoras(fedoras_config)
    with caplog.at_level(logging.WARNING):
        strategy.setup(grid)
    node = grid.node_of_partition[3]
    assert len(strategy.profiles) == NUM_NODES  # unchecked, so kept
    assert strategy.profiles[node].sample_shape is None
    assert f"node {node} declares no sample-shape / sample-dtype" in caplog.text
    assert caplog.text.count("declares no sample-shape") == 1


def test_the_sample_rules_one_by_one():
    rules = ProfileRules(num_classes=3, input_shape=(3, 4, 4), input_kind="float")
    fine = NodeProfile(1, 2, 5, 4, 1, 1, (1, 3, 0), sample_shape=(3, 4, 4), sample_dtype="float")
    assert rules.problem(fine, 5) is None
    wrong = NodeProfile(1, 2, 5, 4, 1, 1, (1, 3, 0), sample_shape=(3, 5, 4), sample_dtype="float")
    assert rules.problem(wrong, 5) == (
        "sample-shape = [3, 5, 4]: the model expects samples of shape [3, 4, 4]"
    )
    ints = NodeProfile(1, 2, 5, 4, 1, 1, (1, 3, 0), sample_shape=(3, 4, 4), sample_dtype="int")
    assert rules.problem(ints, 5) == "sample-dtype = 'int': the model expects float samples"
    old = NodeProfile(1, 2, 5, 4, 1, 1, (1, 3, 0))
    assert rules.problem(old, 5) is None and not rules.declares_sample(old)
    assert ProfileRules().declares_sample(old)
    # text: token ids of one window
    text = ProfileRules.of_model(build_space("rnn", vocab_size=3, seq_len=2))
    assert (text.input_shape, text.input_kind) == ((2,), "int")
