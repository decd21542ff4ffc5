"""FedorAS Stage 1 end to end on the in-process grid: real client code, real data,
tiny space; plus faults a real federation produces."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.costs import array_record_bytes, array_record_elements
from fedorasflwr.data import load_server_data
from fedorasflwr.federation.base import StageFailedError
from fedorasflwr.inprocess import InProcessGrid, error_reply, replace_content
from fedorasflwr.methods.fedoras.evaluation import SupernetEvaluator
from fedorasflwr.methods.fedoras.messages import FEDORAS_SUPERNET
from fedorasflwr.methods.fedoras.strategy import FedorAS
from fedorasflwr.packing import unpack_content
from fedorasflwr.protocol import ARRAYS, METRICS
from fedorasflwr.runs import build_supernet
from tests.runconfig import tiny_fedoras

NUM_NODES = 12


@pytest.fixture(scope="module")
def run_config(data_cache):
    return tiny_fedoras(data_cache)


def make_strategy(config, **overrides):
    settings = parse_run_config(config)
    space = build_supernet(settings)
    overrides.setdefault("server_data", load_server_data(settings.data))
    return FedorAS(space=space, settings=settings.method_settings, seed=settings.seed, **overrides)


def run(config, faults=None, **overrides):
    grid = InProcessGrid(client_app, config, NUM_NODES, faults=faults)
    strategy = make_strategy(config, **overrides)
    strategy.settings = replace(strategy.settings, stop_after="supernet")
    return strategy, grid, strategy.start(grid, ArrayRecord(), strategy.settings.train.rounds)


def supernet_messages(grid):
    return [m for m in grid.sent if m.metadata.message_type == FEDORAS_SUPERNET]


def validated_run(config):
    """`run` with the server-side supernet validation of every round."""
    settings = parse_run_config(config)
    evaluator = SupernetEvaluator(
        build_supernet(settings), load_server_data(settings.data), num_paths=2, seed=0
    )
    return run(config, evaluate_fn=evaluator)


@pytest.fixture(scope="module")
def stage1(run_config):
    """One validated Stage-1 run of the tiny config, shared by the tests that only read it."""
    return validated_run(run_config)


def test_rounds_run_and_every_message_fits_the_comm_budget(stage1):
    strategy, grid, result = stage1
    assert [h["round"] for h in result.history] == [0, 1, 2]
    messages = supernet_messages(grid)
    assert len(messages) == 2 * 6
    full = ArrayRecord(strategy.space.state_dict())
    budget = strategy.comm_size
    largest_option = max(
        strategy.space.option_size(layer, o)
        for layer, n in enumerate(strategy.space.num_options())
        for o in range(n)
    )
    for message in messages:
        elements = array_record_elements(unpack_content(message.content).array_records[ARRAYS])
        assert elements <= budget
        assert elements > budget - largest_option  # options are removed only until it fits
    # the ledger counts the bytes actually sent: about B_comm / supernet of the full model
    nodes = result.ledger["supernet"]["nodes"].values()
    per_message = [n["bytes_down"] / n["messages"] for n in nodes if n["messages"]]
    ratio = np.mean(per_message) / array_record_bytes(full)
    assert 0.5 - largest_option / strategy.space.total_size - 0.05 < ratio <= 0.5 + 0.02


def test_only_sampled_tier_paths_are_trained(stage1):
    strategy, grid, result = stage1
    for message in supernet_messages(grid):
        config = message.content.config_records["config"]
        tier = strategy.tiers[int(config["tier"])]
        assert config["max-flops"] == tier.high
        node = message.metadata.dst_node_id
        assert strategy.tier_of_node(node) == tier.index
    assert result.ledger["supernet"]["totals"]["train_flops"] > 0


def test_same_seed_same_supernet(run_config, stage1):
    _, _, first = stage1
    _, _, second = validated_run(run_config)
    for key in first.arrays:
        np.testing.assert_array_equal(first.arrays[key].numpy(), second.arrays[key].numpy())
    other = dict(run_config, seed=1)
    _, _, third = run(other)
    assert any(
        not np.array_equal(first.arrays[k].numpy(), third.arrays[k].numpy()) for k in first.arrays
    )


def _poison(reply):
    if reply.metadata.message_type != FEDORAS_SUPERNET or reply.has_error():
        return reply
    arrays = reply.content.array_records[ARRAYS]
    bad = ArrayRecord(
        {
            k: Array(
                np.full(a.shape, np.nan, dtype=a.numpy().dtype)
                if a.numpy().dtype.kind == "f"
                else a.numpy()
            )
            for k, a in arrays.items()
        }
    )
    return replace_content(
        reply, RecordDict({ARRAYS: bad, METRICS: reply.content.metric_records[METRICS]})
    )


def _extra_key(reply):
    if reply.metadata.message_type != FEDORAS_SUPERNET or reply.has_error():
        return reply
    arrays = ArrayRecord(dict(reply.content.array_records[ARRAYS].items()))
    arrays["not-a-layer"] = Array(np.zeros(3, np.float32))
    return replace_content(
        reply, RecordDict({ARRAYS: arrays, METRICS: reply.content.metric_records[METRICS]})
    )


def _inflated_counts(reply):
    if reply.metadata.message_type != FEDORAS_SUPERNET or reply.has_error():
        return reply
    metrics = reply.content.metric_records[METRICS]
    counts = [c * 2 for c in metrics["option-counts"]]
    return replace_content(
        reply,
        RecordDict(
            {
                ARRAYS: reply.content.array_records[ARRAYS],
                METRICS: MetricRecord({**dict(metrics), "option-counts": counts}),
            }
        ),
    )


def _crash(reply):
    if reply.metadata.message_type != FEDORAS_SUPERNET:
        return reply
    return error_reply(reply, "ClientApp raised RuntimeError('boom')")


def _silent(reply):
    return None if reply.metadata.message_type == FEDORAS_SUPERNET else reply


@pytest.mark.parametrize("fault", [_poison, _extra_key, _inflated_counts, _crash, _silent])
def test_bad_replies_are_dropped_logged_and_never_corrupt_the_supernet(run_config, fault, caplog):
    faults = {pid: fault for pid in range(0, NUM_NODES, 3)}  # a third of the clients misbehave
    # all sampled; one round shows it (a later round aggregates the same way)
    config = dict(run_config, **{"fedoras.clients-per-round": NUM_NODES, "fedoras.rounds": 1})
    strategy, _, result = run(config, faults=faults)
    bad_nodes = {
        InProcessGrid(client_app, run_config, NUM_NODES).node_of_partition[p] for p in faults
    }
    for array in result.arrays.values():
        values = array.numpy()
        assert values.dtype.kind != "f" or np.isfinite(values).all()
    ledger = result.ledger["supernet"]["nodes"]
    for node in bad_nodes:
        dropped = ledger[str(node)]["rejected"] + ledger[str(node)]["failed"]
        assert dropped == ledger[str(node)]["messages"]
        assert any(f"node {node}" in r.getMessage() for r in caplog.records)


def test_too_few_replies_stop_the_stage_with_the_numbers(run_config):
    faults = {pid: _crash for pid in range(NUM_NODES)}
    with pytest.raises(
        StageFailedError, match=r"0 usable replies out of 6 message\(s\) sent; at least 2"
    ):
        run(run_config, faults=faults)


def test_comm_budget_below_the_smallest_path_is_rejected(run_config):
    config = dict(run_config, **{"fedoras.comm-budget": 0.01})
    with pytest.raises(ValueError, match="fedoras.comm-budget"):
        make_strategy(config)


def test_supernet_validation_is_recorded_each_round(stage1):
    _, _, result = stage1
    accuracies = [h["val-accuracy"] for h in result.history]
    assert len(accuracies) == 3
    assert all(0.0 <= a <= 1.0 and not math.isnan(a) for a in accuracies)


def test_an_impossible_partition_stops_before_training_with_the_clients_reason(data_cache):
    # 0.5% of MNIST-5k left for clients: 25 samples cannot make 12 partitions of 3
    config = tiny_fedoras(data_cache, **{"data.server-fraction": 0.995})
    grid = InProcessGrid(client_app, config, NUM_NODES)
    with pytest.raises(StageFailedError, match=r"\[profile\] 0 usable replies.*Reasons: .*data\."):
        make_strategy(config).start(grid, ArrayRecord())
    assert not supernet_messages(grid)


def test_a_tier_declared_in_the_node_config_wins(run_config):
    grid = InProcessGrid(
        client_app,
        run_config,
        NUM_NODES,
        node_configs={0: {"tier": 4}, 1: {"tier": 1}, 2: {"tier": 9}},
    )
    strategy = make_strategy(run_config)
    strategy.setup(grid)
    assert strategy.tier_of_partition[0] == 3  # the paper's T4
    assert strategy.tier_of_partition[1] == 0  # T1
    assert 0 <= strategy.tier_of_partition[2] < 4  # out of range: assigned like the rest


def test_server_data_without_evaluate_fn_validates_the_supernet_at_eval_every(run_config):
    """A library app passing only ``server_data``: the strategy validates Stage 1 itself,
    at the start, every ``eval-every`` rounds and after the last, as the project's runner
    did."""
    config = {**run_config, "fedoras.rounds": 3, "fedoras.eval-every": 2}
    strategy, _, result = run(config)
    assert isinstance(strategy.evaluate_fn, SupernetEvaluator)
    assert sorted(result.evaluate_metrics_serverapp) == [0, 2, 3]
    for metrics in result.evaluate_metrics_serverapp.values():
        low, mean, high = (metrics[f"val-accuracy{s}"] for s in ("-min", "", "-max"))
        assert 0.0 <= low <= mean <= high
    validated = [h["round"] for h in result.history if "val-accuracy" in h]
    assert validated == [0, 2, 3]
    # one name per number (issue 43): the history's entry is the server metric itself
    for entry in result.history:
        if "val-accuracy" in entry:
            metrics = result.evaluate_metrics_serverapp[entry["round"]]
            assert {k: entry[k] for k in metrics} == dict(metrics)
    # the same numbers as the evaluator the project's runner used to build itself
    settings = parse_run_config(config)
    evaluator = SupernetEvaluator(
        build_supernet(settings),
        load_server_data(settings.data),
        num_paths=settings.method_settings.eval_paths,
        seed=settings.seed,
    )
    assert (
        evaluator(3, result.arrays)["val-accuracy"]
        == result.evaluate_metrics_serverapp[3]["val-accuracy"]
    )


def test_no_server_data_or_eval_every_0_means_no_default_validation(run_config):
    federated = {**run_config, "fedoras.search-scoring": "federated"}
    assert make_strategy(federated, server_data=None).evaluate_fn is None
    quiet = make_strategy({**run_config, "fedoras.eval-every": 0})
    assert quiet.evaluate_fn is None
