"""Checks on client replies, shared by every strategy.

A reply is accepted only if it carries what was asked: an ``ArrayRecord``
whose keys are a subset of what was sent, with the same shapes and dtypes and
finite values, and a ``MetricRecord`` whose required counts are non-negative
and whose values are finite.  ``check_reply`` returns the reason a reply is
rejected, or ``None``.

Counts are also bounded by what the node can honestly claim (``Bound``, built
from its profile and the instruction: ``num-train`` x ``local-epochs`` ...),
so one client cannot take over a weighted aggregate by inflating them.  The
profile is itself client-declared: a node that lies there (a huge
``num-train``) passes the bound; robust aggregation (``aggregation.py``) is the
answer to that case.  ``screen_replies`` keeps one reply per addressed node, of
the message type that was sent, echoing the instruction's nonce.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from ..decoding import ArraySpec, DecodeError, array_specs, decode_array
from ..latency import latency_problem
from ..nonce import describe, nonce_of
from ..protocol import ARRAYS, CONFIG, LATENCY, METRICS, REPLY_BYTES

__all__ = [
    "ArraySpec",
    "asked_back",
    "Bound",
    "REPLY_MARGIN",
    "array_specs",
    "bound_reply_sizes",
    "check_bounds",
    "check_latency_reply",
    "check_reply",
    "check_reply_size",
    "check_whole",
    "content_bytes",
    "error_reason",
    "instructions_of",
    "reply_specs",
    "screen_replies",
]


@dataclass(frozen=True)
class Bound:
    """The most a count may honestly be, and why (e.g. ``"num-train 120 x 2 epoch(s)"``).

    With ``exact``, the count must equal ``limit`` (to a relative 1e-9), e.g.
    DP-FNAS's ``expected-batch``, which the server can compute itself.
    """

    limit: float
    basis: str
    exact: bool = False


def error_reason(message: Message) -> str:
    """Why a failed reply failed (Flower's error code and reason)."""
    return f"error code {message.error.code}: {message.error.reason}"


#: bytes a reply may carry beyond what was sent to its node (``check_reply_size``): room for
#: its metrics (counts, losses, per-path lists, a latency table); an honest reply's arrays
#: are at most what it was sent, or what the instruction asked back (``REPLY_BYTES``). The
#: largest excess of an honest reply in the reliability trials (every method, every message
#: type) is far below it: ``tests/reliability``.
REPLY_MARGIN = 1 << 20


def content_bytes(content: RecordDict) -> int:
    """The size of a message's content as the app holds it: every array's buffer, every
    key and record name, the bytes of strings and bytes values, 8 per number (each element
    of a list)."""
    total = 0
    for name, record in content.items():
        total += len(name)
        for key, value in record.items():
            total += len(key) + _value_bytes(value)
    return total


def _value_bytes(value: object) -> int:
    if isinstance(value, Array):
        return len(value.data)
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, list):
        return sum(_value_bytes(item) for item in value)
    return 8


def asked_back(instruction: Message) -> int:
    """The bytes of arrays ``instruction`` asks back beyond what it carries (config
    ``REPLY_BYTES``, e.g. a DecNAS upload's candidate weights; 0 if none), read from the
    server's own copy of the message."""
    config = instruction.content.config_records.get(CONFIG)
    return int(config.get(REPLY_BYTES, 0)) if config is not None else 0


def check_reply_size(
    instruction: Message, reply: Message, margin: int = REPLY_MARGIN, sent: int | None = None
) -> str | None:
    """Why ``reply`` is larger than the node may send, or ``None``: its content may hold at
    most what ``instruction`` (the message sent to that node) held (``sent``, if already
    counted), plus the arrays it asked back (``asked_back``), plus ``margin`` bytes
    (``content_bytes``). Flower 1.41 bounds no reply's total size on its way (see
    docs/protocol.md), so this is checked where the app first holds the reply: it keeps an
    oversized reply from every later step, not from the SuperLink's or the ServerApp's
    memory."""
    if reply.has_error():
        return None
    sent = content_bytes(instruction.content) if sent is None else sent
    asked = asked_back(instruction)
    size = content_bytes(reply.content)
    if size > sent + asked + margin:
        back = f", {asked} asked back," if asked else ""
        return (
            f"reply of {size} bytes exceeds the {sent} bytes sent to the node{back} "
            f"plus a margin of {margin}"
        )
    return None


def instructions_of(sent: Iterable[Message]) -> Callable[[Message], Message | None]:
    """A function giving the message of ``sent`` a reply answers (by its
    ``reply_to_message_id``; a grid that assigns no ids: the one sent to its node), or
    ``None``."""
    sent = list(sent)
    by_id = {m.metadata.message_id: m for m in sent if m.metadata.message_id}
    by_node = {m.metadata.dst_node_id: m for m in sent}

    def instruction(reply: Message) -> Message | None:
        found = by_id.get(reply.metadata.reply_to_message_id or "")
        return found or by_node.get(reply.metadata.src_node_id)

    return instruction


def reply_specs(instruction: Message) -> dict[str, ArraySpec] | None:
    """The arrays a reply to ``instruction`` (the server's own copy) may carry: those it
    sent (``array_specs``: a reply returns a subset of its keys, each of the same dtype and
    shape), none if it sent none, or ``None`` (unknown here: the method's ``check_reply``
    checks them) when it asks arrays back (``asked_back``) that it does not carry."""
    arrays = instruction.content.array_records.get(ARRAYS)
    if arrays is not None:
        return array_specs(arrays)
    return None if asked_back(instruction) else {}


def bound_reply_sizes(
    sent: Iterable[Message], replies: Iterable[Message], margin: int = REPLY_MARGIN
) -> tuple[list[Message], list[tuple[int, str]]]:
    """The replies within ``check_reply_size`` of the message sent to their node, and
    ``(node id, reason)`` for each one over it (replies to no message sent pass here:
    ``screen_replies`` refuses them). Nothing is decoded: an array's size is the length
    of its bytes."""
    sent = list(sent)
    sizes = {id(m): content_bytes(m.content) for m in sent}  # once per instruction
    instruction_of = instructions_of(sent)
    kept: list[Message] = []
    refused: list[tuple[int, str]] = []
    for reply in replies:
        instruction = instruction_of(reply)
        reason = None
        if instruction is not None:
            reason = check_reply_size(instruction, reply, margin, sizes[id(instruction)])
        if reason is None:
            kept.append(reply)
        else:
            refused.append((reply.metadata.src_node_id, reason))
    return kept, refused


def _check_metrics(metrics: MetricRecord, counts: Iterable[str]) -> str | None:
    for name, value in metrics.items():
        values = value if isinstance(value, list) else [value]
        if not all(math.isfinite(v) for v in values):
            return f"metric {name!r} is not finite"
    for name in counts:
        if name not in metrics:
            return f"metric {name!r} missing"
        value = metrics[name]
        values = value if isinstance(value, list) else [value]
        if any(v < 0 for v in values):
            return f"metric {name!r} is negative"
    return None


def check_whole(metrics: MetricRecord, names: Iterable[str]) -> str | None:
    """Why a metric named in ``names`` (present: ``check_reply`` checks presence, sign and
    finiteness) is not a whole number, or ``None``: e.g. ``train-flops``, which the ledger
    books as an integer; ``1e9`` as a float passes, ``2.5`` does not."""
    for name in names:
        value = metrics.get(name)
        values = value if isinstance(value, list) else [value]
        for v in values:
            if v is not None and not float(v).is_integer():
                return f"metric {name!r} = {v!r} is not a whole number"
    return None


def check_bounds(metrics: MetricRecord, bounds: Mapping[str, Bound]) -> str | None:
    """Why a count in ``metrics`` exceeds (or, ``exact``, differs from) its ``Bound``, or ``None``.

    A list metric (e.g. per-option counts, per-path correct predictions) is
    checked element by element.  A metric named in ``bounds`` must be present.
    """
    for name, bound in bounds.items():
        if name not in metrics:
            return f"metric {name!r} missing"
        value = metrics[name]
        values = value if isinstance(value, list) else [value]
        for v in values:
            if bound.exact:
                if not math.isclose(float(v), bound.limit, rel_tol=1e-9, abs_tol=1e-12):
                    return f"metric {name!r} = {v!r}, must be {bound.limit!r} ({bound.basis})"
            elif v > bound.limit:
                return f"metric {name!r} = {v!r} exceeds {bound.limit!r} ({bound.basis})"
    return None


def _check_arrays(arrays: ArrayRecord, sent: Mapping[str, ArraySpec], required: bool) -> str | None:
    if required and not arrays:
        return "no arrays returned"
    unknown = [key for key in arrays if key not in sent]
    if unknown:
        return f"{len(unknown)} key(s) not sent, e.g. {unknown[0][:60]!r}"
    for key, array in arrays.items():
        try:
            values = decode_array(array, sent[key])  # metadata, header, size, then finite
        except DecodeError as exc:
            return f"key {key!r}: {exc}"
        if key.endswith(".running_var") and (values < 0).any():
            # a BatchNorm variance below 0 would make the aggregate's eval mode NaN
            return f"key {key!r} has negative values (a BatchNorm variance)"
    return None


def check_reply(
    message: Message,
    *,
    sent: Mapping[str, ArraySpec] | None = None,
    counts: Iterable[str] = ("num-examples",),
    arrays_required: bool = True,
    bounds: Mapping[str, Bound] | None = None,
) -> str | None:
    """Why ``message`` must be dropped, or ``None`` if it is well-formed.

    Parameters
    ----------
    message : Message
        A reply without error (check ``has_error()`` first).
    sent : mapping, optional
        Specs of the arrays sent to this node; ``None`` means no arrays expected.
    counts : iterable of str
        Metric names that must be present and non-negative.
    arrays_required : bool
        Whether an empty ``ArrayRecord`` is a reason to drop the reply.
    bounds : mapping of str to Bound, optional
        Counts bounded by what the node can honestly claim (see ``check_bounds``).
    """
    content = message.content
    metrics = content.metric_records.get(METRICS)
    if metrics is None:
        return f"no MetricRecord {METRICS!r}"
    reason = _check_metrics(metrics, counts) or check_bounds(metrics, bounds or {})
    if reason is not None:
        return reason
    if sent is None:
        return None
    arrays = content.array_records.get(ARRAYS)
    if arrays is None:
        return f"no ArrayRecord {ARRAYS!r}"
    try:
        return _check_arrays(arrays, sent, arrays_required)
    except Exception as exc:  # noqa: BLE001 - a client's bytes: any failure is a refusal
        return f"malformed arrays: {type(exc).__name__}: {exc}"[:300]


def check_latency_reply(message: Message, num_options: Sequence[int]) -> str | None:
    """Why a ``query.latency`` reply is not a table of a space with ``num_options`` options
    per layer (every entry finite, options > 0 ms, the validation numbers in range), or
    ``None``."""
    reason = check_reply(message, counts=())
    if reason is not None:
        return reason
    config = message.content.config_records.get(LATENCY)
    if config is None:
        return f"no ConfigRecord {LATENCY!r}"
    return latency_problem(message.content.metric_records[METRICS], config, num_options)


def screen_replies(
    sent: Iterable[Message], replies: Iterable[Message]
) -> tuple[list[Message], list[tuple[int, str]]]:
    """One reply per addressed node, of the message type that was sent to it, echoing
    the nonce of the instruction sent to it (``fedorasflwr.nonce``).

    Returns the replies kept, in arrival order, and ``(node id, reason)`` for
    each one refused: from a node that was not addressed, of another message
    type than the instruction, answering another instruction (an earlier round's
    reply re-sent, no nonce or another one: it takes no one's place), or a second
    (third ...) reply of a node, even if identical.  The first reply of a node that
    passes these checks is the one that counts.  An instruction without a nonce (sent
    by code of your own) is matched by node and type only.  Error replies are kept as
    they are, for the caller's failed-reply branch: Flower itself sends some (node or
    message unavailable) with message type ``"system"`` and the SuperLink as sender.
    """
    sent = list(sent)
    expected = {m.metadata.dst_node_id: m for m in sent}
    answered: set[int] = set()
    kept: list[Message] = []
    replies, refused = bound_reply_sizes(sent, replies)  # none larger than it was sent
    for reply in replies:
        node_id = reply.metadata.src_node_id
        message_type = reply.metadata.message_type
        instruction = expected.get(node_id)
        if reply.has_error():
            kept.append(reply)
        elif instruction is None:
            refused.append((node_id, "reply from a node that was not addressed"))
        elif message_type != instruction.metadata.message_type:
            wanted = instruction.metadata.message_type
            refused.append((node_id, f"reply of type {message_type!r} to a {wanted!r} instruction"))
        elif (reason := _other_instruction(instruction, reply)) is not None:
            refused.append((node_id, reason))
        elif node_id in answered:
            refused.append((node_id, "more than one reply in one step (only the first counts)"))
        else:
            answered.add(node_id)
            kept.append(reply)
    return kept, refused


def _other_instruction(instruction: Message, reply: Message) -> str | None:
    """Why ``reply`` does not answer ``instruction`` (its nonce is not the one sent), or
    ``None``."""
    wanted = nonce_of(instruction)
    if wanted is None:
        return None
    got = nonce_of(reply)
    if got == wanted:
        return None
    if got is None:
        return f"answers another instruction: no nonce, sent {describe(wanted)}"
    if {k: v for k, v in got.items() if k != "tag"} == {
        k: v for k, v in wanted.items() if k != "tag"
    }:
        return f"answers another instruction: a wrong tag for {describe(wanted)}"
    return f"answers another instruction: {describe(got)}, sent {describe(wanted)}"
