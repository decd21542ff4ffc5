"""DP-FNAS's client training compute (``train-flops``, the ledger's FLOPs): 3 x the mixed
supernet's forward FLOPs per sample differentiated in a search exchange (the realised
count, or a private party's expected one), the second-order term's extra passes, the final
training's ``LocalTraining.flops`` / DP-SGD's expected samples; booked per stage, and a
reply with a bad count dropped naming its node."""

from __future__ import annotations

import logging

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedorasflwr.config import parse_run_config
from fedorasflwr.inprocess import replace_content
from fedorasflwr.methods.dpfnas.client import (
    architecture_gradient,
    train_final,
    weight_gradient,
)
from fedorasflwr.methods.dpfnas.contract import DPFNAS_TRAIN, DPFNAS_WEIGHTS, final_steps
from fedorasflwr.protocol import ARRAYS, CONFIG, METRICS, space_to_config
from fedorasflwr.runs import build_supernet
from fedorasflwr.search_spaces.darts import DerivedNetwork
from fedorasflwr.search_spaces.darts_style import mixed_flops, network_flops
from fedorasflwr.training import has_batchnorm
from tests.strategies.test_dpfnas_mechanism import _second_order_setup
from tests.strategies.test_dpfnas_strategy import run, small_dpfnas

M = 1000  # the mixed-flops a test sends: train-flops = 3 x M x sample passes


def _search(space, arrays=None, *, rate, noise, order=1):
    config = ConfigRecord(
        {
            "seed": 0,
            "server-round": 1,
            "sample-rate": rate,
            "clip": 1.0,
            "noise-multiplier": noise,
            "order": order,
            "weight-lr": 0.5,
            "mixed-flops": M,
            **space_to_config(space.spec),
        }
    )
    return RecordDict({ARRAYS: arrays or ArrayRecord(space.state_dict()), CONFIG: config})


def _flops(reply):
    value = reply.metric_records[METRICS]["train-flops"]
    assert isinstance(value, int)
    return value


def test_a_plain_weight_exchange_books_every_sampled_training_sample(space, client_data):
    # rate 1: every training sample is differentiated once
    reply = weight_gradient(_search(space, rate=1.0, noise=0.0), client_data, 0)
    assert _flops(reply) == 3 * M * len(client_data.train)


def test_a_private_party_reports_the_expected_batch_not_the_realised_one(space, client_data):
    n = len(client_data.train)
    rate = 0.1
    replies = [weight_gradient(_search(space, rate=rate, noise=1.0), client_data, 0) for _ in "ab"]
    # p N = 0.1 N samples expected, whatever the Poisson draw (which differs per call)
    assert [_flops(r) for r in replies] == [round(3 * M * rate * n)] * 2


def test_the_architecture_exchange_books_its_validation_samples_and_order_2s_passes():
    """6 training and 3 validation samples. Order 1: each validation sample once, 3 x 3 M.
    Order 2 (Eq. 5): per validation sample its own pass and two passes (W+, W-) of the
    training batch: 3 x (1 + 2 x 6) = 39 sample passes; a private party's expected count
    at rate 0.5: 1.5 x (1 + 2 x 3) = 10.5."""
    tiny, _, data, arrays, _ = _second_order_setup()
    first = architecture_gradient(_search(tiny, arrays, rate=1.0, noise=0.0), data, 0)
    assert _flops(first) == 3 * M * 3
    second = architecture_gradient(_search(tiny, arrays, rate=1.0, noise=0.0, order=2), data, 0)
    assert _flops(second) == 3 * M * 39
    private = architecture_gradient(_search(tiny, arrays, rate=0.5, noise=1.0, order=2), data, 0)
    assert _flops(private) == 3 * M * 10.5 == 31_500


@pytest.mark.parametrize("noise", [0.0, 1.0], ids=["plain", "dp-sgd"])
def test_final_training_books_its_samples_at_the_derived_nets_flops(space, client_data, noise):
    genotype = space.genotype()
    spec = {"channels": 2, "cells": 2, "input_height": 28, "input_width": 28, "stem_stride": 2}
    torch.manual_seed(0)
    net = DerivedNetwork(genotype, **spec)
    f, epochs, batch, n = 500, 2, 16, len(client_data.train)
    config = ConfigRecord(
        {
            "seed": 0,
            "server-round": 1,
            "genotype": genotype.to_text(),
            "local-epochs": epochs,
            "batch-size": batch,
            "lr": 0.05,
            "momentum": 0.0,
            "noise-multiplier": noise,
            "clip": 1.0,
            "net-flops": f,
            **space_to_config({"name": "darts", **spec}),
        }
    )
    reply = train_final(
        RecordDict({ARRAYS: ArrayRecord(net.state_dict()), CONFIG: config}), client_data, 0
    )
    if noise:  # DP-SGD: steps x expected batch (rate B / N x N = B), never the realised
        assert batch < n and final_steps(n, batch, epochs) == 2 * -(-n // batch)
        assert _flops(reply) == 3 * f * final_steps(n, batch, epochs) * batch
    else:  # local_sgd: every sample each epoch, plus a BatchNorm refresh if the net has one
        refresh = n if has_batchnorm(net) else 0
        assert _flops(reply) == 3 * f * epochs * n + f * refresh


@pytest.fixture(scope="module")
def searched(data_cache):
    return run(small_dpfnas(data_cache))


def test_the_ledger_books_both_exchanges_and_the_final_training(searched):
    """2 iterations, batch 8, noised (mode dpfnas): every party books 3 x mixed-flops x 8
    expected samples per exchange; 1 final round (not private, 1 epoch) of
    3 x net-flops per training sample, plus the BatchNorm refresh if the net has one."""
    strategy, _, result = searched
    mixed = strategy.mixed_flops
    assert mixed == mixed_flops(build_supernet(parse_run_config(small_dpfnas("-"))))
    for stage in ("weights", "arch"):
        nodes = result.ledger[stage]["nodes"]
        for party in strategy.parties:
            assert nodes[str(party.node_id)]["train_flops"] == 2 * round(3 * mixed * 8.0)
        assert (
            result.ledger[stage]["totals"]["train_flops"]
            == len(strategy.parties) * 2 * 3 * mixed * 8
        )
    spec = {k: v for k, v in strategy.space.spec.items() if k != "name"}
    net = type(strategy.space).derived_network(result.genotype.to_text(), **spec)
    f = network_flops(net, strategy.space)
    per_sample = 3 * f + (f if has_batchnorm(net) else 0)
    assert result.ledger["final"]["totals"]["train_flops"] == sum(
        per_sample * p.num_train for p in strategy.parties
    )


def _with_flops(reply, value):
    metrics = MetricRecord(dict(reply.content.metric_records[METRICS]))
    if value is None:
        del metrics["train-flops"]
    else:
        metrics["train-flops"] = value
    arrays = reply.content.array_records[ARRAYS]
    return replace_content(reply, RecordDict({ARRAYS: arrays, METRICS: metrics}))


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (-1, "metric 'train-flops' is negative"),
        (float("nan"), "metric 'train-flops' is not finite"),
        (None, "metric 'train-flops' missing"),
        (10**18, "metric 'train-flops' = 1000000000000000000 exceeds"),
    ],
    ids=["negative", "nan", "missing", "above-bound"],
)
def test_a_gradient_reply_with_a_bad_train_flops_is_dropped_naming_the_node(
    data_cache, caplog, value, reason
):
    def poison(reply):
        if reply.has_error() or reply.metadata.message_type != DPFNAS_WEIGHTS:
            return reply
        return _with_flops(reply, value)

    config = small_dpfnas(data_cache, **{"dpfnas.iterations": 1, "dpfnas.final-rounds": 0})
    with caplog.at_level(logging.WARNING):
        strategy, grid, result = run(config, faults={1: poison})
    node = grid.node_of_partition[1]
    assert f"dropped reply of node {node}: {reason}" in caplog.text
    weights = result.ledger["weights"]
    assert weights["totals"]["rejected"] == 1
    assert weights["nodes"][str(node)]["train_flops"] == 0
    assert weights["totals"]["train_flops"] == round(3 * strategy.mixed_flops * 8.0)


def test_a_final_reply_without_train_flops_is_dropped_naming_the_node(data_cache, caplog):
    def poison(reply):
        if reply.has_error() or reply.metadata.message_type != DPFNAS_TRAIN:
            return reply
        return _with_flops(reply, None)

    config = small_dpfnas(data_cache, **{"dpfnas.iterations": 1})
    with caplog.at_level(logging.WARNING):
        _, grid, result = run(config, faults={1: poison})
    node = grid.node_of_partition[1]
    assert f"dropped reply of node {node}: metric 'train-flops' missing" in caplog.text
    final = result.ledger["final"]
    assert final["totals"]["rejected"] == 1
    assert final["nodes"][str(node)]["train_flops"] == 0
    assert final["totals"]["train_flops"] > 0  # the other party's
