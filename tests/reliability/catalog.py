"""The reliability catalogue: the faults the suite and ``benchmarks/faults.py`` try.

Four kinds, each a list a person can read:

- ``REPLY_FAULTS``: ways a client's reply to a training instruction can be wrong,
  each a function of the honest reply's content (``None``: the client never answers);
- ``bad_configs()``: run configs that must be refused before any training, with the
  key the message must name;
- the corrupted files are in ``tests/reliability/test_files.py`` (they need the
  file's own writer);
- the process faults (crashed client, killed SuperNode, ServerApp killed and resumed)
  are in ``tests/reliability/test_faults.py`` and the engine tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedorasflwr.federation.replies import REPLY_MARGIN, content_bytes
from fedorasflwr.inprocess import Fault, error_reply, replace_content
from fedorasflwr.protocol import ARRAYS, METRICS

__all__ = [
    "ARRAY_FAULTS",
    "MULTI_FAULTS",
    "REPLY_FAULTS",
    "BadConfig",
    "bad_configs",
    "reply_fault",
]

Mutation = Callable[[RecordDict], RecordDict | None]


def _arrays(content: RecordDict) -> ArrayRecord:
    return ArrayRecord(dict(content.array_records[ARRAYS].items()))


def _with(content: RecordDict, *, arrays: ArrayRecord | None = None, metrics=None) -> RecordDict:
    out = RecordDict()
    for name, record in content.array_records.items():
        out[name] = arrays if (arrays is not None and name == ARRAYS) else record
    for name, record in content.metric_records.items():
        out[name] = metrics if (metrics is not None and name == METRICS) else record
    for name, record in content.config_records.items():
        out[name] = record
    return out


def _first_float(arrays: ArrayRecord) -> str:
    return next(k for k, a in arrays.items() if a.numpy().dtype.kind == "f" and a.numpy().size)


def _set_first_float(content: RecordDict, value: float) -> RecordDict:
    arrays = _arrays(content)
    key = _first_float(arrays)
    values = arrays[key].numpy().copy()
    values.flat[0] = value
    arrays[key] = Array(values)
    return _with(content, arrays=arrays)


def _wrong_shape(content: RecordDict) -> RecordDict:
    arrays = _arrays(content)
    key = _first_float(arrays)
    arrays[key] = Array(np.zeros(arrays[key].numpy().size + 1, dtype=arrays[key].numpy().dtype))
    return _with(content, arrays=arrays)


def _wrong_dtype(content: RecordDict) -> RecordDict:
    arrays = _arrays(content)
    key = _first_float(arrays)
    arrays[key] = Array(arrays[key].numpy().astype(np.float64))
    return _with(content, arrays=arrays)


def _unknown_key(content: RecordDict) -> RecordDict:
    arrays = _arrays(content)
    arrays["not-a-layer"] = Array(np.zeros(3, np.float32))
    return _with(content, arrays=arrays)


def _no_arrays(content: RecordDict) -> RecordDict:
    out = RecordDict()
    for name, record in content.metric_records.items():
        out[name] = record
    return out


def _no_metrics(content: RecordDict) -> RecordDict:
    out = RecordDict()
    for name, record in content.array_records.items():
        out[name] = record
    return out


def _metrics_map(content: RecordDict, change: Callable[[str, Any], Any]) -> RecordDict:
    metrics = content.metric_records[METRICS]
    return _with(content, metrics=MetricRecord({k: change(k, v) for k, v in metrics.items()}))


def _negative_counts(content: RecordDict) -> RecordDict:
    def negate(_: str, value: Any) -> Any:
        return [-abs(v) - 1 for v in value] if isinstance(value, list) else -abs(value) - 1

    return _metrics_map(content, negate)


def _non_finite_metric(content: RecordDict) -> RecordDict:
    first = next(iter(content.metric_records[METRICS]))
    return _metrics_map(
        content,
        lambda k, v: (
            ([math.nan] * len(v) if isinstance(v, list) else math.nan) if k == first else v
        ),
    )


def _inflated_counts(content: RecordDict) -> RecordDict:
    """Every metric x 10^6: the counts stay consistent with each other (option counts
    still sum to num-examples; DP-FNAS's expected batch is a float)."""

    def inflate(_: str, value: Any) -> Any:
        return [v * 10**6 for v in value] if isinstance(value, list) else value * 10**6

    return _metrics_map(content, inflate)


def _scaled_weights(content: RecordDict, factor: float) -> RecordDict:
    """Every float weight times ``factor``; a reply without weights gets its metrics
    scaled instead (an altered copy either way)."""
    if ARRAYS not in content.array_records:
        return _metrics_map(
            content, lambda _, v: [x * 2 for x in v] if isinstance(v, list) else v * 2
        )
    arrays = _arrays(content)
    for key, array in arrays.items():
        values = array.numpy()
        if values.dtype.kind == "f":
            arrays[key] = Array((values * factor).astype(values.dtype))
    return _with(content, arrays=arrays)


def _oversized(content: RecordDict) -> RecordDict:
    """The honest reply plus a ``ConfigRecord`` of junk bytes: more than the node was sent
    plus ``REPLY_MARGIN`` (8x the honest reply, whose arrays are a subset of what was
    sent, plus twice the margin)."""
    out = _with(content)
    out["padding"] = ConfigRecord({"junk": bytes(8 * content_bytes(content) + 2 * REPLY_MARGIN)})
    return out


def _as_other_type(reply: Message, message_type: str, content: RecordDict) -> Message:
    instruction = Message(
        RecordDict(), dst_node_id=reply.metadata.src_node_id, message_type=message_type
    )
    return Message(content, reply_to=instruction)


#: kinds where the node sends more than one reply: honest reply -> all it sends
#: (the honest one among them is what a correct server keeps)
MULTI_FAULTS: dict[str, Callable[[Message], list[Message]]] = {
    "duplicate-reply": lambda r: [r, replace_content(r, r.content)],
    "altered-second-reply": lambda r: [r, replace_content(r, _scaled_weights(r.content, 1e3))],
    "wrong-type-first": lambda r: [
        _as_other_type(r, "query.profile", _scaled_weights(r.content, -3.0)),
        r,
    ],
}

#: kind -> how an honest reply's content is made bad (``None``: no reply at all)
REPLY_FAULTS: dict[str, Mutation | None] = {
    "nan-weights": lambda c: _set_first_float(c, math.nan),
    "inf-weights": lambda c: _set_first_float(c, math.inf),
    "wrong-shape": _wrong_shape,
    "wrong-dtype": _wrong_dtype,
    "unknown-key": _unknown_key,
    "no-arrays": _no_arrays,
    "no-metrics": _no_metrics,
    "negative-counts": _negative_counts,
    "non-finite-metric": _non_finite_metric,
    "inflated-counts": _inflated_counts,
    "oversized": _oversized,
    "client-crash": None,  # handled in reply_fault: an error reply
    **{kind: None for kind in MULTI_FAULTS},  # handled in reply_fault
}


#: the kinds that alter weights (or, oversized, are sized by them): they apply only to
#: replies that carry some
ARRAY_FAULTS = frozenset(
    {
        "nan-weights",
        "inf-weights",
        "wrong-shape",
        "wrong-dtype",
        "unknown-key",
        "no-arrays",
        "oversized",
    }
)


def reply_fault(
    kind: str, message_types: tuple[str, ...] = ("train.",), *, silent: bool = False
) -> Fault:
    """An ``InProcessGrid`` fault applying ``REPLY_FAULTS[kind]`` to the replies whose
    message type starts with one of ``message_types`` (other replies pass unchanged).

    With ``silent``, the replies it would alter are not sent at all instead (for the
    kinds that add replies, only the honest one is sent): the run a correct server
    must reproduce exactly when it drops what was bad."""
    mutation = REPLY_FAULTS[kind]

    def fault(reply: Message) -> Message | None:
        if reply.has_error() or not reply.metadata.message_type.startswith(message_types):
            return reply
        if kind in ARRAY_FAULTS and ARRAYS not in reply.content.array_records:
            return reply  # a reply that carries no weights (e.g. DecNAS's tune step)
        if kind in MULTI_FAULTS:
            return reply if silent else MULTI_FAULTS[kind](reply)
        if silent:
            return None
        if kind == "client-crash":
            return error_reply(reply, "ClientApp raised RuntimeError('injected')")
        changed = mutation(reply.content) if mutation is not None else None
        return None if changed is None else replace_content(reply, changed)

    return fault


# --- run configs ------------------------------------------------------------------


class BadConfig(tuple):
    """``(label, key, overrides)``: ``overrides`` must be refused naming ``key``."""

    __slots__ = ()

    def __new__(cls, label: str, key: str, overrides: Mapping[str, Any]) -> BadConfig:
        return super().__new__(cls, (label, key, dict(overrides)))

    label = property(lambda self: self[0])
    key = property(lambda self: self[1])
    overrides = property(lambda self: self[2])


#: keys whose value is a path: any string parses (a missing checkpoint is a SEMANTIC case)
FREE_TEXT = frozenset({"output-dir", "data.cache-dir", "resume-from", "fedoras.resume-from"})


def _mutations(default: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(default, bool):
        yield "not-a-bool", "yes"
        yield "int-for-bool", 2
    elif isinstance(default, int):
        yield "text-for-int", "abc"
        yield "negative", -1
        yield "fraction-for-int", 2.5
    elif isinstance(default, float):
        yield "text-for-float", "abc"
        yield "negative", -1.0
        yield "nan", math.nan
        yield "inf", math.inf
    elif isinstance(default, str):
        yield "unknown-word", "bogus-value"
        yield "int-for-text", 3


#: hand-written ones the type mutations cannot find: values valid alone, wrong together
SEMANTIC = [
    BadConfig(
        "comm budget below smallest path", "fedoras.comm-budget", {"fedoras.comm-budget": 0.01}
    ),
    BadConfig(
        "unparsable class groups",
        "data.class-groups",
        {"data.partitioner": "class-groups", "data.class-groups": "0,1;x"},
    ),
    BadConfig(
        "resume from a missing file",
        "resume-from",
        {"resume-from": "/nonexistent/supernet.pt"},
    ),
    BadConfig(
        "fractions leave no training data",
        "data.val-fraction",
        {"data.val-fraction": 0.6, "data.test-fraction": 0.6},
    ),
]


def bad_configs(defaults: Mapping[str, Any]) -> list[BadConfig]:
    """Every type and range mutation of every key of ``defaults`` (the app's run config),
    plus the hand-written cross-key cases.  Mutations a key legitimately accepts
    (negative values of keys documented to allow them) are found by the suite, not listed."""
    out = []
    for key, default in defaults.items():
        for label, value in _mutations(default):
            if key in FREE_TEXT and isinstance(value, str):
                continue
            out.append(BadConfig(f"{key}: {label}", key, {key: value}))
        typo = key[:-1]  # "fedoras.rounds" -> "fedoras.round"
        if typo not in defaults:
            out.append(BadConfig(f"{key}: misspelt as {typo!r}", typo, {typo: default}))
    return out + SEMANTIC
