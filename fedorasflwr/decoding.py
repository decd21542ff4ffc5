"""A peer's array bytes decoded safely, against the spec of the array that was sent.

Flower's ``Array`` carries a sender's metadata (``dtype``, ``shape``) beside its bytes
(``data``, an ``.npy`` file), and ``Array.numpy()`` is ``np.load``: it trusts the ``.npy``
header, whatever the metadata says, and allocates what the header declares. A reply whose
metadata says ``float32`` of shape ``(4, 1, 3, 3)`` can hold complex numbers, another
shape, another byte order, or a header declaring 2^40 elements. So a server never calls
``numpy()`` on a peer's array before :func:`decode_array` accepted it, which checks, in
this order and before any byte is decoded or copied:

1. the ``stype`` is ``"numpy.ndarray"`` and the data is a bytes-like buffer;
2. the metadata equals the spec (``dtype`` as ``str(numpy dtype)``, ``shape``);
3. the ``.npy`` header (numpy's own reader, versions 1.0 and 2.0, at most
   :data:`MAX_HEADER` bytes, no pickle) declares exactly the spec's dtype, byte order
   included (``'>f4'`` is not ``'<f4'``; complex is not float), and exactly its shape;
4. the bytes after the header are exactly ``prod(shape) * itemsize``;

then views the bytes (``np.frombuffer``: no allocation of a declared size) and, for float
and complex dtypes, checks that every value is finite. Whatever goes wrong is a
:class:`DecodeError` naming what; nothing else escapes.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

__all__ = [
    "ArraySpec",
    "DecodeError",
    "MAX_HEADER",
    "NpyHeader",
    "array_specs",
    "decode_array",
    "read_header",
]

#: the largest ``.npy`` header read (numpy's own default limit for untrusted files)
MAX_HEADER = 10_000
#: numpy dtype kinds whose values must be finite
FLOAT_KINDS = "fc"


@dataclass(frozen=True)
class ArraySpec:
    """Shape and dtype (``str`` of the numpy dtype, e.g. ``"float32"``) of one array that
    was sent."""

    shape: tuple[int, ...]
    dtype: str


def array_specs(record: ArrayRecord) -> dict[str, ArraySpec]:
    """The ``ArraySpec`` of every key in ``record`` (the server's own arrays: their
    metadata is what it wrote)."""
    return {key: ArraySpec(tuple(a.shape), str(a.dtype)) for key, a in record.items()}


class DecodeError(ValueError):
    """A peer's array that is not the array sent (the reason says what)."""


@dataclass(frozen=True)
class NpyHeader:
    """What an ``.npy`` header declares, and where its data starts."""

    dtype: np.dtype
    shape: tuple[int, ...]
    fortran_order: bool
    offset: int

    @property
    def count(self) -> int:
        """Elements declared (Python's integers: no overflow whatever the shape)."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of data the header declares."""
        return self.count * self.dtype.itemsize


def _buffer(data: Any) -> memoryview:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DecodeError(f"its data is {type(data).__name__}, not bytes")
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def read_header(data: Any) -> NpyHeader:
    """The header of the ``.npy`` bytes ``data``, parsed by numpy's reader without reading
    the data; :class:`DecodeError` for anything that is not such a header (a pickle, an
    unknown version, a header longer than :data:`MAX_HEADER`, a negative axis)."""
    view = _buffer(data)
    stream = io.BytesIO(view[: MAX_HEADER + 12])  # magic (8) + length (2 or 4) + header
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            read = np.lib.format.read_array_header_1_0
        elif version == (2, 0):
            read = np.lib.format.read_array_header_2_0
        else:
            raise DecodeError(f"npy format version {version} is not read")
        shape, fortran_order, dtype = read(stream, max_header_size=MAX_HEADER)
    except DecodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - a peer's bytes: whatever numpy's reader raises
        raise DecodeError(f"not an npy header: {_short(exc)}") from None
    if not all(type(d) is int and d >= 0 for d in shape):
        raise DecodeError(f"its header declares shape {_text(shape)}")
    return NpyHeader(dtype, tuple(shape), bool(fortran_order), stream.tell())


def decode_array(array: Array, spec: ArraySpec, *, finite: bool = True) -> np.ndarray:
    """``array``'s values (a read-only view of its bytes) if it is exactly an array of
    ``spec`` (metadata, ``.npy`` header, byte count; finite values when ``finite`` and the
    dtype is float or complex); :class:`DecodeError` naming the fault otherwise."""
    try:
        return _decode(array, spec, finite)
    except DecodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - a peer's array: no other exception escapes
        raise DecodeError(f"does not decode: {_short(exc)}") from None


def _decode(array: Array, spec: ArraySpec, finite: bool) -> np.ndarray:
    wanted = np.dtype(spec.dtype)
    if array.stype != "numpy.ndarray":
        raise DecodeError(f"stype {_text(array.stype)}, not 'numpy.ndarray'")
    if not isinstance(array.dtype, str) or array.dtype != spec.dtype:
        raise DecodeError(f"dtype {_text(array.dtype)}, sent {spec.dtype}")
    if _shape(array.shape) != spec.shape:
        raise DecodeError(f"shape {_text(array.shape)}, sent {spec.shape}")
    data = _buffer(array.data)
    header = read_header(data)
    if header.dtype.str != wanted.str or header.dtype != wanted:
        raise DecodeError(f"its npy header declares dtype {header.dtype.str}, sent {wanted.str}")
    if header.shape != spec.shape:
        raise DecodeError(f"its npy header declares shape {header.shape}, sent {spec.shape}")
    carried = data.nbytes - header.offset
    if carried != header.nbytes:
        raise DecodeError(f"{carried} bytes of data, its shape and dtype need {header.nbytes}")
    if header.count == 0:
        values = np.empty(spec.shape, wanted)
    elif header.fortran_order:
        flat = np.frombuffer(data, wanted, header.count, header.offset)
        values = flat.reshape(spec.shape[::-1]).transpose()
    else:
        values = np.frombuffer(data, wanted, header.count, header.offset).reshape(spec.shape)
    if finite and wanted.kind in FLOAT_KINDS and not np.isfinite(values).all():
        raise DecodeError("non-finite values")
    return values


def _shape(shape: Any) -> tuple[int, ...] | None:
    if not isinstance(shape, tuple | list) or len(shape) > 64:
        return None
    return tuple(shape) if all(type(d) is int for d in shape) else None


def _text(value: Any) -> str:
    return repr(value)[:60]


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:160]
