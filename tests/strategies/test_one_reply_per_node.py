"""One reply per node per step, of the type asked; counts within what the node declared;
one node per partition id.  FedorAS Stage 1 on the in-process grid with real clients,
and crafted extra replies added to what the grid returns."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.inprocess import InProcessGrid, plain_reply, replace_content
from fedorasflwr.methods.fedoras.messages import FEDORAS_PATHS, FEDORAS_SUPERNET
from fedorasflwr.methods.fedoras.strategy import FedorAS
from fedorasflwr.protocol import ARRAYS, METRICS, NONCE, QUERY_PROFILE
from fedorasflwr.runs import build_supernet
from tests.runconfig import tiny_fedoras

NUM_NODES = 8
Extra = Callable[[list[Message], list[Message]], list[Message]]  # (sent, replies) -> replies


@pytest.fixture(scope="module")
def run_config(data_cache):
    overrides = {"fedoras.clients-per-round": 4, "fedoras.search-scoring": "federated"}
    return tiny_fedoras(data_cache, **overrides)


class CraftedGrid(InProcessGrid):
    """The in-process grid, its replies then rewritten by ``extra`` (added, reordered)."""

    def __init__(self, *args, extra: Extra, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.extra = extra

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = [plain_reply(r) for r in super().send_and_receive(messages, timeout=timeout)]
        if messages and messages[0].metadata.message_type == FEDORAS_SUPERNET:
            return self.extra(messages, replies)
        return replies


def as_reply(content: RecordDict, node: int, message_type: str) -> Message:
    """A reply from ``node`` carrying ``content``, answering a ``message_type`` instruction."""
    return Message(
        content, reply_to=Message(RecordDict(), dst_node_id=node, message_type=message_type)
    )


def _times(values: np.ndarray, factor: float) -> Array:
    return Array(np.asarray(values * factor, dtype=values.dtype))


def scaled(reply: Message, factor: float) -> RecordDict:
    """``reply``'s content, weights x ``factor``, echoing its nonce (the client knows it)."""
    arrays = reply.content.array_records[ARRAYS]
    return RecordDict(
        {
            ARRAYS: ArrayRecord({k: _times(a.numpy(), factor) for k, a in arrays.items()}),
            METRICS: reply.content.metric_records[METRICS],
            NONCE: reply.content.config_records[NONCE],
        }
    )


def one_round(config, grid: InProcessGrid) -> tuple[FedorAS, ArrayRecord]:
    """Profile, then one Stage-1 round: configure, exchange, aggregate (OPA)."""
    settings = parse_run_config(config)
    strategy = FedorAS(space=build_supernet(settings), settings=settings.method_settings, seed=0)
    strategy.setup(grid)
    arrays = ArrayRecord(strategy.space.state_dict())
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    replies = strategy.exchange(grid, "supernet", messages)
    aggregated, _ = strategy.aggregate_train(1, replies)
    assert aggregated is not None
    return strategy, aggregated


def same_bits(a: ArrayRecord, b: ArrayRecord) -> bool:
    return list(a.keys()) == list(b.keys()) and all(
        a[k].numpy().tobytes() == b[k].numpy().tobytes() for k in a
    )


@pytest.fixture(scope="module")
def clean(run_config):
    return one_round(run_config, InProcessGrid(client_app, run_config, NUM_NODES))[1]


def duplicated(sent, replies):
    copy = replace_content(replies[1], replies[1].content)
    return [replies[0], replies[0], *replies[1:], copy]


def altered_second(sent, replies):
    return replies + [
        as_reply(scaled(r, 1000.0), r.metadata.src_node_id, FEDORAS_SUPERNET) for r in replies[:2]
    ]


def wrong_types_first(sent, replies):
    node = replies[2].metadata.src_node_id
    bad = scaled(replies[2], -3.0)
    return [
        as_reply(bad, node, QUERY_PROFILE),
        as_reply(bad, node, FEDORAS_PATHS),
        *replies,
    ]


def from_a_node_not_addressed(sent, replies):
    return [*replies, as_reply(scaled(replies[0], 5.0), 999, FEDORAS_SUPERNET)]


@pytest.mark.parametrize(
    ("extra", "rejected", "reason"),
    [
        (duplicated, 2, "more than one reply in one step"),
        (altered_second, 2, "more than one reply in one step"),
        (wrong_types_first, 2, "reply of type 'query.profile' to a 'train.fedoras_supernet'"),
        (from_a_node_not_addressed, 1, "reply from a node that was not addressed"),
    ],
)
def test_extra_replies_are_rejected_and_the_aggregate_is_bit_identical(
    run_config, clean, caplog, extra, rejected, reason
):
    grid = CraftedGrid(client_app, run_config, NUM_NODES, extra=extra)
    with caplog.at_level(logging.WARNING):
        strategy, aggregated = one_round(run_config, grid)
    assert same_bits(aggregated, clean)
    assert strategy.ledger.stage_totals("supernet").rejected == rejected
    assert reason in caplog.text
    assert "[supernet] dropped reply of node" in caplog.text


def test_a_reply_from_an_unsampled_node_is_rejected(run_config, clean):
    """A connected, profiled node that was not sampled this round sends an update."""

    def unsampled(sent, replies):
        addressed = {m.metadata.dst_node_id for m in sent}
        other = next(n for n in grid.contexts if n not in addressed)
        return replies + [as_reply(scaled(replies[0], 5.0), other, FEDORAS_SUPERNET)]

    grid = CraftedGrid(client_app, run_config, NUM_NODES, extra=unsampled)
    strategy, aggregated = one_round(run_config, grid)
    assert same_bits(aggregated, clean)
    assert strategy.ledger.stage_totals("supernet").rejected == 1


def inflate(reply: Message) -> Message:
    """Counts x 10^6, kept consistent (every layer's option counts sum to num-examples)."""
    metrics = reply.content.metric_records[METRICS]
    inflated = MetricRecord(dict(metrics))
    inflated["num-examples"] = int(metrics["num-examples"]) * 10**6
    inflated["option-counts"] = [int(c) * 10**6 for c in metrics["option-counts"]]
    content = RecordDict({ARRAYS: reply.content.array_records[ARRAYS], METRICS: inflated})
    return replace_content(reply, content)


def test_inflated_counts_are_rejected_with_the_declared_size(run_config, caplog):
    def inflate_first(sent, replies):
        return [inflate(replies[0]), *replies[1:]]

    grid = CraftedGrid(client_app, run_config, NUM_NODES, extra=inflate_first)
    with caplog.at_level(logging.WARNING):
        strategy, aggregated = one_round(run_config, grid)
    assert strategy.ledger.stage_totals("supernet").rejected == 1
    assert "000000 exceeds" in caplog.text and "(node declared num-train" in caplog.text

    # the aggregate is that of the other replies: the same as when the node sends nothing
    def silent_first(sent, replies):
        return replies[1:]

    quiet = CraftedGrid(client_app, run_config, NUM_NODES, extra=silent_first)
    assert same_bits(aggregated, one_round(run_config, quiet)[1])


def test_a_partition_id_declared_twice_refuses_both_nodes(run_config, caplog):
    grid = InProcessGrid(client_app, run_config, NUM_NODES, node_configs={5: {"partition-id": 4}})
    settings = parse_run_config(run_config)
    strategy = FedorAS(space=build_supernet(settings), settings=settings.method_settings, seed=0)
    with caplog.at_level(logging.WARNING):
        profiles = strategy.profile_nodes(grid, ConfigRecord({"method": "fedoras"}))
    twins = sorted([grid.node_of_partition[4], grid.node_of_partition[5]])
    assert set(profiles) == set(grid.contexts) - set(twins)
    assert sorted(p.partition_id for p in profiles.values()) == [0, 1, 2, 3, 6, 7]
    assert f"partition id 4 declared by nodes {twins[0]}, {twins[1]}: all refused" in caplog.text
    assert "partitions without a node: [4, 5]" in caplog.text
    assert strategy.ledger.stage_totals("profile").rejected == 2


def test_a_duplicate_partition_id_leaves_the_aggregate_of_the_other_nodes(run_config):
    """Nodes 4 and 5 both claim partition 4: the round is bit-identical to one without them."""
    twins = InProcessGrid(client_app, run_config, NUM_NODES, node_configs={5: {"partition-id": 4}})
    without = InProcessGrid(client_app, run_config, NUM_NODES)
    for partition in (4, 5):
        del without.contexts[without.node_of_partition[partition]]
    strategy, aggregated = one_round(run_config, twins)
    assert sorted(p.partition_id for p in strategy.profiles.values()) == [0, 1, 2, 3, 6, 7]
    assert same_bits(aggregated, one_round(run_config, without)[1])
