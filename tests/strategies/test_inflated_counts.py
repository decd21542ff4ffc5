"""Counts above what a node declared are rejected in FDNAS (search) and DP-FNAS
(``expected-batch`` must be sample rate x the declared split size); FDNAS's robust
median ignores the counts of the replies it keeps."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedorasflwr.client_app import app as client_app
from fedorasflwr.federation.aggregation import Aggregation
from fedorasflwr.inprocess import InProcessGrid, replace_content
from fedorasflwr.methods.dpfnas.contract import DPFNAS_WEIGHTS
from fedorasflwr.protocol import ARRAYS, METRICS
from tests.runconfig import tiny_fdnas
from tests.strategies.test_dpfnas_strategy import run as run_dpfnas
from tests.strategies.test_dpfnas_strategy import tiny_dpfnas
from tests.strategies.test_fdnas import NUM_NODES, fake_replies, make_strategy


@pytest.fixture(scope="module")
def fdnas_config(data_cache):
    return tiny_fdnas(data_cache)


def fdnas_round(config):
    strategy = make_strategy(config)
    grid = InProcessGrid(client_app, config, NUM_NODES)
    strategy.setup(grid)
    arrays = ArrayRecord(strategy.space.state_dict())
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    return strategy, arrays, messages


def test_fdnas_rejects_a_data_size_above_the_declared_one(fdnas_config, caplog):
    strategy, arrays, messages = fdnas_round(fdnas_config)
    key = strategy.space.alpha_keys()[0]
    sizes = [10] * len(messages)
    sizes[0] = 10**9

    def alphas(index, k):
        return np.full(arrays[k].shape, float(index), dtype=np.float32)

    with caplog.at_level(logging.WARNING):
        aggregated, metrics = strategy.aggregate_train(
            1, fake_replies(strategy, messages, alphas, sizes)
        )
    assert "metric 'num-examples' = 1000000000 exceeds" in caplog.text
    assert metrics["clients"] == len(messages) - 1
    # the others, at equal counts: the plain mean of 1 .. n-1
    expected = np.mean(np.arange(1, len(messages)))
    np.testing.assert_allclose(aggregated[key].numpy(), expected, rtol=1e-6)


def test_fdnas_median_ignores_the_counts(fdnas_config):
    strategy, arrays, messages = fdnas_round(fdnas_config)
    strategy.aggregation = Aggregation("median")
    key = strategy.space.alpha_keys()[0]
    declared = min(p.num_train + p.num_val for p in strategy.profiles.values())
    sizes = [1] * len(messages)
    sizes[-1] = declared  # the most a node may claim: a mean would lean towards it

    def alphas(index, k):
        return np.full(arrays[k].shape, float(index), dtype=np.float32)

    aggregated, _ = strategy.aggregate_train(1, fake_replies(strategy, messages, alphas, sizes))
    np.testing.assert_allclose(
        aggregated[key].numpy(), np.median(np.arange(len(messages))), rtol=1e-6
    )


def test_dpfnas_rejects_an_expected_batch_other_than_rate_times_declared_size(data_cache, caplog):
    """A party that reports a smaller expected batch divides its gradient sum by less:
    its gradient grows; the server knows the rate and the declared size and refuses it."""

    def shrink(reply):
        if reply.has_error() or reply.metadata.message_type != DPFNAS_WEIGHTS:
            return reply
        metrics = MetricRecord(dict(reply.content.metric_records[METRICS]))
        metrics["expected-batch"] = float(metrics["expected-batch"]) / 10**6
        arrays = reply.content.array_records[ARRAYS]
        return replace_content(reply, RecordDict({ARRAYS: arrays, METRICS: metrics}))

    config = tiny_dpfnas(data_cache, **{"dpfnas.iterations": 1, "dpfnas.final-rounds": 0})
    with caplog.at_level(logging.WARNING):
        strategy, grid, result = run_dpfnas(config, faults={1: shrink})
    node = grid.node_of_partition[1]
    assert f"dropped reply of node {node}: metric 'expected-batch' =" in caplog.text
    assert "must be" in caplog.text and "x num-train" in caplog.text
    assert result.ledger["weights"]["totals"]["rejected"] == 1
    assert result.history[-1]["weights-parties"] == 1
