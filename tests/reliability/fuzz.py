"""Fuzzing the server's decoder of a client's arrays (``fedorasflwr.decoding``,
``fedorasflwr.packing.unpack``), shared by ``test_decoding_fuzz.py`` and
``benchmarks/packing_fuzz.py``.

Each case starts from an honest reply's arrays (a plain ``Array`` of a known spec, or a
packed record) and makes one seeded random change to what a client controls: the packing
index (its JSON, an entry, a field), the packed array's ``.npy`` header, metadata or
length, or a plain array's header, metadata or length. The bytes of the values are never
changed, so the one right outcome besides a refusal is the array that was sent, bit for
bit. :func:`run_case` says which outcome a case had, and the most memory it took
(``tracemalloc``: numpy reports its buffers there too).
"""

from __future__ import annotations

import io
import json
import math
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord

from fedorasflwr.decoding import DecodeError, array_specs, decode_array
from fedorasflwr.packing import PACKED, PackingError, pack, unpack

__all__ = ["OUTCOMES", "Case", "cases", "fuzz", "run_case", "sent_record"]

#: what a case may come to: the sent arrays back, or a refusal; anything else is a bug
OUTCOMES = ("decoded", "refused", "wrong-values", "other-exception")


def sent_record() -> ArrayRecord:
    """What the server sent: arrays of distinct specs (no two keys can stand in for each
    other), of every kind a reply carries, a 0-d and an empty one among them."""
    rng = np.random.default_rng(0)
    return ArrayRecord(
        {
            "conv.weight": Array(rng.standard_normal((4, 1, 3, 3)).astype(np.float32)),
            "conv.bias": Array(rng.standard_normal(7).astype(np.float32)),
            "bn.num_batches_tracked": Array(np.array(5, np.int64)),
            "head.weight": Array(rng.standard_normal((2, 5)).astype(np.float16)),
            "empty": Array(np.zeros((0, 3), np.float64)),
            "mask": Array(np.array([True, False, True])),
        }
    )


@dataclass
class Case:
    """One mutated reply: ``packing`` set for a packed record (``arrays``, ``packing``),
    else ``arrays`` holds one plain array under ``key``."""

    kind: str
    arrays: ArrayRecord
    packing: ConfigRecord | None = None
    key: str = ""


def _npy(values: np.ndarray, header: dict[str, Any], version: tuple[int, int] = (1, 0)) -> bytes:
    stream = io.BytesIO()
    write = np.lib.format.write_array_header_1_0
    if version == (2, 0):
        write = np.lib.format.write_array_header_2_0
    write(stream, header)
    return stream.getvalue() + np.ascontiguousarray(values).tobytes()


def _header(values: np.ndarray) -> dict[str, Any]:
    return {
        "descr": np.lib.format.dtype_to_descr(values.dtype),
        "fortran_order": False,
        "shape": values.shape,
    }


_DTYPES = ["<f4", ">f4", "<f8", "<f2", "<c8", "<c16", "|u1", "|b1", "<i8", ">i8", "<i4", "|i1"]
_BAD_DTYPES = ["|O", "<U4", "|V8", "float32", "f4", "", "<f3", "[('a', '<f4')]"]


def _shape(rng: np.random.Generator) -> Any:
    pick = rng.integers(9)
    if pick == 0:
        return [int(rng.integers(0, 10)) for _ in range(rng.integers(0, 5))]
    if pick == 1:
        return [2**40]
    if pick == 2:
        return [0, 2**62, 2**62]
    if pick == 3:
        return [2**31, 2**31]
    if pick == 4:
        return [-1, 3]
    if pick == 5:
        return [1] * int(rng.integers(30, 70))
    if pick == 6:
        return [1.5]
    if pick == 7:
        return "4,1,3,3"
    return [int(rng.integers(0, 2**63))]


def _field(rng: np.random.Generator, field: int) -> Any:
    """A random value for field ``field`` of an index entry ([key, dtype, shape, offset])."""
    if field == 0:
        return [
            "not-sent",
            "",
            7,
            "conv.weight",
            "mask",
            "x" * 10_000,
        ][rng.integers(6)]
    if field == 1:
        pool = _DTYPES + _BAD_DTYPES
        return pool[rng.integers(len(pool))]
    if field == 2:
        return _shape(rng)
    return [0, 4, 8, -8, 2**40, 2**64, 1.0, None, "8"][rng.integers(9)]


def _index_case(rng: np.random.Generator, arrays: ArrayRecord, packing: ConfigRecord) -> Case:
    entries = json.loads(str(packing["index"]))
    pick = rng.integers(8)
    if pick <= 3:  # one field of one entry
        entry = entries[rng.integers(len(entries))]
        field = int(rng.integers(4))
        entry[field] = _field(rng, field)
        kind = f"index-field-{field}"
    elif pick == 4:  # entries dropped, repeated or swapped
        i, j = rng.integers(len(entries), size=2)
        what = rng.integers(3)
        if what == 0:
            del entries[i]
        elif what == 1:
            entries.append(list(entries[i]))
        else:
            entries[i], entries[j] = entries[j], entries[i]
        kind = "index-entries"
    elif pick == 5:  # an entry's shape flattened or reshaped: same bytes, other shape
        entry = entries[rng.integers(len(entries))]
        count = math.prod(entry[2])
        entry[2] = [count] if rng.integers(2) else [1, count]
        kind = "index-shape-same-bytes"
    elif pick == 6:  # the index replaced by other JSON (or not JSON)
        text = [
            "[" * 5000 + "]" * 5000,
            '{"conv.weight": 1}',
            "[[]]",
            "null",
            "[[" + "1" * 5000 + "]]",
            '[["conv.weight", "<f4", [4, 1, 3, 3], 0]',
            "NaN",
        ][rng.integers(7)]
        return Case("index-text", arrays, ConfigRecord({**dict(packing), "index": text}))
    else:  # the version
        version = [0, 2, True, 1.0, "1", -1][rng.integers(6)]
        return Case("version", arrays, ConfigRecord({**dict(packing), "version": version}))
    return Case(kind, arrays, ConfigRecord({**dict(packing), "index": json.dumps(entries)}))


def _lying_array(rng: np.random.Generator, values: np.ndarray, meta: tuple[str, Any]) -> Array:
    """An ``Array`` of ``values``'s bytes behind a changed header, metadata ``meta`` (dtype,
    shape) possibly changed too, or a changed length."""
    header = _header(values)
    data = _npy(values, header)
    pick = rng.integers(8)
    if pick == 0:
        header["descr"] = _DTYPES[rng.integers(len(_DTYPES))]
        data = _npy(values, header)
    elif pick == 1:
        header["shape"] = tuple(s for s in _shape(rng) if isinstance(s, int))
        data = _npy(values, header)
    elif pick == 2:  # Fortran order, the bytes in that order: an honest variant
        header["fortran_order"] = True
        data = _npy(np.asfortranarray(values).T, header, (2, 0))
    elif pick == 3:  # cut or lengthened
        cut = int(rng.integers(1, 16))
        data = data[:-cut] if rng.integers(2) else data + bytes(cut)
    elif pick == 4:  # the header's bytes themselves garbled
        raw = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            raw[int(rng.integers(0, min(len(raw), 128)))] = int(rng.integers(256))
        data = bytes(raw)
    elif pick == 5:  # a pickle, or not an npy file at all
        data = [b"\x80\x04K\x01.", b"", b"\x93NUMPY", b"\x93NUMPY\x03\x00" + bytes(16)][
            rng.integers(4)
        ]
    elif pick == 6:  # metadata changed (dtype or shape), bytes honest
        dtype, shape = meta
        meta = (_DTYPES[rng.integers(len(_DTYPES))], shape) if rng.integers(2) else (dtype, (7,))
    else:  # header 2.0 of the same array: an honest variant, must decode
        data = _npy(values, header, (2, 0))
    dtype, shape = meta
    return Array(dtype=dtype, shape=tuple(shape), stype="numpy.ndarray", data=data)


def _packed_array_case(
    rng: np.random.Generator, arrays: ArrayRecord, packing: ConfigRecord
) -> Case:
    buffer = arrays[PACKED].numpy()
    meta = ("uint8", (buffer.size,))
    if rng.integers(4) == 0:  # the header and metadata agree on a huge size
        size = int([2**40, 2**62, buffer.size + 1, 10**9][rng.integers(4)])
        data = _npy(buffer, {**_header(buffer), "shape": (size,)})
        holder = Array(dtype="uint8", shape=(size,), stype="numpy.ndarray", data=data)
    else:
        holder = _lying_array(rng, buffer, meta)
    return Case("packed-array", ArrayRecord({PACKED: holder}), packing)


def cases(seed: int, count: int) -> Iterator[Case]:
    """``count`` seeded random cases: about a third each of packing-index, packed-array and
    plain-array changes."""
    rng = np.random.default_rng(seed)
    record = sent_record()
    keys = list(record.keys())
    for _ in range(count):
        arrays, packing = pack(record)
        family = rng.integers(3)
        if family == 0:
            yield _index_case(rng, arrays, packing)
        elif family == 1:
            yield _packed_array_case(rng, arrays, packing)
        else:
            key = keys[rng.integers(len(keys))]
            sent = record[key]
            array = _lying_array(rng, sent.numpy(), (sent.dtype, tuple(sent.shape)))
            yield Case("plain-array", ArrayRecord({key: array}), key=key)


def _same(got: np.ndarray, sent: Array) -> bool:
    want = sent.numpy()
    return (
        got.dtype.str == want.dtype.str
        and got.shape == want.shape
        and np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()
    )


def run_case(case: Case, record: ArrayRecord | None = None) -> dict[str, Any]:
    """The case's outcome (one of :data:`OUTCOMES`), the reason or exception, and the peak
    memory (bytes, ``tracemalloc``) decoding it took."""
    record = sent_record() if record is None else record
    specs = array_specs(record)
    decode: Callable[[], dict[str, np.ndarray]]
    if case.packing is not None:
        packing = case.packing

        def decode() -> dict[str, np.ndarray]:
            out = unpack(case.arrays, packing, specs)
            return {k: decode_array(a, specs[k]) for k, a in out.items()}

    else:

        def decode() -> dict[str, np.ndarray]:
            return {case.key: decode_array(case.arrays[case.key], specs[case.key])}

    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    reason = ""
    try:
        got = decode()
        right = all(_same(v, record[k]) for k, v in got.items())
        outcome = "decoded" if right else "wrong-values"
    except (PackingError, DecodeError) as exc:
        outcome, reason = "refused", str(exc)
    except Exception as exc:  # noqa: BLE001 - what the fuzz looks for
        outcome, reason = "other-exception", f"{type(exc).__name__}: {exc}"[:300]
    peak = tracemalloc.get_traced_memory()[1] - base
    if started:
        tracemalloc.stop()
    return {"kind": case.kind, "outcome": outcome, "reason": reason[:200], "peak-bytes": peak}


def fuzz(seed: int, count: int) -> dict[str, Any]:
    """:func:`run_case` over ``cases(seed, count)``: the count of each outcome overall and
    per kind of change, the largest peak memory and the bad cases (any outcome but
    decoded or refused), with the bytes the honest packed reply holds for scale."""
    record = sent_record()
    packed_bytes = len(pack(record)[0][PACKED].data)
    totals = dict.fromkeys(OUTCOMES, 0)
    kinds: dict[str, dict[str, int]] = {}
    bad: list[dict[str, Any]] = []
    peak = 0
    tracemalloc.start()
    try:
        for case in cases(seed, count):
            row = run_case(case, record)
            totals[row["outcome"]] += 1
            per = kinds.setdefault(row["kind"], dict.fromkeys(OUTCOMES, 0))
            per[row["outcome"]] += 1
            peak = max(peak, row["peak-bytes"])
            if row["outcome"] not in ("decoded", "refused"):
                bad.append(row)
    finally:
        tracemalloc.stop()
    return {
        "seed": seed,
        "cases": count,
        "outcomes": totals,
        "by-kind": kinds,
        "largest-peak-bytes": peak,
        "honest-packed-bytes": packed_bytes,
        "bad": bad[:20],
    }
