"""Per-client communication and compute accounting.

Every message a strategy sends or receives is counted here, by stage and by
node: bytes of arrays down and up, training FLOPs reported by the client,
messages sent, replies received, failed and rejected.  A failure is booked once,
to the node the message was sent to, with its kind: the node was lost (the
SuperLink lost its heartbeat), it did not reply in time (or its reply expired),
or it replied with an error.  Wall time is kept per stage.  The ledger is part
of every result.

Messages are counted by Flower node id (what a message is addressed to, before the
node has said which partition it holds); ``assign`` notes a node's partition id once it
is profiled.  ``summary()`` (what a checkpoint keeps and a result's ``ledger`` holds) is by
node id, each entry with its ``partition_id`` where known; ``by_partition`` turns it into
``result.json``'s form, by partition id.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from flwr.app import Message
from flwr.common.constant import ErrorCode

__all__ = [
    "FailureKind",
    "Ledger",
    "NodeCosts",
    "by_partition",
    "check_summary",
    "failure_kind",
]

FailureKind = Literal["lost", "timeout", "error"]
"""Why a message got no usable reply: node lost, no reply in time, or an error reply."""

_TIMEOUT_CODES = (ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE)


def failure_kind(reply: Message) -> FailureKind:
    """The kind of failure an error reply reports.

    Flower 1.41's SuperLink answers for a node it lost (no heartbeat within its
    patience) with ``NODE_UNAVAILABLE`` and for an expired instruction or reply with
    ``MESSAGE_UNAVAILABLE`` / ``REPLY_MESSAGE_UNAVAILABLE``; every other code is the
    node's own error (ClientApp raised, crashed, failed to load ...).
    """
    code = reply.error.code
    if code == ErrorCode.NODE_UNAVAILABLE:
        return "lost"
    if code in _TIMEOUT_CODES:
        return "timeout"
    return "error"


def _counters(costs: NodeCosts) -> dict[str, int]:
    """``asdict`` for a flat record of ints, without its deep copy (a ledger of 10,000
    nodes is summarised in milliseconds instead of seconds)."""
    return dict(vars(costs))


@dataclass
class NodeCosts:
    """What one node cost in one stage."""

    bytes_down: int = 0
    bytes_up: int = 0
    train_flops: int = 0
    messages: int = 0
    replies: int = 0
    failed: int = 0
    rejected: int = 0
    lost: int = 0
    timed_out: int = 0
    error_replies: int = 0


#: a ``summary()`` node entry's partition id (not a counter; absent: never profiled)
PARTITION_ID = "partition_id"


def check_summary(summary: Any) -> str | None:
    """Why ``summary`` is not a ledger ``summary()`` (per stage: ``seconds`` finite and >= 0,
    ``totals`` and ``nodes`` of integer node ids, each counter of ``NodeCosts`` and a node's
    ``partition_id`` a non-negative integer), naming the field; ``None`` if it is one."""
    if not isinstance(summary, dict):
        return f"is a {type(summary).__name__}, expected a dict of stages"
    names = set(NodeCosts.__dataclass_fields__)
    for stage, content in summary.items():
        if not isinstance(content, dict):
            return f"stage {stage!r} is a {type(content).__name__}, expected a dict"
        seconds = content.get("seconds", 0.0)
        if (
            not isinstance(seconds, int | float)
            or isinstance(seconds, bool)
            or not math.isfinite(seconds)
            or seconds < 0
        ):
            return f"[{stage!r}]['seconds'] = {seconds!r}, expected a finite number >= 0"
        tables = [(f"[{stage!r}]['totals']", content.get("totals", {}))]
        nodes = content.get("nodes", {})
        if not isinstance(nodes, dict):
            return f"[{stage!r}]['nodes'] is a {type(nodes).__name__}, expected a dict"
        for node, counters in nodes.items():
            if not str(node).lstrip("-").isdigit():
                return f"[{stage!r}]['nodes'] has the node id {node!r}, expected an integer"
            tables.append((f"[{stage!r}]['nodes'][{node!r}]", counters))
        for at, (field, counters) in enumerate(tables):
            if not isinstance(counters, dict):
                return f"{field} is a {type(counters).__name__}, expected a dict"
            for name, value in counters.items():
                if name == PARTITION_ID and at > 0:
                    pass  # a node's partition id, checked as a counter is
                elif name not in names:
                    return f"{field} has the unknown counter {name!r}"
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    return f"{field}[{name!r}] = {value!r}, expected an integer >= 0"
    return None


class Ledger:
    """Accumulates costs per stage and node; ``summary()`` is JSON-ready."""

    def __init__(self) -> None:
        self._costs: dict[str, dict[int, NodeCosts]] = defaultdict(lambda: defaultdict(NodeCosts))
        self._seconds: dict[str, float] = defaultdict(float)
        self._partition: dict[int, int] = {}

    def assign(self, node_id: int, partition_id: int) -> None:
        """Note that ``node_id`` holds ``partition_id`` (from its accepted profile)."""
        self._partition[node_id] = int(partition_id)

    def node(self, stage: str, node_id: int) -> NodeCosts:
        """The mutable counters of ``node_id`` in ``stage``."""
        return self._costs[stage][node_id]

    def sent(self, stage: str, node_id: int, nbytes: int) -> None:
        costs = self.node(stage, node_id)
        costs.messages += 1
        costs.bytes_down += nbytes

    def received(self, stage: str, node_id: int, nbytes: int, train_flops: int = 0) -> None:
        costs = self.node(stage, node_id)
        costs.replies += 1
        costs.bytes_up += nbytes
        costs.train_flops += train_flops

    def failed(self, stage: str, node_id: int, kind: FailureKind = "error") -> None:
        """Book one message of ``stage`` to ``node_id`` that got no usable reply.

        ``failed`` counts every such message; ``lost``, ``timed_out`` and
        ``error_replies`` split it by ``kind``.
        """
        costs = self.node(stage, node_id)
        costs.failed += 1
        if kind == "lost":
            costs.lost += 1
        elif kind == "timeout":
            costs.timed_out += 1
        elif kind == "error":
            costs.error_replies += 1
        else:
            raise ValueError(f"failure kind {kind!r}: allowed: 'lost', 'timeout', 'error'")

    def rejected(self, stage: str, node_id: int) -> None:
        self.node(stage, node_id).rejected += 1

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Add the wall time of the ``with`` body to ``stage``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[stage] += time.perf_counter() - start

    def restore(self, summary: dict[str, Any]) -> None:
        """Add the counters and seconds of an earlier ``summary()`` (a resumed run's);
        ``ValueError`` if it is not one (``check_summary``)."""
        reason = check_summary(summary)
        if reason is not None:
            raise ValueError(f"ledger to restore: {reason}")
        for stage, content in summary.items():
            self._seconds[stage] += float(content.get("seconds", 0.0))
            for node, counters in content.get("nodes", {}).items():
                costs = self.node(stage, int(node))
                for name, value in counters.items():
                    if name == PARTITION_ID:
                        self._partition.setdefault(int(node), int(value))
                        continue
                    setattr(costs, name, getattr(costs, name) + int(value))

    def stage_totals(self, stage: str) -> NodeCosts:
        total = NodeCosts()
        for costs in self._costs.get(stage, {}).values():
            for name, value in _counters(costs).items():
                setattr(total, name, getattr(total, name) + value)
        return total

    def summary(self) -> dict[str, Any]:
        """Per stage: totals, wall seconds and per-node counters (node ids as strings), each
        node's with its ``partition_id`` where ``assign`` gave one."""
        stages = sorted(set(self._costs) | set(self._seconds))
        return {
            stage: {
                "seconds": round(self._seconds.get(stage, 0.0), 3),
                "totals": _counters(self.stage_totals(stage)),
                "nodes": {
                    str(node): self._entry(node, costs)
                    for node, costs in sorted(self._costs.get(stage, {}).items())
                },
            }
            for stage in stages
        }

    def _entry(self, node_id: int, costs: NodeCosts) -> dict[str, int]:
        entry = _counters(costs)
        if node_id in self._partition:
            entry[PARTITION_ID] = self._partition[node_id]
        return entry


def by_partition(summary: dict[str, Any]) -> dict[str, Any]:
    """``result.json``'s ledger: a ``Ledger.summary()`` with each stage's ``nodes`` replaced by
    ``partitions`` (partition id -> ``node_ids``, the Flower nodes that held it, and their
    counters summed) and ``unprofiled`` (node id -> counters: nodes that never gave an
    accepted profile, e.g. refused at profiling); ``seconds`` and ``totals`` as they are.

    A node that reconnected under a new node id and took its partition back is one more
    id in that partition's ``node_ids``.
    """
    result: dict[str, Any] = {}
    for stage, content in summary.items():
        partitions: dict[int, dict[str, Any]] = {}
        unprofiled: dict[str, dict[str, int]] = {}
        for node, counters in content.get("nodes", {}).items():
            counts = {k: v for k, v in counters.items() if k != PARTITION_ID}
            if PARTITION_ID not in counters:
                unprofiled[str(node)] = counts
                continue
            entry = partitions.setdefault(int(counters[PARTITION_ID]), {"node_ids": []})
            entry["node_ids"].append(int(node))
            for name, value in counts.items():
                entry[name] = entry.get(name, 0) + value
        result[stage] = {
            **{k: v for k, v in content.items() if k != "nodes"},
            "partitions": {str(p): partitions[p] for p in sorted(partitions)},
            "unprofiled": unprofiled,
        }
    return result
