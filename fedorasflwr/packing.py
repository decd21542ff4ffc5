"""One array per message: a message's arrays packed into one contiguous buffer.

Flower 1.41 moves every ``Array`` of a message as an object of its own, each pushed,
hashed and pulled separately: a supernet of 522 arrays took 45-85 s per round trip to
3 nodes over TLS, the same floats as one array 4.6-8.7 s (docs/protocol.md, "Packed
arrays"). So the record ``arrays`` of every message between this project's ServerApp and
ClientApp travels packed:

- ``arrays`` holds ONE ``uint8`` array, ``packed``: every array's raw bytes (C order),
  one after the other in the record's key order, each starting at a multiple of
  :data:`ALIGN` bytes (zero padding between);
- a ``ConfigRecord`` ``packing`` beside it: ``version`` (:data:`VERSION`) and ``index``, a
  JSON list of ``[key, dtype, shape, offset]``, one per array in the original order
  (``dtype`` as numpy's ``dtype.str``, e.g. ``"<f4"``).

``unpack`` rebuilds the ``ArrayRecord`` (same keys, order, dtypes, shapes and values, bit
for bit) and refuses, with :class:`PackingError` naming what is wrong, anything that is
not exactly that layout: an unknown version, an index that is not such a list, a dtype
outside :data:`DTYPE_KINDS`, a key twice, an offset other than the aligned end of the
array before, a buffer shorter or longer than the last array's end, a packed array whose
metadata, ``.npy`` header and byte count disagree (read by ``fedorasflwr.decoding``,
never by ``np.load``). Given the specs of the arrays sent (a server unpacking a reply),
every entry must also name a key sent, with its dtype and shape: all checked before a
byte is decoded, and no exception but :class:`PackingError` escapes.

Who packs: the server packs an instruction only for a node whose profile declares that
its ClientApp reads packed messages (profile field ``packing``: the versions it reads,
:func:`declare`); this project's ClientApp does (:func:`packed_messages`, the outermost
mod ``fedorasflwr.clients.register`` adds). An instruction to such a node always carries
the ``packing`` record (without ``index`` when it has no arrays), which tells the ClientApp
to pack its reply's arrays too. A ClientApp without the mod declares nothing and gets and
sends plain records, as before; the server accepts plain replies from any node.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from .arrays import to_array, view_of
from .decoding import ArraySpec, DecodeError, read_header
from .protocol import ARRAYS, PACKING, PROFILE, QUERY_PROFILE

__all__ = [
    "ALIGN",
    "DTYPE_KINDS",
    "PACKED",
    "PackingError",
    "VERSION",
    "VERSIONS",
    "declare",
    "is_packed",
    "pack",
    "pack_content",
    "packed_messages",
    "packing_versions",
    "unpack",
    "unpack_content",
]

#: the packed form's version (the ``packing`` record's ``version``)
VERSION = 1
#: the versions this code reads (what a profile declares, what ``unpack`` accepts)
VERSIONS = (1,)
#: the key of the one array of a packed ``arrays`` record
PACKED = "packed"
#: every array starts at a multiple of this many bytes of the buffer (numpy's largest
#: natural alignment of the kinds allowed)
ALIGN = 8
#: the most axes an array may have (numpy 1's limit; numpy 2 allows 64)
MAX_DIMS = 32
#: numpy dtype kinds an array may have: bool, signed and unsigned integers, floats, complex
DTYPE_KINDS = "biufc"


class PackingError(ValueError):
    """A packed record that is not the layout of :func:`pack` (the reason says what)."""


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def _plain(array: Array) -> np.ndarray:
    if array.stype != "numpy.ndarray":
        raise PackingError(f"an array of stype {array.stype!r} cannot be packed")
    return view_of(array)


def pack(record: ArrayRecord) -> tuple[ArrayRecord, ConfigRecord]:
    """``record`` as one ``uint8`` array under :data:`PACKED` and the ``packing`` record
    (``version``, ``index``) that :func:`unpack` needs to rebuild it."""
    values = [(key, _plain(array)) for key, array in record.items()]
    index: list[list[Any]] = []
    end = 0
    for key, value in values:
        offset = _aligned(end)
        index.append([key, value.dtype.str, list(value.shape), offset])
        end = offset + value.nbytes
    buffer = np.zeros(end, dtype=np.uint8)
    for (_, value), (_, _, _, offset) in zip(values, index, strict=True):
        if value.nbytes:
            flat = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
            buffer[offset : offset + value.nbytes] = flat
    packed = ArrayRecord({PACKED: Array(buffer)})
    return packed, ConfigRecord({"version": VERSION, "index": json.dumps(index)})


def unpack(
    arrays: ArrayRecord, packing: ConfigRecord, sent: Mapping[str, ArraySpec] | None = None
) -> ArrayRecord:
    """The ``ArrayRecord`` that :func:`pack` packed into ``arrays`` and ``packing``;
    :class:`PackingError` naming the fault for anything else, and for nothing else: no
    other exception escapes, whatever the bytes.

    With ``sent`` (the specs of the arrays sent to the peer: a server unpacking a reply),
    every index entry must name a key that was sent, with exactly its dtype (byte order
    included) and shape. The whole index (keys, dtypes, shapes, offsets, the total size)
    is checked, then the buffer's metadata and ``.npy`` header against the total, all
    before a byte of the buffer is decoded or copied; then each array is copied out of it
    once."""
    try:
        return _unpack(arrays, packing, sent)
    except PackingError:
        raise
    except Exception as exc:  # noqa: BLE001 - a peer's bytes: no other exception escapes
        raise PackingError(f"the packed record does not unpack: {exc!r}"[:200]) from None


def _unpack(
    arrays: ArrayRecord, packing: ConfigRecord, sent: Mapping[str, ArraySpec] | None
) -> ArrayRecord:
    version = packing.get("version")
    if isinstance(version, bool) or version not in VERSIONS:
        raise PackingError(f"unknown packing version {version!r} (this side reads {VERSIONS})")
    entries = _index(packing.get("index"))
    if sent is not None:
        _check_sent(entries, sent)
    if list(arrays.keys()) != [PACKED]:
        raise PackingError(f"a packed record holds one array {PACKED!r}, not {list(arrays)}")
    ends = []
    end = 0
    for key, dtype, shape, offset in entries:
        if offset != _aligned(end):
            raise PackingError(f"array {key[:60]!r} starts at byte {offset}, not {_aligned(end)}")
        end = offset + math.prod(shape) * dtype.itemsize  # Python's integers: no overflow
        ends.append(end)
    data, start = _buffer(arrays[PACKED])
    size = len(data) - start
    for (key, *_), stop in zip(entries, ends, strict=True):
        if stop > size:
            raise PackingError(
                f"array {key[:60]!r} ends at byte {stop}, past the buffer's {size} bytes"
            )
    if end != size:
        raise PackingError(f"the buffer holds {size} bytes, the index {end}")
    out = ArrayRecord()
    for key, dtype, shape, offset in entries:
        count = math.prod(shape)
        if count == 0:
            value = np.zeros(shape, dtype)
        else:
            value = np.frombuffer(data, dtype, count, start + offset).reshape(shape)
        out[key] = to_array(value)  # the .npy bytes of a view of the buffer: the one copy
    return out


def _check_sent(
    entries: list[tuple[str, np.dtype, tuple[int, ...], int]], sent: Mapping[str, ArraySpec]
) -> None:
    """Every entry names a key that was sent, with its dtype and shape (the offsets and
    total follow from these: checked against the buffer by the caller)."""
    for key, dtype, shape, _ in entries:
        spec = sent.get(key)
        if spec is None:
            raise PackingError(f"array {key[:60]!r} was not sent")
        wanted = np.dtype(spec.dtype)
        if dtype.str != wanted.str:
            raise PackingError(f"array {key[:60]!r}: dtype {dtype.str}, sent {wanted.str}")
        if shape != tuple(spec.shape):
            raise PackingError(f"array {key[:60]!r}: shape {shape}, sent {tuple(spec.shape)}")


def _buffer(holder: Array) -> tuple[bytes, int]:
    """The packed array's bytes and where its data starts, its metadata and ``.npy``
    header checked (a ``uint8`` array of one axis, as many bytes as declared), nothing
    decoded."""
    if holder.stype != "numpy.ndarray":
        raise PackingError(f"the packed array has stype {holder.stype!r}")
    try:
        header = read_header(holder.data)
    except DecodeError as exc:
        raise PackingError(f"the packed array does not load: {exc}") from None
    if header.dtype != np.uint8 or len(header.shape) != 1:
        raise PackingError(
            f"the packed array is {header.dtype} of shape {header.shape}, not uint8 of one axis"
        )
    if holder.dtype != "uint8" or tuple(holder.shape) != header.shape:
        raise PackingError(
            f"the packed array's metadata ({str(holder.dtype)[:20]}, {str(holder.shape)[:40]}) "
            f"is not its header's (uint8, {header.shape})"
        )
    carried = len(holder.data) - header.offset
    if carried != header.shape[0]:
        raise PackingError(
            f"the packed array's header declares {header.shape[0]} bytes, it carries {carried}"
        )
    return holder.data, header.offset


def _index(text: Any) -> list[tuple[str, np.dtype, tuple[int, ...], int]]:
    """The ``index`` entries, each checked in form (not yet against the buffer)."""
    if not isinstance(text, str):
        raise PackingError(f"the index is {type(text).__name__}, not a JSON string")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise PackingError(f"the index is not JSON: {exc}") from None
    if not isinstance(raw, list):
        raise PackingError("the index is not a list")
    entries = []
    seen: set[str] = set()
    for entry in raw:
        if not (isinstance(entry, list) and len(entry) == 4):
            raise PackingError(f"index entry {str(entry)[:60]} is not [key, dtype, shape, offset]")
        key, dtype, shape, offset = entry
        if not isinstance(key, str) or not key:
            raise PackingError(f"index key {str(key)[:60]!r} is not a non-empty string")
        if key in seen:
            raise PackingError(f"index key {key[:60]!r} appears twice")
        seen.add(key)
        if not (isinstance(shape, list) and all(_natural(d) for d in shape)):
            raise PackingError(f"array {key[:60]!r}: shape {str(shape)[:60]} is not integers >= 0")
        if len(shape) > MAX_DIMS:
            raise PackingError(f"array {key[:60]!r}: {len(shape)} axes, more than {MAX_DIMS}")
        if not _natural(offset):
            raise PackingError(f"array {key[:60]!r}: offset {offset!r} is not an integer >= 0")
        entries.append((key, _dtype(key, dtype), tuple(shape), offset))
    return entries


def _natural(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _dtype(key: str, text: Any) -> np.dtype:
    """``text`` as a numpy dtype of :data:`DTYPE_KINDS`, written as numpy writes it."""
    try:
        dtype = np.dtype(text) if isinstance(text, str) else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in DTYPE_KINDS or dtype.str != text:
        raise PackingError(f"array {key[:60]!r}: dtype {str(text)[:40]!r} is not allowed")
    return dtype


# --- messages ---------------------------------------------------------------------------


def is_packed(content: RecordDict) -> bool:
    """Whether ``content`` carries a ``packing`` record (packed arrays, or none at all)."""
    return PACKING in content.config_records


def pack_content(
    content: RecordDict, cache: dict[int, tuple[ArrayRecord, ConfigRecord]] | None = None
) -> RecordDict:
    """A new ``RecordDict`` with ``content``'s records, its ``arrays`` packed and the
    ``packing`` record added (only ``version`` when there are no arrays); ``content``
    itself is left as it was. Already packed: returned as it is. ``cache`` (``id`` of an
    ``ArrayRecord`` -> its packing) packs a record that several messages share once."""
    if is_packed(content):
        return content
    records = dict(content.items())
    arrays = content.array_records.get(ARRAYS)
    if arrays is None:
        records[PACKING] = ConfigRecord({"version": VERSION})
    else:
        done = None if cache is None else cache.get(id(arrays))
        if done is None:
            done = pack(arrays)
            if cache is not None:
                cache[id(arrays)] = done
        records[ARRAYS], records[PACKING] = done
    return RecordDict(records)


def unpack_content(content: RecordDict, sent: Mapping[str, ArraySpec] | None = None) -> RecordDict:
    """``content`` as its sender built it: a packed one (``packing`` record) unpacked and
    without the ``packing`` record, any other as it is. :class:`PackingError` if the
    packed form is malformed, or (``sent``: the specs of the arrays sent to the peer) not
    arrays of those specs (:func:`unpack`): the message is then refused, never read."""
    if not is_packed(content):
        return content
    packing = content.config_records[PACKING]
    records = {name: r for name, r in content.items() if name != PACKING}
    arrays = content.array_records.get(ARRAYS)
    if "index" in packing:
        if arrays is None:
            raise PackingError(f"a packing index but no record {ARRAYS!r}")
        records[ARRAYS] = unpack(arrays, packing, sent)
    else:
        version = packing.get("version")
        if isinstance(version, bool) or version not in VERSIONS:
            raise PackingError(f"unknown packing version {version!r} (this side reads {VERSIONS})")
        if arrays is not None:
            raise PackingError(f"record {ARRAYS!r} without a packing index")
    return RecordDict(records)


def packing_versions(profile: Mapping[str, Any]) -> tuple[int, ...]:
    """The packing versions a ``query.profile`` reply's ``profile`` record declares
    (none: the node's ClientApp reads plain records only); ``ValueError`` if malformed."""
    versions = profile.get("packing", [])
    if not (isinstance(versions, list) and all(_natural(v) for v in versions)):
        raise ValueError(f"packing = {versions!r} is not a list of integers >= 0")
    return tuple(versions)


def declare(reply: Message) -> Message:
    """``reply`` (to ``query.profile``) declaring in its profile the versions this side
    reads (:data:`VERSIONS`)."""
    if reply.has_content() and PROFILE in reply.content.config_records:
        reply.content.config_records[PROFILE]["packing"] = list(VERSIONS)
    return reply


def packed_messages(msg: Message, context: Context, call_next: Callable[..., Message]) -> Message:
    """ClientApp mod: the handler (and every mod inside this one) reads and writes plain
    records; a packed instruction is unpacked before it (malformed: ``PackingError``,
    which Flower sends back as an error reply), the reply's arrays are packed when the
    instruction was, and a profile declares that this ClientApp reads packed messages.
    For a ClientApp of your own: ``ClientApp(mods=[packed_messages])``."""
    wire = msg.content
    packed = is_packed(wire)
    if packed:
        msg.content = unpack_content(wire)
    try:
        reply = call_next(msg, context)
    finally:  # the caller's message as it came (the in-process grid keeps what it sent)
        msg.content = wire
    if msg.metadata.message_type == QUERY_PROFILE:
        declare(reply)
    if packed and reply.has_content():
        reply.content = pack_content(reply.content)
    return reply
