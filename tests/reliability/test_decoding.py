"""A client's arrays are decoded against what was sent, never on its word (issue 42).

- the decoder (``fedorasflwr.decoding.decode_array``) refuses metadata that lies about the
  bytes behind it: complex data under float32 metadata, another byte order, another
  shape, a header declaring 2^40 elements, a pickle; and non-finite float or complex values;
- a packed reply's index is checked against the arrays sent to its node before a byte is
  decoded (``packing.unpack`` with ``sent``), and a reply over its size bound is refused
  before it is unpacked at all (``wire.unpack_replies``);
- a fuzz of a few hundred seeded cases (``tests/reliability/fuzz.py``): each decodes to
  exactly what was sent or is refused with ``PackingError`` / ``DecodeError``, never
  another exception, never a large allocation.

The whole-run cases (every method and width baseline, one node per fault kind, the result
equal to the bit to the run without those replies) are ``test_replies.py``'s trial.
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedorasflwr.decoding import ArraySpec, DecodeError, array_specs, decode_array
from fedorasflwr.federation import wire
from fedorasflwr.federation.replies import check_reply
from fedorasflwr.packing import PACKED, PackingError, pack, pack_content, unpack
from fedorasflwr.protocol import ARRAYS, METRICS, PACKING
from tests.reliability.fuzz import fuzz

SPEC = ArraySpec((4, 1, 3, 3), "float32")
VALUES = np.arange(36, dtype=np.float32).reshape(SPEC.shape)


@pytest.fixture(autouse=True)
def server_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages take their run and sender from the task identity an engine sets."""
    for name, value in (("_run_id", 1), ("_task_id", 0), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value)


def _npy(values: np.ndarray, shape: tuple[int, ...] | None = None) -> bytes:
    stream = io.BytesIO()
    header = {
        "descr": np.lib.format.dtype_to_descr(values.dtype),
        "fortran_order": False,
        "shape": values.shape if shape is None else shape,
    }
    np.lib.format.write_array_header_1_0(stream, header)
    return stream.getvalue() + np.ascontiguousarray(values).tobytes()


def _lying(data: bytes, dtype: str = "float32", shape: tuple = SPEC.shape) -> Array:
    return Array(dtype=dtype, shape=shape, stype="numpy.ndarray", data=data)


def _complex_nan() -> np.ndarray:
    values = VALUES.astype(np.complex64)
    values.flat[3] = complex(1.0, math.nan)
    return values


#: a lying or bad array under the sent spec -> words its refusal must contain
LIES = {
    "complex-nan-under-float32": (_lying(_npy(_complex_nan())), "declares dtype <c8, sent <f4"),
    "big-endian-under-float32": (_lying(_npy(VALUES.astype(">f4"))), "dtype >f4, sent <f4"),
    "other-shape-under-sent-shape": (_lying(_npy(np.ones(7, np.float32))), "shape (7,), sent"),
    "broadcastable-shape": (_lying(_npy(np.ones(1, np.float32))), "shape (1,), sent"),
    "header-2-40-elements": (_lying(_npy(VALUES, (2**40,))), "shape (1099511627776,)"),
    "empty-huge-shape": (_lying(_npy(VALUES[:0], (0, 2**62, 2**62))), "shape (0, 4611686"),
    "short-data": (_lying(_npy(VALUES)[:-4]), "140 bytes of data, its shape and dtype need 144"),
    "long-data": (_lying(_npy(VALUES) + b"\0"), "145 bytes of data"),
    "a-pickle": (_lying(b"\x80\x04K\x01."), "not an npy header"),
    "metadata-dtype": (Array(VALUES.astype(np.float64)), "dtype 'float64', sent float32"),
    "metadata-shape": (Array(VALUES.reshape(-1)), "shape (36,), sent"),
    "other-stype": (
        Array(dtype="float32", shape=SPEC.shape, stype="torch.Tensor", data=_npy(VALUES)),
        "stype 'torch.Tensor'",
    ),
    "nan": (Array(np.where(VALUES == 5, np.nan, VALUES).astype(np.float32)), "non-finite"),
    "inf": (Array(np.where(VALUES == 5, np.inf, VALUES).astype(np.float32)), "non-finite"),
}


@pytest.mark.parametrize("kind", LIES)
def test_the_decoder_refuses_what_was_not_sent_naming_it(kind: str) -> None:
    array, words = LIES[kind]
    with pytest.raises(DecodeError) as caught:
        decode_array(array, SPEC)
    assert words in str(caught.value)


def test_the_decoder_gives_back_what_was_sent_in_any_honest_npy_form() -> None:
    assert np.array_equal(decode_array(Array(VALUES), SPEC), VALUES)
    fortran = Array(np.asfortranarray(VALUES))  # np.save writes Fortran order for it
    assert np.array_equal(decode_array(fortran, SPEC), VALUES)
    empty = ArraySpec((0, 3), "float64")
    assert decode_array(Array(np.zeros((0, 3))), empty).shape == (0, 3)
    complex_spec = ArraySpec((2,), "complex64")
    with pytest.raises(DecodeError, match="non-finite"):  # complex kinds are checked too
        decode_array(Array(np.array([1, complex(math.inf, 0)], np.complex64)), complex_spec)


def _sent() -> ArrayRecord:
    return ArrayRecord({"w": Array(VALUES), "b": Array(np.zeros(7, np.float32))})


def _index(packing: ConfigRecord) -> list:
    return json.loads(str(packing["index"]))


def _with_index(packing: ConfigRecord, entries: list) -> ConfigRecord:
    return ConfigRecord({**dict(packing), "index": json.dumps(entries)})


def test_a_packed_index_is_checked_against_what_was_sent_before_decoding() -> None:
    sent = _sent()
    arrays, packing = pack(sent)
    specs = array_specs(sent)
    assert list(unpack(arrays, packing, specs).keys()) == ["w", "b"]
    entries = _index(packing)
    entries[0][2] = [36]  # the same bytes and offsets: consistent, but not what was sent
    with pytest.raises(PackingError, match=r"array 'w': shape \(36,\), sent \(4, 1, 3, 3\)"):
        unpack(arrays, _with_index(packing, entries), specs)
    unpack(arrays, _with_index(packing, entries))  # without ``sent``: consistent is enough
    entries = _index(packing)
    entries[1][1] = "<i4"
    with pytest.raises(PackingError, match="array 'b': dtype <i4, sent <f4"):
        unpack(arrays, _with_index(packing, entries), specs)
    entries = _index(packing)
    entries[1][0] = "not-sent"
    with pytest.raises(PackingError, match="'not-sent' was not sent"):
        unpack(arrays, _with_index(packing, entries), specs)


def test_a_packed_array_declaring_2_40_bytes_or_a_huge_empty_shape_is_refused() -> None:
    sent = _sent()
    arrays, packing = pack(sent)
    buffer = arrays[PACKED].numpy()
    huge = Array(dtype="uint8", shape=(2**40,), stype="numpy.ndarray", data=_npy(buffer, (2**40,)))
    with pytest.raises(PackingError, match="declares 1099511627776 bytes, it carries"):
        unpack(ArrayRecord({PACKED: huge}), packing)
    entries = _index(packing)
    entries[-1][2] = [0, 2**62, 2**62]  # no bytes: the layout holds without ``sent``
    cut = ArrayRecord({PACKED: Array(buffer[: entries[-1][3]].copy())})
    with pytest.raises(PackingError, match=r"shape \(0, 4611686018427387904"):
        unpack(cut, _with_index(packing, entries), array_specs(sent))
    with pytest.raises(PackingError):  # numpy cannot make it: refused, not ValueError
        unpack(cut, _with_index(packing, entries))


def _reply(instruction: Message, content: RecordDict) -> Message:
    return Message(content, reply_to=instruction)


def test_an_oversized_packed_reply_is_refused_before_it_is_unpacked(monkeypatch) -> None:
    instruction = Message(RecordDict({ARRAYS: _sent()}), dst_node_id=5, message_type="train.x")
    big = ArrayRecord({"w": Array(np.zeros(10**6, np.float32))})
    content = pack_content(RecordDict({ARRAYS: big, METRICS: MetricRecord({"n": 1})}))
    unpacked: list[RecordDict] = []
    monkeypatch.setattr(wire, "unpack_content", lambda c, s=None: unpacked.append(c))
    kept, refused = wire.unpack_replies([_reply(instruction, content)], [instruction])
    assert kept == [] and unpacked == []
    ((node, reason),) = refused
    assert node == 5 and "exceeds the" in reason


def test_unpack_replies_checks_a_packed_reply_against_its_instruction() -> None:
    instruction = Message(RecordDict({ARRAYS: _sent()}), dst_node_id=5, message_type="train.x")
    honest = pack_content(RecordDict({ARRAYS: _sent(), METRICS: MetricRecord({"n": 1})}))
    packing = honest.config_records[PACKING]
    entries = _index(packing)
    entries[0][2] = [36]
    lying = RecordDict(dict(honest.items()))
    lying[PACKING] = _with_index(packing, entries)
    replies = [_reply(instruction, honest), _reply(instruction, lying)]
    kept, refused = wire.unpack_replies(replies, [instruction])
    assert kept == replies[:1] and list(kept[0].content.array_records[ARRAYS]) == ["w", "b"]
    ((node, reason),) = refused
    assert node == 5 and "malformed packed arrays: array 'w': shape (36,)" in reason


def test_check_reply_reads_the_bytes_not_the_metadata() -> None:
    instruction = Message(RecordDict({ARRAYS: _sent()}), dst_node_id=5, message_type="train.x")
    specs = array_specs(_sent())
    for kind in ("complex-nan-under-float32", "big-endian-under-float32", "broadcastable-shape"):
        arrays = ArrayRecord({"w": LIES[kind][0], "b": Array(np.zeros(7, np.float32))})
        content = RecordDict({ARRAYS: arrays, METRICS: MetricRecord({"num-examples": 1})})
        reason = check_reply(_reply(instruction, content), sent=specs)
        assert reason is not None and reason.startswith("key 'w': ") and LIES[kind][1] in reason


def test_a_fuzz_of_the_decoder_decodes_what_was_sent_or_refuses_with_a_reason() -> None:
    result = fuzz(seed=42, count=400)
    assert result["bad"] == []  # no other exception, no wrong values
    outcomes = result["outcomes"]
    assert outcomes["decoded"] > 0 and outcomes["refused"] > 0  # both outcomes reached
    assert outcomes["decoded"] + outcomes["refused"] == 400
    # the cases declare up to 2^62 elements; what was allocated stays near the honest size
    assert result["largest-peak-bytes"] < 1 << 20
