"""Replies bound to the instruction they answer (issue 31, items 1 and 2; issue 28, item 4).

- every instruction carries a nonce, every reply of the real ClientApp echoes it; a reply
  that does not (an earlier round's update re-sent, no nonce) is dropped and booked once,
  as rejected, never also as timed out, and a stale reply arriving first does not take the
  fresh one's place (``exchange``);
- every public ``aggregate_train`` applies the same screening, whoever calls it: FedorAS,
  FDNAS and DP-FNAS handed duplicates, a second altered reply, a wrong message type and a
  stale reply directly, as a Flower user's own loop would, aggregate what the honest
  replies alone give, to the bit;
- accepted replies are aggregated in partition-id order: the same replies in another
  order give the same bits, with values whose float sum depends on the order.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.federation.base import NodeProfile
from fedorasflwr.federation.fedavg import SeededFedAvg
from fedorasflwr.inprocess import InProcessGrid, replace_content
from fedorasflwr.ledger import Ledger
from fedorasflwr.methods.dpfnas.strategy import DPFNAS
from fedorasflwr.methods.fdnas.messages import FDNAS_SEARCH
from fedorasflwr.methods.fedoras.strategy import FedorAS
from fedorasflwr.methods.widths.runner import image_spec
from fedorasflwr.methods.widths.strategy import HeteroFL
from fedorasflwr.nonce import echo_nonce, nonce_of
from fedorasflwr.protocol import ARRAYS, METRICS, NONCE, QUERY_PROFILE
from fedorasflwr.runs import build_supernet
from tests.runconfig import FEW_ROWS, tiny_fdnas, tiny_fedoras
from tests.strategies.test_dpfnas_strategy import tiny_dpfnas
from tests.strategies.test_fdnas import fake_replies
from tests.strategies.test_fdnas import make_strategy as fdnas_strategy
from tests.strategies.test_one_reply_per_node import same_bits

NODES = 4  # every client on 64 rows of its own (FEW_ROWS): screening holds at any size


def fedoras(cache):
    config = tiny_fedoras(
        cache,
        **{"fedoras.clients-per-round": NODES, "fedoras.search-scoring": "federated"},
        **FEW_ROWS,
    )
    settings = parse_run_config(config)
    return config, FedorAS(
        space=build_supernet(settings), settings=settings.method_settings, seed=0
    )


def fdnas(cache):
    config = tiny_fdnas(
        cache, **{"fdnas.clients-per-round": NODES, "fdnas.warmup-rounds": 0}, **FEW_ROWS
    )
    return config, fdnas_strategy(config)


def dpfnas(cache):
    config = tiny_dpfnas(cache, **{"dpfnas.mode": "fnas", "space.layers-per-block": 1}, **FEW_ROWS)
    settings = parse_run_config(config)
    return config, DPFNAS(space=build_supernet(settings), settings=settings.method_settings, seed=0)


def fednas(cache):
    from fedorasflwr.strategies import FedNAS
    from tests.runconfig import tiny_fednas

    config = tiny_fednas(cache, **FEW_ROWS)
    settings = parse_run_config(config)
    return config, FedNAS(space=build_supernet(settings), settings=settings.method_settings, seed=0)


def heterofl(cache):
    config = tiny_fedoras(cache, **FEW_ROWS) | {
        "method": "heterofl",
        "heterofl.batch-size": 64,
        "heterofl.lr-probe": False,  # server-side steps before round 1: no reply to screen
    }
    settings = parse_run_config(config)
    return config, HeteroFL(image=image_spec(settings), settings=settings.method_settings, seed=0)


#: method -> (its run config and strategy, the ledger stage of its training replies,
#: the config its configure_train takes)
METHODS = {
    "fedoras": (fedoras, "supernet", dict),
    "fdnas": (fdnas, "search", dict),
    "dpfnas": (dpfnas, "weights", lambda: {"phase": "weights"}),
    "fednas": (fednas, "search", dict),
    "heterofl": (heterofl, "train", dict),
}


def altered(reply: Message, factor: float) -> Message:
    """A second reply of the same node, every float weight x ``factor``, nonce echoed."""
    arrays = ArrayRecord(
        {
            k: Array(np.asarray(a.numpy() * factor, dtype=a.numpy().dtype))
            for k, a in reply.content.array_records[ARRAYS].items()
        }
    )
    content = RecordDict({ARRAYS: arrays, METRICS: reply.content.metric_records[METRICS]})
    return replace_content(reply, content)  # keeps the reply's nonce


def as_type(reply: Message, message_type: str) -> Message:
    """``reply``'s content (its nonce too), sent as a reply of another message type."""
    instruction = Message(
        RecordDict(), dst_node_id=reply.metadata.src_node_id, message_type=message_type
    )
    return Message(reply.content, reply_to=instruction)


@pytest.mark.parametrize("method", list(METHODS))
def test_aggregate_train_called_directly_screens_as_exchange_does(method, data_cache, caplog):
    """A Flower user's own loop: configure_train, the grid, aggregate_train, twice."""
    build, stage, config = METHODS[method]
    run_config, strategy = build(data_cache)
    grid = InProcessGrid(client_app, run_config, NODES)
    strategy.setup(grid)
    model = strategy.space if hasattr(strategy, "space") else strategy.net  # widths: a net
    arrays = ArrayRecord(model.state_dict())
    first = list(strategy.configure_train(1, arrays, ConfigRecord(config()), grid))
    earlier = {r.metadata.src_node_id: r for r in grid.send_and_receive(first)}
    strategy.aggregate_train(1, list(earlier.values()))
    sent = list(strategy.configure_train(2, arrays, ConfigRecord(config()), grid))
    fresh = list(grid.send_and_receive(sent))
    clean, _ = strategy.aggregate_train(2, fresh)
    a, b = fresh[0], fresh[1]
    stale = replace_content(a, earlier[a.metadata.src_node_id].content)  # round 1's nonce
    attacked = [
        stale,  # arrives first: must not take a's place
        as_type(altered(b, -3.0), QUERY_PROFILE),
        *reversed(fresh),
        replace_content(a, a.content),  # an identical duplicate
        altered(b, 1e3),  # a second, altered reply
    ]
    before = strategy.ledger.stage_totals(stage).rejected
    with caplog.at_level(logging.WARNING):
        aggregated, _ = strategy.aggregate_train(2, attacked)
    assert same_bits(aggregated, clean)
    assert strategy.ledger.stage_totals(stage).rejected - before == 4
    node = a.metadata.src_node_id
    assert (
        f"dropped reply of node {node}: answers another instruction: stage {stage}, step 1,"
        f" sent stage {stage}, step 2" in caplog.text
    )
    assert "more than one reply in one step" in caplog.text
    assert f"reply of type '{QUERY_PROFILE}'" in caplog.text


class ReplayGrid(InProcessGrid):
    """The in-process grid; node ``replayer`` answers each search instruction from the second on
    with its previous reply's content (its nonce included): ``"alone"``: instead of the
    fresh reply; ``"first"``: before it; or the fresh reply without nonce (``"no-nonce"``)
    or as a reply of another type (``"wrong-type"``)."""

    def __init__(self, *args, mode: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.mode = mode
        self.replayer = self.node_of_partition[1]
        self.previous: Message | None = None

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for reply in super().send_and_receive(messages, timeout=timeout):
            own = reply.metadata.src_node_id == self.replayer
            if not own or reply.has_error() or reply.metadata.message_type != FDNAS_SEARCH:
                replies.append(reply)
                continue
            previous, self.previous = self.previous, reply
            if previous is None:
                replies.append(reply)
                continue
            if self.mode == "no-nonce":
                content = RecordDict(
                    {k: v for k, v in reply.content.items() if k != NONCE}  # type: ignore[misc]
                )
                replies.append(replace_content(reply, content, keep_nonce=False))
                continue
            if self.mode == "wrong-type":
                replies.append(as_type(reply, QUERY_PROFILE))
                continue
            stale = replace_content(reply, previous.content)
            replies.extend([stale] if self.mode == "alone" else [stale, reply])
        return replies


@pytest.mark.parametrize("mode", ["first", "alone", "no-nonce", "wrong-type"])
def test_a_stale_or_unbound_reply_is_booked_once_and_never_displaces(mode, data_cache, caplog):
    run_config, strategy = fdnas(data_cache)
    grid = ReplayGrid(client_app, run_config, NODES, mode=mode)
    strategy.setup(grid)
    arrays = ArrayRecord(strategy.space.state_dict())
    strategy.exchange(grid, "search", list(strategy.configure_train(1, arrays, {}, grid)))
    sent = list(strategy.configure_train(2, arrays, ConfigRecord(), grid))
    with caplog.at_level(logging.WARNING):
        replies = strategy.exchange(grid, "search", sent)
    node = grid.replayer
    mine = [r for r in replies if r.metadata.src_node_id == node]
    if mode == "first":  # the fresh reply counts, the stale one before it does not
        wanted = next(nonce_of(m) for m in sent if m.metadata.dst_node_id == node)
        assert [nonce_of(r) for r in mine] == [wanted]
    else:
        assert mine == []
    booked = strategy.ledger.node("search", node)
    assert (booked.rejected, booked.failed) == (1, 0)
    assert f"node {node} did not reply" not in caplog.text
    reason = {
        "no-nonce": "answers another instruction: no nonce",
        "wrong-type": f"reply of type '{QUERY_PROFILE}' to a '{FDNAS_SEARCH}' instruction",
    }.get(mode, "answers another instruction: stage search, step 1, sent stage search, step 2")
    assert f"dropped reply of node {node}: {reason}" in caplog.text
    wanted = {m.metadata.dst_node_id: nonce_of(m) for m in sent}
    assert all(nonce_of(r) == wanted[r.metadata.src_node_id] for r in replies)


# --- a fixed order of aggregation ---------------------------------------------------------

#: values whose float sum depends on the order: 1e20 + 1 - 1e20 == 0, 1e20 - 1e20 + 1 == 1
ORDER_SENSITIVE = (1e20, 1.0, -1e20)


def test_fdnas_aggregates_in_partition_order_whatever_the_arrival(data_cache):
    run_config, strategy = fdnas(data_cache)
    grid = InProcessGrid(client_app, run_config, NODES)
    strategy.setup(grid)
    arrays = ArrayRecord(strategy.space.state_dict())
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    values = [*ORDER_SENSITIVE, 0.0]

    def alphas(index, key):
        return np.full(arrays[key].shape, values[index], dtype=np.float32)

    replies = fake_replies(strategy, messages, alphas, [10] * len(messages))
    key = strategy.space.alpha_keys()[0]
    ordered, _ = strategy.aggregate_train(1, replies)
    shuffled, _ = strategy.aggregate_train(1, [replies[0], replies[2], replies[1], replies[3]])
    assert same_bits(ordered, shuffled)
    assert ordered[key].numpy().flat[0] == np.float32(1e20 / 4 + 0.25 - 1e20 / 4)  # 0


demo = ClientApp(mods=[echo_nonce])


@demo.train("order")
def _order(msg: Message, context) -> Message:
    value = ORDER_SENSITIVE[int(context.node_config["partition-id"])]
    arrays = ArrayRecord({"w": Array(np.full(3, value, dtype=np.float64))})
    metrics = MetricRecord({"num-examples": 1})
    return Message(RecordDict({ARRAYS: arrays, METRICS: metrics}), reply_to=msg)


def test_seeded_fedavg_aggregates_in_partition_order_whatever_the_arrival():
    grid = InProcessGrid(demo, {}, 3)
    nodes = [
        NodeProfile(grid.node_of_partition[p], p, 3, 10, 0, 0, (10,), tier=0) for p in range(3)
    ]
    strategy = SeededFedAvg(
        nodes=nodes,
        seed=0,
        stage="order",
        ledger=Ledger(),
        clients_per_round=3,
        train_message_type="train.order",
        arrayrecord_key=ARRAYS,
    )
    arrays = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float64))})

    def aggregate(order):
        messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
        replies = list(grid.send_and_receive(messages))
        by_partition = sorted(
            replies, key=lambda r: grid.contexts[r.metadata.src_node_id].node_config["partition-id"]
        )
        return strategy.aggregate_train(1, [by_partition[i] for i in order])[0]

    ordered, shuffled = aggregate([0, 1, 2]), aggregate([0, 2, 1])
    assert same_bits(ordered, shuffled)
    # the two orders do give different sums: the order is what the test pins down
    assert (1e20 + 1.0) - 1e20 != (1e20 - 1e20) + 1.0
    assert ordered["w"].numpy()[0] == ((1e20 / 3 + 1 / 3) - 1e20 / 3)


def test_seeded_fedavg_books_a_stale_reply_once_as_rejected():
    """SeededFedAvg's own screening: a node whose only reply answers the round before is
    booked once, as rejected (not also as timed out); the others are aggregated."""
    grid = InProcessGrid(demo, {}, 3)
    nodes = [
        NodeProfile(grid.node_of_partition[p], p, 3, 10, 0, 0, (10,), tier=0) for p in range(3)
    ]
    ledger = Ledger()
    strategy = SeededFedAvg(
        nodes=nodes,
        seed=0,
        stage="order",
        ledger=ledger,
        clients_per_round=3,
        train_message_type="train.order",
        arrayrecord_key=ARRAYS,
    )
    arrays = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float64))})
    earlier = list(grid.send_and_receive(strategy.configure_train(1, arrays, ConfigRecord(), grid)))
    fresh = list(grid.send_and_receive(strategy.configure_train(2, arrays, ConfigRecord(), grid)))
    node = grid.node_of_partition[1]
    old = next(r for r in earlier if r.metadata.src_node_id == node)
    replies = [
        replace_content(r, old.content) if r.metadata.src_node_id == node else r for r in fresh
    ]
    strategy.aggregate_train(2, replies)
    booked = ledger.node("order", node)
    assert (booked.rejected, booked.failed) == (1, 0)
