"""Bounded influence: count bounds on replies, robust aggregation (hand-computed values),
one reply per node per step (``screen_replies``), and SeededFedAvg applying all three."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedorasflwr.config import parse_run_config
from fedorasflwr.federation.aggregation import Aggregation, opa
from fedorasflwr.federation.base import NodeProfile
from fedorasflwr.federation.fedavg import SeededFedAvg
from fedorasflwr.federation.replies import (
    Bound,
    array_specs,
    check_bounds,
    check_reply,
    screen_replies,
)
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.ledger import Ledger
from fedorasflwr.nonce import echo_nonce


@pytest.fixture(autouse=True)
def _task_identity():
    """Messages take their run and sender from the task identity an engine sets for the
    ServerApp; the in-process grid sets it the same way."""
    InProcessGrid(ClientApp(), {}, 1)


# --- count bounds ------------------------------------------------------------------------


def test_a_count_above_its_bound_is_named_with_the_basis():
    metrics = MetricRecord({"num-examples": 11, "option-counts": [3, 8]})
    bound = Bound(10, "node declared num-train 10")
    assert check_bounds(metrics, {"num-examples": bound}) == (
        "metric 'num-examples' = 11 exceeds 10 (node declared num-train 10)"
    )
    assert check_bounds(MetricRecord({"num-examples": 10}), {"num-examples": bound}) is None
    # a list metric is bounded element by element
    assert check_bounds(metrics, {"option-counts": bound}) is None
    metrics["option-counts"] = [3, 12]
    assert "'option-counts' = 12 exceeds 10" in check_bounds(metrics, {"option-counts": bound})
    assert check_bounds(metrics, {"absent": bound}) == "metric 'absent' missing"


def test_an_exact_count_must_equal_what_the_server_computes():
    bound = Bound(3.2, "sample-rate 0.1 x num-train 32", exact=True)
    assert check_bounds(MetricRecord({"expected-batch": 3.2}), {"expected-batch": bound}) is None
    reason = check_bounds(MetricRecord({"expected-batch": 0.032}), {"expected-batch": bound})
    assert reason == "metric 'expected-batch' = 0.032, must be 3.2 (sample-rate 0.1 x num-train 32)"


def test_check_reply_applies_the_bounds():
    reply = RecordDict({"metrics": MetricRecord({"num-examples": 10**6})})
    message = Message(reply, reply_to=Message(RecordDict(), dst_node_id=3, message_type="train.x"))
    bound = NodeProfile(3, 0, 1, 120, 10, 10, ()).bound("train", epochs=2)
    assert bound == Bound(240, "node declared (num-train 120) x 2 epoch(s)")
    reason = check_reply(message, bounds={"num-examples": bound})
    assert reason == (
        "metric 'num-examples' = 1000000 exceeds 240 (node declared (num-train 120) x 2 epoch(s))"
    )
    text = NodeProfile(3, 0, 1, 120, 10, 7, ()).bound("train", "val", per_sample=80)
    assert text.limit == 130 * 80


def test_a_negative_batchnorm_variance_is_dropped():
    # finite, right shape and dtype, yet a variance below 0: the aggregate's eval mode
    # would divide by the square root of a negative number
    sent = ArrayRecord(
        {
            "bn.running_var": Array(np.ones(3, np.float32)),
            "bn.running_mean": Array(np.zeros(3, np.float32)),
        }
    )
    specs = array_specs(sent)
    instruction = Message(RecordDict(), dst_node_id=3, message_type="train.x")

    def reply(var: list[float], mean: list[float]) -> Message:
        arrays = record(**{"bn.running_var": var, "bn.running_mean": mean})
        content = RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 5})})
        return Message(content, reply_to=instruction)

    assert check_reply(reply([1.0, 0.0, 2.0], [-1.0, 0.0, 1.0]), sent=specs) is None
    assert check_reply(reply([1.0, -0.5, 2.0], [0.0, 0.0, 0.0]), sent=specs) == (
        "key 'bn.running_var' has negative values (a BatchNorm variance)"
    )


# --- robust aggregation ------------------------------------------------------------------


def record(**arrays) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(v, dtype=np.float32)) for k, v in arrays.items()})


def values(result: ArrayRecord, key: str) -> list[float]:
    return result[key].numpy().tolist()


def test_median_and_trimmed_mean_of_whole_updates_by_hand():
    current = record(w=[0, 0, 0])
    updates = [
        (record(w=[1, 2, 3]), 1),
        (record(w=[4, 0, 9]), 1),
        (record(w=[100, 1, 6]), 98),
    ]
    assert values(opa(current, updates, min_contributors=1), "w") == pytest.approx(
        [(1 + 4 + 9800) / 100, (2 + 98) / 100, (3 + 9 + 588) / 100]
    )
    median = opa(current, updates, min_contributors=1, aggregation=Aggregation("median"))
    assert values(median, "w") == [4, 1, 6]  # the counts do not matter
    # 3 updates, trim 0.2: int(0.6) = 0 cut at each end -> the unweighted mean
    trimmed = opa(current, updates, min_contributors=1, aggregation=Aggregation("trimmed-mean"))
    assert values(trimmed, "w") == pytest.approx([35, 1, 6])
    five = [(record(w=[v, -v, 0]), 1) for v in (1, 2, 3, 4, 100)]
    trimmed = opa(current, five, min_contributors=1, aggregation=Aggregation("trimmed-mean"))
    assert values(trimmed, "w") == pytest.approx([3, -3, 0])  # mean of 2, 3, 4
    wide = Aggregation("trimmed-mean", trim=0.4)  # int(2.0) cut at each end: the middle one
    assert values(opa(current, five, min_contributors=1, aggregation=wide), "w") == [3, -3, 0]


def test_robust_opa_of_partial_updates_uses_the_keys_carriers_with_positive_counts():
    current = record(a=[0], b=[0], c=[7])
    updates = [
        (record(a=[1], b=[10], c=[1]), {"a": 5, "b": 5, "c": 5}),
        (record(a=[3]), {"a": 1}),
        (record(a=[8], b=[20]), {"a": 2, "b": 0}),  # b trained on no sample: not a carrier
        (record(b=[30]), {"b": 3}),
    ]
    mean = opa(current, updates)
    assert values(mean, "a") == pytest.approx([(5 + 3 + 16) / 8])
    assert values(mean, "b") == pytest.approx([(50 + 90) / 8])
    median = opa(current, updates, aggregation=Aggregation("median"))
    assert values(median, "a") == [3]  # median of 1, 3, 8
    assert values(median, "b") == [20]  # median of 10, 30 (the count-0 value 20 is out)
    # OPA's rule stays: a key carried by one update only keeps its value
    assert values(median, "c") == [7]
    assert values(opa(current, updates, aggregation=Aggregation("trimmed-mean")), "c") == [7]


def test_integer_buffers_stay_integers_rounded():
    current = ArrayRecord({"n": Array(np.asarray([0], dtype=np.int64))})
    updates = [(ArrayRecord({"n": Array(np.asarray([v], dtype=np.int64))}), 1) for v in (1, 2)]
    result = opa(current, updates, aggregation=Aggregation("median"))
    assert result["n"].numpy().dtype == np.int64
    assert result["n"].numpy().tolist() == [2]  # 1.5 rounded half to even


def test_bad_aggregation_settings_are_refused_with_the_key_and_what_is_allowed():
    with pytest.raises(ValueError, match="allowed: one of mean, median, trimmed-mean"):
        Aggregation("max")
    with pytest.raises(ValueError, match="0 <= trim < 0.5"):
        Aggregation("trimmed-mean", trim=0.5)
    with pytest.raises(ValueError, match="run config 'aggregation' = 'krum'"):
        parse_run_config({"aggregation": "krum"})
    with pytest.raises(ValueError, match="run config 'aggregation-trim' = -0.1"):
        parse_run_config({"aggregation-trim": -0.1})
    settings = parse_run_config({"aggregation": "trimmed-mean", "aggregation-trim": 0.1})
    own = settings.method_settings
    assert (own.aggregation_rule, own.aggregation_trim) == ("trimmed-mean", 0.1)
    assert parse_run_config({}).method_settings.aggregation_rule == "mean"


@pytest.mark.parametrize("method", ["fedoras", "fdnas", "cfdnas", "dpfnas", "decnas", "fednas"])
def test_the_aggregation_rule_is_a_settings_field_of_every_method(method):
    """From Python: ``<Method>Settings(aggregation_rule=...)``; the strategy takes it, a bad
    rule is refused on construction."""
    from fedorasflwr.methods import settings_class

    cls = settings_class(method)
    assert cls.from_config({"aggregation": "median"}).aggregation_rule == "median"
    with pytest.raises(ValueError, match=r"aggregation_rule = 'zzz': allowed: one of mean"):
        cls(aggregation_rule="zzz")
    with pytest.raises(ValueError, match=r"aggregation_trim = 0.6: allowed: 0 <= trim < 0.5"):
        cls(aggregation_rule="trimmed-mean", aggregation_trim=0.6)
    settings = parse_run_config({"method": method, "aggregation": "trimmed-mean"})
    assert Aggregation.of(settings.method_settings) == Aggregation("trimmed-mean", 0.2)


def test_a_strategy_aggregates_with_its_settings_rule():
    from fedorasflwr.search_spaces import build_space
    from fedorasflwr.strategies import FedorAS, FedorASSettings

    space = build_space("cnn_s", num_classes=10, in_channels=1, input_height=8, input_width=8)
    federated = {"search_scoring": "federated"}  # no server_data needed
    median = FedorASSettings(aggregation_rule="median", **federated)
    assert FedorAS(space=space, settings=median, seed=0).aggregation == Aggregation("median")
    mean = FedorAS(space=space, settings=FedorASSettings(**federated), seed=0)
    assert mean.aggregation == Aggregation()


# --- one reply per node per step -----------------------------------------------------


def instruction(node: int, message_type: str = "train.x") -> Message:
    return Message(RecordDict(), dst_node_id=node, message_type=message_type)


def answer(node: int, message_type: str = "train.x", value: int = 0) -> Message:
    content = RecordDict({"metrics": MetricRecord({"num-examples": value})})
    return Message(content, reply_to=instruction(node, message_type))


def test_screen_keeps_the_first_reply_of_each_addressed_node_of_the_type_sent():
    sent = [instruction(1), instruction(2), instruction(3)]
    first, altered = answer(1, value=1), answer(1, value=10**6)
    wrong = answer(2, "query.profile", value=5)
    right = answer(2, value=2)
    stranger = answer(9, value=9)
    kept, refused = screen_replies(sent, [first, wrong, altered, first, right, stranger])
    assert kept == [first, right]
    assert refused == [
        (2, "reply of type 'query.profile' to a 'train.x' instruction"),
        (1, "more than one reply in one step (only the first counts)"),
        (1, "more than one reply in one step (only the first counts)"),
        (9, "reply from a node that was not addressed"),
    ]


# --- SeededFedAvg: bounds, duplicates, robust aggregation -------------------------------

demo = ClientApp(mods=[echo_nonce])  # its replies echo the nonce, as the library's
INFLATE = {"factor": 1}


@demo.train("demo")
def _train(msg: Message, context: Context) -> Message:
    """Replies w + partition id + 1 with num-examples = partition id + 1 (0: x INFLATE)."""
    pid = int(context.node_config["partition-id"])
    arrays = msg.content.array_records["arrays"]
    out = ArrayRecord({k: Array(np.asarray(a.numpy() + pid + 1)) for k, a in arrays.items()})
    count = (pid + 1) * (INFLATE["factor"] if pid == 0 else 1)
    metrics = MetricRecord({"num-examples": count, "train-loss": float(pid)})
    return Message(RecordDict({"arrays": out, "metrics": metrics}), reply_to=msg)


class DoublingGrid(InProcessGrid):
    """Every reply arrives twice, the second one altered (weights x 1000)."""

    def send_and_receive(self, messages, *, timeout=None):
        replies = list(super().send_and_receive(messages, timeout=timeout))
        extra = []
        for reply in replies:
            arrays = reply.content.array_records["arrays"]
            bad = ArrayRecord({k: Array(a.numpy() * 1000) for k, a in arrays.items()})
            content = RecordDict(
                {"arrays": bad, "metrics": reply.content.metric_records["metrics"]}
            )
            extra.append(
                Message(content, reply_to=instruction(reply.metadata.src_node_id, "train.demo"))
            )
        return replies + extra


def fedavg(grid: InProcessGrid, ledger: Ledger, **kwargs) -> SeededFedAvg:
    nodes = [
        NodeProfile(grid.node_of_partition[p], p, len(grid.node_of_partition), 10, 1, 1, ())
        for p in range(len(grid.node_of_partition))
    ]
    return SeededFedAvg(
        nodes=nodes,
        seed=0,
        stage="final",
        ledger=ledger,
        clients_per_round=3,
        train_message_type="train.demo",
        fraction_evaluate=0.0,
        **kwargs,
    )


def train_once(grid: InProcessGrid, **kwargs) -> tuple[np.ndarray, Ledger]:
    ledger = Ledger()
    strategy = fedavg(grid, ledger, **kwargs)
    result = strategy.start(grid, ArrayRecord({"w": Array(np.zeros(2, np.float32))}), num_rounds=1)
    return result.arrays["w"].numpy(), ledger


def test_fedavg_drops_the_second_altered_reply_and_aggregates_bit_identically():
    clean, _ = train_once(InProcessGrid(demo, {}, 3))
    doubled, ledger = train_once(DoublingGrid(demo, {}, 3))
    assert clean.tolist() == pytest.approx([14 / 6, 14 / 6])  # (1 + 2 x 2 + 3 x 3) / 6
    assert doubled.tobytes() == clean.tobytes()
    assert ledger.stage_totals("final").rejected == 3


def test_fedavg_rejects_inflated_counts_and_robust_rules_ignore_counts():
    INFLATE["factor"] = 10**6
    try:
        mean, ledger = train_once(InProcessGrid(demo, {}, 3))
    finally:
        INFLATE["factor"] = 1
    assert ledger.stage_totals("final").rejected == 1
    assert mean.tolist() == pytest.approx([2.6, 2.6])  # (2 x 2 + 3 x 3) / 5: partitions 1, 2
    median, _ = train_once(InProcessGrid(demo, {}, 3), aggregation=Aggregation("median"))
    assert median.tolist() == [2.0, 2.0]  # median of 1, 2, 3 whatever the counts


def test_screen_leaves_error_replies_to_the_failed_branch():
    sent = [instruction(1)]
    system = Message(Error(0, "node unavailable"), reply_to=instruction(1, "train.x"))
    good = answer(1, value=1)
    kept, refused = screen_replies(sent, [system, good, good])
    assert kept == [system, good]
    assert refused == [(1, "more than one reply in one step (only the first counts)")]
