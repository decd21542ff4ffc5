"""DecNAS end to end on the in-process grid (real client code, real data): accuracies first,
uploads only from survivors' groups, fusion by training count, faults, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.federation.replies import REPLY_MARGIN
from fedorasflwr.inprocess import InProcessGrid, error_reply
from fedorasflwr.methods.decnas.messages import DECNAS_UPLOAD
from fedorasflwr.methods.decnas.runner import build_decnas_net
from fedorasflwr.methods.decnas.strategy import DecNAS
from fedorasflwr.nonce import echo
from fedorasflwr.protocol import ARRAYS, METRICS, REPLY_BYTES
from tests.runconfig import FEW_ROWS, tiny_decnas

NUM_NODES = 6


def make_strategy(config):
    settings = parse_run_config(config)
    net = build_decnas_net(settings)
    return DecNAS(net=net, settings=settings.method_settings, seed=settings.seed)


def start(strategy, grid):
    return strategy.start(grid, ArrayRecord(), num_rounds=strategy.settings.max_iterations)


def test_only_survivors_groups_upload_weights(data_cache):
    # one client per group: each of the 6 ConvNet candidates is tuned by exactly one node
    config = tiny_decnas(
        data_cache, **{"decnas.num-groups": 6, "decnas.gm0-rounds": 0, "decnas.final-rounds": 0}
    )
    strategy = make_strategy(config)
    grid = InProcessGrid(client_app, config, NUM_NODES)
    result = strategy.start(grid, ArrayRecord(), num_rounds=strategy.settings.max_iterations)
    (entry,) = result.history
    assert len(entry["accuracy"]) == 6
    assert len(entry["dropped"]) == 2  # ceil(0.33 x 6)
    node_of = {int(c): strategy.groups[g][0].node_id for c, g in entry["group-of"].items()}
    dropped = {node_of[c] for c in entry["dropped"]}
    survivors = {node_of[c] for c in entry["survivors"]}
    asked = [m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == DECNAS_UPLOAD]
    assert sorted(asked) == sorted(survivors)
    uploads = result.ledger["upload"]["nodes"]
    assert all(str(node) not in uploads for node in dropped)
    assert all(uploads[str(node)]["bytes_up"] > 0 for node in survivors)
    # the tuning replies carry accuracies only, never weights
    assert result.ledger["tune"]["totals"]["bytes_up"] == 0
    assert result.ledger["tune"]["totals"]["replies"] == 6
    assert result.ledger["tune"]["totals"]["train_flops"] > 0
    gm0, gm1 = result.frontier
    assert gm1.pruned_layer in entry["survivors"]
    assert gm1.macs <= gm1.budget < gm0.macs
    assert sum(gm1.widths) < sum(gm0.widths)
    # result.json: FLOPs (2 x MACs, torch.utils.flop_counter) beside each GM_t's MACs
    summary = result.summary()
    assert [(m["macs"], m["flops"]) for m in summary["frontier"]] == [
        (gm.macs, 2 * gm.macs) for gm in (gm0, gm1)
    ]
    assert "2 x MACs" in summary["resource-convention"]
    assert "the papers call FLOPs" in summary["resource-convention"]


def test_fusion_is_the_training_count_weighted_mean(data_cache):
    strategy = make_strategy(tiny_decnas(data_cache))
    InProcessGrid(client_app, tiny_decnas(data_cache), 1)  # sets the task identity
    replies = []
    uploads = [Message(RecordDict(), dst_node_id=n, message_type=DECNAS_UPLOAD) for n in (7, 8)]
    sent = strategy.instruct("train", "upload", 1, uploads)  # what aggregate_train screens by
    for message, (value, count) in zip(sent, ((1.0, 1), (5.0, 3)), strict=True):
        content = RecordDict(
            {
                ARRAYS: ArrayRecord({"w": torch.full((2,), value)}),
                METRICS: MetricRecord({"num-examples": count}),
            }
        )
        replies.append(echo(message, Message(content, reply_to=message)))
    fused, metrics = strategy.aggregate_train(1, replies)
    np.testing.assert_allclose(fused["w"].numpy(), [4.0, 4.0])  # (1 x 1 + 5 x 3) / 4
    assert metrics["num-examples"] == 4
    assert strategy.aggregate_train(1, []) == (None, None)


def test_a_failed_upload_is_dropped_and_the_search_goes_on(data_cache):
    config = tiny_decnas(data_cache, **{"decnas.gm0-rounds": 0, "decnas.final-rounds": 0})

    def fail_uploads(reply: Message) -> Message:
        if reply.metadata.message_type == DECNAS_UPLOAD:
            return error_reply(reply, "disk full")
        return reply

    strategy = make_strategy(config)
    grid = InProcessGrid(client_app, config, NUM_NODES, faults={0: fail_uploads})
    result = strategy.start(grid, ArrayRecord(), num_rounds=strategy.settings.max_iterations)
    assert result.ledger["upload"]["totals"]["failed"] >= 1
    assert len(result.frontier) == 2


def test_same_seed_same_frontier(data_cache):
    config = tiny_decnas(data_cache, **FEW_ROWS)  # same seed, same frontier at any data size
    runs = [
        start(make_strategy(config), InProcessGrid(client_app, config, NUM_NODES)) for _ in range(2)
    ]
    first, second = ([m.summary() for m in r.frontier] for r in runs)
    assert first == second
    assert runs[0].history == runs[1].history
    assert first[1]["tuned-test-accuracy"] is not None


def test_uploads_of_weights_larger_than_the_reply_margin_are_accepted(data_cache):
    # A full-width ConvNet: most candidates' weights (up to 1.2 MB) exceed REPLY_MARGIN, and an
    # upload instruction carries no arrays: its config asks them back, so the size bound
    # lets the honest uploads through (before, every upload was dropped and the stage failed).
    config = tiny_decnas(
        data_cache,
        **{
            "space.width": 1.0,
            "decnas.num-groups": 6,
            "decnas.gm0-rounds": 0,
            "decnas.final-rounds": 0,
            **FEW_ROWS,  # the weights' size, not the data's, is the point
        },
    )
    strategy = make_strategy(config)
    grid = InProcessGrid(client_app, config, NUM_NODES)
    result = start(strategy, grid)
    uploads = [m for m in grid.sent if m.metadata.message_type == DECNAS_UPLOAD]
    asked = [m.content.config_records["config"][REPLY_BYTES] for m in uploads]
    assert max(asked) > REPLY_MARGIN
    upload = result.ledger["upload"]["totals"]
    assert upload["rejected"] == 0 and upload["replies"] == len(uploads)


def test_the_convnets_scaled_head_is_a_run_config_choice_its_pruned_nets_keep(data_cache) -> None:
    """``decnas.head`` (issue 40): GM_0's spec names it, a net pruned from GM_0 keeps it
    (MNIST's 28 px map ends at 3 x 3: the classifier reads it divided by 3), the default
    spec names none (as before the key), and the MobileNet refuses it."""
    from fedorasflwr.search_spaces.prunable import prune_layer

    default = build_decnas_net(parse_run_config(tiny_decnas(data_cache)))
    assert "head" not in default.spec and default.model.head_scale == 1.0
    config = tiny_decnas(data_cache, **{"decnas.head": "flatten-scaled"})
    net = build_decnas_net(parse_run_config(config))
    assert net.spec["head"] == "flatten-scaled" and net.model.head_scale == pytest.approx(1 / 3)
    last = len(net.widths) - 1  # NetAdapt's step: the classifier's input loses filters
    pruned = prune_layer(net, last, net.widths[last] // 2)
    assert pruned.widths[last] < net.widths[last] and pruned.spec["head"] == "flatten-scaled"
    assert pruned.model.head_scale == net.model.head_scale
    with pytest.raises(ValueError, match="'decnas.head' = 'flatten-scaled'.*'mobilenet'"):
        parse_run_config({**config, "decnas.model": "mobilenet"})
    with pytest.raises(ValueError, match="'decnas.head' = 'gap'"):
        parse_run_config({**config, "decnas.head": "gap"})
