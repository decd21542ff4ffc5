"""SeededFedAvg: Flower's FedAvg with seeded eligible sampling and dropped bad replies."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from fedorasflwr.federation.base import NodeProfile, StageFailedError
from fedorasflwr.federation.fedavg import SeededFedAvg
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.ledger import Ledger
from fedorasflwr.nonce import echo_nonce

demo = ClientApp(mods=[echo_nonce])  # its replies echo the nonce, as the library's


@demo.train("demo")
def _train(msg: Message, context: Context) -> Message:
    """Adds (partition id + 1) to every weight; reports partition id + 1 examples."""
    pid = int(context.node_config["partition-id"])
    arrays = msg.content.array_records["arrays"]
    if pid == 5:  # a broken client: non-finite weights
        out = ArrayRecord(
            {k: Array(np.full(a.shape, np.nan, np.float32)) for k, a in arrays.items()}
        )
    else:
        out = ArrayRecord({k: Array(np.asarray(a.numpy() + pid + 1)) for k, a in arrays.items()})
    metrics = MetricRecord({"num-examples": pid + 1, "train-loss": float(pid)})
    return Message(RecordDict({"arrays": out, "metrics": metrics}), reply_to=msg)


@demo.train("crash")
def _crash(msg: Message, context: Context) -> Message:
    raise RuntimeError("boom")


def profiles(grid: InProcessGrid, partitions) -> list[NodeProfile]:
    return [
        NodeProfile(grid.node_of_partition[p], p, len(grid.node_of_partition), 10, 1, 1, ())
        for p in partitions
    ]


def make(grid, partitions, **kwargs) -> SeededFedAvg:
    options = dict(
        seed=0,
        stage="final",
        ledger=Ledger(),
        clients_per_round=3,
        train_message_type="train.demo",
        fraction_evaluate=0.0,
    )
    options.update(kwargs)
    return SeededFedAvg(nodes=profiles(grid, partitions), **options)


ZERO = ArrayRecord({"w": Array(np.zeros(3, np.float32))})


def test_samples_only_eligible_nodes_reproducibly():
    grid = InProcessGrid(demo, {}, 8)
    strategy = make(grid, [1, 2, 3, 6])
    first = [
        m.metadata.dst_node_id for m in strategy.configure_train(1, ZERO, ConfigRecord(), grid)
    ]
    again = [
        m.metadata.dst_node_id
        for m in make(grid, [1, 2, 3, 6]).configure_train(1, ZERO, ConfigRecord(), grid)
    ]
    eligible = {grid.node_of_partition[p] for p in (1, 2, 3, 6)}
    assert len(first) == 3 and set(first) <= eligible
    assert first == again
    assert all(
        m.metadata.message_type == "train.demo"
        for m in strategy.configure_train(2, ZERO, ConfigRecord(), grid)
    )


def test_aggregation_is_flowers_fedavg_over_the_good_replies_and_bad_ones_are_dropped(caplog):
    grid = InProcessGrid(demo, {}, 8)
    ledger = Ledger()
    strategy = make(grid, [1, 2, 5], ledger=ledger)  # partition 5 replies NaN
    messages = strategy.configure_train(1, ZERO, ConfigRecord(), grid)
    replies = grid.send_and_receive(messages)
    arrays, metrics = strategy.aggregate_train(1, replies)
    good = [r.content for r in replies if r.metadata.src_node_id != grid.node_of_partition[5]]
    expected = aggregate_arrayrecords(good, "num-examples")
    np.testing.assert_allclose(arrays["w"].numpy(), expected["w"].numpy())
    np.testing.assert_allclose(arrays["w"].numpy(), (2 * 2 + 3 * 3) / 5)  # hand-computed
    bad = str(grid.node_of_partition[5])
    assert ledger.summary()["final"]["nodes"][bad]["rejected"] == 1
    assert any(
        f"node {bad}" in r.getMessage() and "non-finite" in r.getMessage() for r in caplog.records
    )


def test_crashes_are_counted_and_too_few_replies_stop_the_stage():
    grid = InProcessGrid(demo, {}, 4)
    strategy = make(grid, [0, 1, 2], train_message_type="train.crash", min_replies=1)
    replies = grid.send_and_receive(strategy.configure_train(1, ZERO, ConfigRecord(), grid))
    with pytest.raises(StageFailedError, match="0 usable replies, at least 1 required"):
        strategy.aggregate_train(1, replies)
    assert strategy.ledger.stage_totals("final").failed == 3


def test_start_runs_rounds_with_flowers_loop():
    grid = InProcessGrid(demo, {}, 6)
    result = make(grid, [0, 1, 2, 3]).start(grid, ZERO, num_rounds=2)
    assert set(result.train_metrics_clientapp) == {1, 2}
    assert np.isfinite(result.arrays["w"].numpy()).all()


def test_integer_buffers_keep_their_dtype_round_after_round():
    grid = InProcessGrid(demo, {}, 6)
    start = ArrayRecord({"w": Array(np.zeros(3, np.float32)), "n": Array(np.array(0, np.int64))})
    result = make(grid, [0, 1, 2, 3]).start(grid, start, num_rounds=3)
    assert result.arrays["n"].numpy().dtype == np.int64  # round 2 and 3 would reject otherwise
    assert set(result.train_metrics_clientapp) == {1, 2, 3}


def test_trained_rounds_reads_the_history_and_the_last_evaluated_accuracy():
    from flwr.serverapp.strategy import Result

    from fedorasflwr.federation.fedavg import trained_rounds

    outcome = Result(
        arrays=ArrayRecord({"w": Array(np.ones(2, dtype=np.float32))}),
        train_metrics_clientapp={1: MetricRecord({"train-loss": 2.0}), 2: MetricRecord({})},
        evaluate_metrics_clientapp={1: MetricRecord({"accuracy": 0.25})},
    )
    trained = trained_rounds(outcome, 3)
    assert trained.arrays is outcome.arrays
    assert trained.history == [
        {"round": 1, "train-loss": 2.0, "test-accuracy": 0.25},
        {"round": 2},
        {"round": 3},
    ]
    assert trained.test_accuracy == 0.25  # the last round that was evaluated
    nan = Result(evaluate_metrics_clientapp={2: MetricRecord({"accuracy": float("nan")})})
    assert trained_rounds(nan, 2).test_accuracy is None
    assert trained_rounds(Result(), 1).test_accuracy is None
