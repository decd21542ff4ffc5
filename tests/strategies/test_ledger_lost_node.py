"""A failure is booked once, to the node the message went to, with its kind.

The fake grid answers like Flower 1.41's SuperLink: it gives each message its id
when pushing it, and for a lost node or an expired message it returns the error
reply Flower's own linkstate builds, whose source is the SuperLink (node 1).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message

from fedorasflwr.federation.base import FederatedNASStrategy, NodeProfile
from fedorasflwr.federation.fedavg import SeededFedAvg
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.ledger import Ledger
from fedorasflwr.nonce import echo_nonce
from fedorasflwr.protocol import ARRAYS

echo = ClientApp(mods=[echo_nonce])  # its replies echo the nonce, as the library's


@echo.train("echo")
def _echo(msg: Message, context: Context) -> Message:
    arrays = msg.content.array_records[ARRAYS]
    metrics = MetricRecord({"num-examples": 1})
    return Message(RecordDict({ARRAYS: arrays, "metrics": metrics}), reply_to=msg)


class FlowerLikeGrid(InProcessGrid):
    """Nodes 0..n-1; ``fates[partition]`` is ``ok``, ``lost``, ``expired``, ``crash`` or
    ``silent`` (no reply at all within the timeout)."""

    def __init__(self, num_nodes: int, fates: dict[int, str]) -> None:
        super().__init__(echo, {}, num_nodes)
        self.fates = {self.node_of_partition[p]: fate for p, fate in fates.items()}

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        messages = list(messages)
        for msg in messages:  # as HttpGrid.push_messages does
            msg.metadata.__dict__["_message_id"] = msg.object_id
        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            fate = self.fates.get(node, "ok")
            if fate == "ok":
                replies.append(self.app(msg, self.contexts[node]))
            elif fate == "lost":
                replies.append(create_message_error_unavailable_res_message(msg.metadata, "x"))
            elif fate == "expired":
                replies.append(
                    create_message_error_unavailable_res_message(msg.metadata, "msg_unavail")
                )
            elif fate == "crash":
                error = Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "RuntimeError('boom')")
                replies.append(Message(error, reply_to=msg))
        return replies


class Plain(FederatedNASStrategy):
    def configure_train(self, *args: object) -> list[Message]:
        return []

    def aggregate_train(self, *args: object) -> tuple[None, None]:
        return None, None

    def summary(self) -> None:
        return None


FATES = {0: "ok", 1: "lost", 2: "expired", 3: "crash", 4: "silent", 5: "ok"}
ARRAYS_SENT = ArrayRecord({"w": Array(np.zeros(4, np.float32))})


def messages_to(grid: InProcessGrid) -> list[Message]:
    return [
        Message(
            RecordDict({ARRAYS: ARRAYS_SENT, "config": ConfigRecord()}),
            message_type="train.echo",
            dst_node_id=node,
        )
        for node in grid.get_node_ids()
    ]


def node_counts(ledger: Ledger, stage: str, grid: InProcessGrid) -> dict[int, dict[str, int]]:
    """Per partition id, the ledger's counters; fails on any node the grid does not have."""
    nodes = ledger.summary()[stage]["nodes"]
    partition_of = {str(node): pid for pid, node in grid.node_of_partition.items()}
    assert set(nodes) <= set(partition_of), f"phantom node(s): {set(nodes) - set(partition_of)}"
    return {partition_of[node]: counts for node, counts in nodes.items()}


def check_booked_once(counts: dict[int, dict[str, int]]) -> None:
    assert counts[0]["replies"] == 1 and counts[0]["failed"] == 0
    lost = counts[1]
    assert (lost["messages"], lost["replies"], lost["failed"]) == (1, 0, 1)
    assert (lost["lost"], lost["timed_out"], lost["error_replies"]) == (1, 0, 0)
    assert (counts[2]["failed"], counts[2]["timed_out"], counts[2]["lost"]) == (1, 1, 0)
    assert (counts[3]["failed"], counts[3]["error_replies"], counts[3]["lost"]) == (1, 1, 0)
    assert (counts[4]["failed"], counts[4]["timed_out"], counts[4]["replies"]) == (1, 1, 0)
    assert sum(c["failed"] for c in counts.values()) == 4  # one per failed message


def test_exchange_books_each_failure_once_to_the_right_node_with_its_kind(caplog):
    grid = FlowerLikeGrid(6, FATES)
    strategy = Plain(seed=0, reply_timeout=5.0)
    with caplog.at_level(logging.WARNING):
        good = strategy.exchange(grid, "train", messages_to(grid))
    assert sorted(r.metadata.src_node_id for r in good) == sorted(
        grid.node_of_partition[p] for p in (0, 5)
    )
    counts = node_counts(strategy.ledger, "train", grid)
    check_booked_once(counts)
    assert str(SUPERLINK_NODE_ID) not in strategy.ledger.summary()["train"]["nodes"]
    log = caplog.text
    assert f"node {grid.node_of_partition[1]} lost: error code {ErrorCode.NODE_UNAVAILABLE}" in log
    assert f"node {grid.node_of_partition[2]} timed out: error code" in log
    assert f"node {grid.node_of_partition[3]} failed: error code" in log
    assert f"node {grid.node_of_partition[4]} did not reply within 5 s" in log
    assert f"node {SUPERLINK_NODE_ID} " not in log


def test_seeded_fedavg_books_a_lost_node_to_itself():
    grid = FlowerLikeGrid(6, FATES)
    profiles = [NodeProfile(grid.node_of_partition[p], p, 6, 10, 1, 1, ()) for p in range(6)]
    ledger = Ledger()
    strategy = SeededFedAvg(
        nodes=profiles,
        seed=0,
        stage="final",
        ledger=ledger,
        clients_per_round=6,
        train_message_type="train.echo",
        fraction_evaluate=0.0,
        arrayrecord_key=ARRAYS,
    )
    sent = strategy.configure_train(1, ARRAYS_SENT, ConfigRecord(), grid)
    replies = grid.send_and_receive(sent)
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None
    check_booked_once(node_counts(ledger, "final", grid))


def test_a_reply_to_no_message_of_the_step_is_ignored(caplog):
    grid = FlowerLikeGrid(3, {})
    strategy = Plain(seed=0, reply_timeout=5.0)
    stray = create_message_error_unavailable_res_message(messages_to(grid)[0].metadata, "x")

    class Stray(FlowerLikeGrid):
        def send_and_receive(self, messages, *, timeout=None):  # type: ignore[override]
            return [*super().send_and_receive(messages, timeout=timeout), stray]

    grid.__class__ = Stray
    with caplog.at_level(logging.WARNING):
        good = strategy.exchange(grid, "train", messages_to(grid))
    assert len(good) == 3
    totals = strategy.ledger.stage_totals("train")
    assert totals.failed == 0 and totals.replies == 3
    assert "ignored a reply to no message of this step" in caplog.text


def test_unknown_failure_kind_is_refused():
    with pytest.raises(ValueError, match="failure kind 'gone'.*'lost', 'timeout', 'error'"):
        Ledger().failed("s", 7, "gone")  # type: ignore[arg-type]
