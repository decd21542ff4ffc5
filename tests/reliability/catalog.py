"""The reliability catalogue: the faults the suite and ``benchmarks/faults.py`` try.

Five kinds, each a list a person can read:

- ``REPLY_FAULTS``: ways a client's reply to a training instruction can be wrong,
  each a function of the honest reply's content (``None``: the client never answers),
  or extra replies (``MULTI_FAULTS``), an earlier reply re-sent (``STALE_FAULTS``), a
  reply that echoes no nonce;
- ``PROFILE_FAULTS``: ways a node's profile (its reply to ``query.profile``) can be
  wrong, each a function of the honest profile's fields;
- ``bad_configs()``: run configs that must be refused before any training, with the
  key the message must name;
- the corrupted files are in ``tests/reliability/test_files.py`` (they need the
  file's own writer);
- the process faults (crashed client, killed SuperNode, ServerApp killed and resumed)
  are in ``tests/reliability/test_faults.py`` and the engine tests.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedorasflwr.federation.replies import REPLY_MARGIN, content_bytes
from fedorasflwr.inprocess import Fault, error_reply, replace_content
from fedorasflwr.packing import PACKED, pack_content
from fedorasflwr.protocol import ARRAYS, METRICS, NONCE, PACKING, PROFILE, QUERY_PROFILE

__all__ = [
    "ARRAY_FAULTS",
    "MULTI_FAULTS",
    "PROFILE_FAULTS",
    "REPLY_FAULTS",
    "STALE_FAULTS",
    "BadConfig",
    "bad_configs",
    "profile_fault",
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


def _malformed_packing(content: RecordDict) -> RecordDict:
    """The honest reply packed, as this project's ClientApp sends it (``fedorasflwr.packing``),
    its buffer 8 bytes shorter than its index says."""
    packed = pack_content(content)
    buffer = packed.array_records[ARRAYS][PACKED].numpy()
    out = RecordDict(dict(packed.items()))
    out[ARRAYS] = ArrayRecord({PACKED: Array(buffer[: max(buffer.size - 8, 0)])})
    return out


def _npy(values: np.ndarray, shape: tuple[int, ...] | None = None) -> bytes:
    """``values`` as ``.npy`` bytes whose header declares ``shape`` (default: its own) and
    its dtype: a header may lie about the bytes behind it."""
    stream = io.BytesIO()
    header = {
        "descr": np.lib.format.dtype_to_descr(values.dtype),
        "fortran_order": False,
        "shape": values.shape if shape is None else shape,
    }
    np.lib.format.write_array_header_2_0(stream, header)
    return stream.getvalue() + np.ascontiguousarray(values).tobytes()


def _lying(sent: Array, data: bytes) -> Array:
    """An ``Array`` whose metadata is what was sent (``sent``'s dtype and shape) and whose
    bytes are ``data`` (Flower 1.41's four-field constructor trusts both)."""
    return Array(dtype=sent.dtype, shape=tuple(sent.shape), stype="numpy.ndarray", data=data)


def _lying_first_float(content: RecordDict, values: Callable[[np.ndarray], bytes]) -> RecordDict:
    arrays = _arrays(content)
    key = _first_float(arrays)
    arrays[key] = _lying(arrays[key], values(arrays[key].numpy()))
    return _with(content, arrays=arrays)


def _complex_nan(values: np.ndarray) -> bytes:
    """The weights as complex64 with a NaN imaginary part, under float32 metadata."""
    out = values.astype(np.complex64)
    out.flat[0] = complex(0.0, math.nan)
    return _npy(out)


def _packed(content: RecordDict, change: Callable[[list, ArrayRecord], ArrayRecord]) -> RecordDict:
    """The honest reply packed as this project's ClientApp packs it, then its index (a
    list of ``[key, dtype, shape, offset]``) and packed array changed by ``change``."""
    packed = pack_content(content)
    packing = packed.config_records[PACKING]
    entries = json.loads(str(packing["index"]))
    arrays = change(entries, packed.array_records[ARRAYS])
    out = RecordDict(dict(packed.items()))
    out[ARRAYS] = arrays
    out[PACKING] = ConfigRecord({**dict(packing), "index": json.dumps(entries)})
    return out


def _first_float_entry(entries: list) -> list:
    return next(e for e in entries if e[1][1] == "f" and math.prod(e[2]) > 1)


def _index_lies_about_a_shape(entries: list, arrays: ArrayRecord) -> ArrayRecord:
    """A float array's shape given as its flat length: the index is still consistent with
    the buffer (same bytes, same offsets), only not with what was sent."""
    entry = _first_float_entry(entries)
    entry[2] = [math.prod(entry[2])]
    return arrays


def _header_declares_2_40(entries: list, arrays: ArrayRecord) -> ArrayRecord:
    """The packed array's ``.npy`` header (and metadata) declares 2^40 bytes; the bytes
    behind it are the honest buffer's."""
    buffer = arrays[PACKED].numpy()
    data = _npy(buffer, (2**40,))
    return ArrayRecord(
        {PACKED: Array(dtype="uint8", shape=(2**40,), stype="numpy.ndarray", data=data)}
    )


def _empty_with_a_huge_shape(entries: list, arrays: ArrayRecord) -> ArrayRecord:
    """The last array's shape declares zero elements on axes of 2^62 (no bytes, so the
    layout holds; numpy cannot even make an empty array of that shape)."""
    entries[-1][2] = [0, 2**62, 2**62]
    return _trim(entries, arrays)


def _trim(entries: list, arrays: ArrayRecord) -> ArrayRecord:
    """The packed buffer cut to the end the (changed) index gives its last entry."""
    key, dtype, shape, offset = entries[-1]
    end = offset + math.prod(shape) * np.dtype(dtype).itemsize
    return ArrayRecord({PACKED: Array(arrays[PACKED].numpy()[:end].copy())})


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


def _without_nonce(reply: Message) -> Message:
    content = RecordDict({k: v for k, v in reply.content.items() if k != NONCE})
    return replace_content(reply, content, keep_nonce=False)


#: kinds where the node re-sends its previous training reply (its nonce included) as its
#: answer to the current instruction: stale reply -> all it sends, given the fresh one
#: (its first training reply goes out unchanged: there is nothing earlier to re-send)
STALE_FAULTS: dict[str, Callable[[Message, Message], list[Message]]] = {
    "stale-reply": lambda stale, fresh: [stale],  # an earlier round's update, instead
    "stale-reply-first": lambda stale, fresh: [stale, fresh],  # before the fresh one
}

#: kind -> how an honest reply's content is made bad (``None``: no reply at all)
REPLY_FAULTS: dict[str, Mutation | None] = {
    "nan-weights": lambda c: _set_first_float(c, math.nan),
    "inf-weights": lambda c: _set_first_float(c, math.inf),
    "wrong-shape": _wrong_shape,
    "wrong-dtype": _wrong_dtype,
    # issue 42: the metadata says what was sent, the bytes say otherwise
    "complex-nan-weights": lambda c: _lying_first_float(c, _complex_nan),
    "wrong-byte-order": lambda c: _lying_first_float(
        c, lambda v: _npy(v.astype(v.dtype.newbyteorder()))
    ),
    "header-other-shape": lambda c: _lying_first_float(c, lambda v: _npy(v.reshape(-1)[:1])),
    "header-2-40-elements": lambda c: _lying_first_float(c, lambda v: _npy(v, (2**40,))),
    "packed-index-lies-about-a-shape": lambda c: _packed(c, _index_lies_about_a_shape),
    "packed-header-2-40-elements": lambda c: _packed(c, _header_declares_2_40),
    "packed-empty-huge-shape": lambda c: _packed(c, _empty_with_a_huge_shape),
    "unknown-key": _unknown_key,
    "no-arrays": _no_arrays,
    "no-metrics": _no_metrics,
    "negative-counts": _negative_counts,
    "non-finite-metric": _non_finite_metric,
    "inflated-counts": _inflated_counts,
    "oversized": _oversized,
    "malformed-packing": _malformed_packing,
    "client-crash": None,  # handled in reply_fault: an error reply
    "missing-nonce": None,  # handled in reply_fault: the reply echoes no nonce
    **{kind: None for kind in MULTI_FAULTS},  # handled in reply_fault
    **{kind: None for kind in STALE_FAULTS},  # handled in reply_fault
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
        "malformed-packing",
        "complex-nan-weights",
        "wrong-byte-order",
        "header-other-shape",
        "header-2-40-elements",
        "packed-index-lies-about-a-shape",
        "packed-header-2-40-elements",
        "packed-empty-huge-shape",
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
    earlier: list[Message] = []  # the node's previous training reply (stale kinds)

    def fault(reply: Message) -> Message | list[Message] | None:
        if reply.has_error() or not reply.metadata.message_type.startswith(message_types):
            return reply
        if kind in STALE_FAULTS:
            previous = earlier.pop() if earlier else None
            earlier.append(reply)
            if previous is None:
                return reply
            sent = STALE_FAULTS[kind](replace_content(reply, previous.content), reply)
            return [r for r in sent if r is reply] if silent else sent
        if kind in ARRAY_FAULTS and ARRAYS not in reply.content.array_records:
            return reply  # a reply that carries no weights (e.g. DecNAS's tune step)
        if kind in MULTI_FAULTS:
            return reply if silent else MULTI_FAULTS[kind](reply)
        if silent:
            return None
        if kind == "client-crash":
            return error_reply(reply, "ClientApp raised RuntimeError('injected')")
        if kind == "missing-nonce":
            return _without_nonce(reply)
        changed = mutation(reply.content) if mutation is not None else None
        return None if changed is None else replace_content(reply, changed)

    return fault


# --- profiles ---------------------------------------------------------------------

Profile = dict[str, Any]


def _scaled_profile(profile: Profile, factor: int, *, labels: bool) -> Profile:
    scaled = {**profile, "num-train": profile["num-train"] * factor}
    if labels:
        scaled["label-counts"] = [c * factor for c in profile["label-counts"]]
    return scaled


#: kind -> the bad profile a node sends instead of its honest one (each refused on arrival)
PROFILE_FAULTS: dict[str, Callable[[Profile], Profile]] = {
    "negative-count": lambda p: {**p, "num-val": -1},
    "fractional-count": lambda p: {**p, "num-train": p["num-train"] + 0.5},
    "bool-count": lambda p: {**p, "num-test": True},
    "missing-field": lambda p: {k: v for k, v in p.items() if k != "num-train"},
    "label-counts-not-a-list": lambda p: {**p, "label-counts": "1,2,3"},
    "zero-train": lambda p: {**p, "num-train": 0, "label-counts": [0] * len(p["label-counts"])},
    "other-label-length": lambda p: {**p, "label-counts": [*p["label-counts"], 0]},
    "negative-label-count": lambda p: {
        **p,
        "label-counts": [-1, *p["label-counts"][1:-1], p["label-counts"][-1] + 1],
    },
    "inflated-train": lambda p: _scaled_profile(p, 10**6, labels=False),
    "labels-not-adding-up": lambda p: {
        **p,
        "label-counts": [*p["label-counts"][:-1], p["label-counts"][-1] + 7],
    },
    "partition-out-of-range": lambda p: {**p, "partition-id": p["num-partitions"] + 3},
    "other-num-partitions": lambda p: {**p, "num-partitions": p["num-partitions"] + 1},
    # declared labels go through an integer check too (an infinite one once stopped the run)
    "infinite-tier": lambda p: {**p, "tier": math.inf},
    "fractional-cluster": lambda p: {**p, "cluster": 0.5},
}


def profile_fault(kind: str, *, silent: bool = False) -> Fault:
    """An ``InProcessGrid`` fault replacing a node's profile by ``PROFILE_FAULTS[kind]`` of
    it (other replies pass unchanged). With ``silent`` the node sends no profile at all
    (what a correct server must make of a bad one: a run without that node)."""
    change = PROFILE_FAULTS[kind]

    def fault(reply: Message) -> Message | None:
        if reply.has_error() or reply.metadata.message_type != QUERY_PROFILE:
            return reply
        if silent:
            return None
        honest = dict(reply.content.config_records[PROFILE])
        return replace_content(reply, RecordDict({PROFILE: ConfigRecord(change(honest))}))

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
#: keys whose default, "auto", stands for an int: a number is one of their values, so they
#: get an int key's mutations besides the unknown word
AUTO_OR_INT = frozenset({"space.layers-per-block"})
#: likewise for a number > 0 (``rounds-scale``: "auto", the rounds rule, or a factor)
AUTO_OR_POSITIVE = frozenset({"rounds-scale"})


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


#: the rounds of a stage that must run: 0 is refused too (0 of an optional stage skips it)
ZERO_ROUNDS = (
    "fedoras.rounds",
    "fedoras.finetune-rounds",
    "fdnas.rounds",
    "fdnas.cluster-rounds",
    "dpfnas.iterations",
)


def bad_configs(defaults: Mapping[str, Any]) -> list[BadConfig]:
    """Every type and range mutation of every key of ``defaults`` (the app's run config),
    zero rounds of every stage that must run, plus the hand-written cross-key cases.
    Mutations a key legitimately accepts (negative values of keys documented to allow
    them) are found by the suite, not listed."""
    out = [BadConfig(f"{key}: zero rounds", key, {key: 0}) for key in ZERO_ROUNDS]
    for key, default in defaults.items():
        mutations = list(_mutations(default))
        if key in AUTO_OR_INT:
            mutations = [m for m in mutations if m[0] != "int-for-text"]
            mutations += [m for m in _mutations(1) if m[0] != "text-for-int"]
        if key in AUTO_OR_POSITIVE:
            mutations = [m for m in mutations if m[0] != "int-for-text"]
            mutations += [m for m in _mutations(1.0) if m[0] != "text-for-float"]
            mutations += [("zero", 0.0), ("bool", True)]
        for label, value in mutations:
            if key in FREE_TEXT and isinstance(value, str):
                continue
            out.append(BadConfig(f"{key}: {label}", key, {key: value}))
        typo = key[:-1]  # "fedoras.rounds" -> "fedoras.round"
        if typo not in defaults:
            out.append(BadConfig(f"{key}: misspelt as {typo!r}", typo, {typo: default}))
    return out + SEMANTIC
