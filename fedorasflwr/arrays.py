"""Flower ``Array``s from and to numpy arrays and torch tensors, in the same ``.npy`` bytes,
without numpy's per-array file machinery.

Flower's ``Array(ndarray)`` is ``np.save`` into a ``BytesIO`` and ``Array.numpy()`` is
``np.load`` from one: for every array of every message numpy writes its header text, or
parses it with ``ast.literal_eval``. A federation sends the same few dozen shapes in every
message, so here the header of each (dtype, shape) is written once per process, and each
header's parse (numpy's own reader, :func:`fedorasflwr.decoding.read_header`) is kept by
its bytes. The bytes written are exactly ``np.save``'s (C-contiguous arrays of bool,
integer, float and complex dtypes; anything else goes through ``np.save`` itself), and an
array read is a writable copy, as ``np.load`` returns. The tests' tiny FedorAS and FedNAS
runs take 7% and 21% less CPU this way, two default Stage-1 rounds 5%
(``benchmarks/array_codec.py``).

Only for arrays this process trusts as far as ``np.load`` would (its own, or the server's
instruction on a client): a server reads a peer's arrays with
:func:`fedorasflwr.decoding.decode_array`, which checks them against what was sent.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from .decoding import DecodeError, NpyHeader, read_header

__all__ = ["record_of", "state_dict_of", "to_array", "values_of", "view_of"]

#: the most headers kept per process, written and read (each a few hundred bytes)
MAX_CACHED = 4096
#: False: every call is Flower's own (``Array(value)``, ``Array.numpy()``), for a side-by-side
#: measurement (``benchmarks/array_codec.py``)
FAST = True
#: the ``stype`` of an ``.npy`` array (Flower's ``SType.NUMPY``)
NUMPY = "numpy.ndarray"
_KINDS = "biufc"
_MAGIC = b"\x93NUMPY"

_written: dict[tuple[str, tuple[int, ...]], bytes] = {}
_read: dict[bytes, NpyHeader] = {}


def _keep(cache: dict[Any, Any], key: Any, value: Any) -> Any:
    if len(cache) >= MAX_CACHED:
        cache.clear()
    cache[key] = value
    return value


def to_array(value: np.ndarray | torch.Tensor) -> Array:
    """``Array(value)``: the same ``Array`` (metadata and ``.npy`` bytes), the header of
    each dtype and shape written once per process."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if not (
        FAST
        and isinstance(value, np.ndarray)
        and value.dtype.kind in _KINDS
        and value.flags.c_contiguous
        and not value.dtype.hasobject
    ):
        return Array(value)  # np.save: Fortran order, structured dtypes, the refusals
    key = (value.dtype.str, value.shape)
    header = _written.get(key)
    if header is None:
        stream = io.BytesIO()
        try:
            np.lib.format.write_array_header_1_0(
                stream, np.lib.format.header_data_from_array_1_0(value)
            )
        except ValueError:  # a header too long for version 1.0: np.save writes 2.0
            return Array(value)
        header = _keep(_written, key, stream.getvalue())
    return Array(
        dtype=str(value.dtype), shape=tuple(value.shape), stype=NUMPY, data=header + value.tobytes()
    )


def _header(array: Array) -> NpyHeader | None:
    """The parsed header of ``array``'s bytes if the fast read applies (an ``.npy`` of
    version 1.0 or 2.0 in C order holding exactly its declared bytes), else ``None``."""
    data = array.data
    if not FAST or array.stype != NUMPY or not isinstance(data, bytes) or data[:6] != _MAGIC:
        return None
    if len(data) < 12 or data[6] not in (1, 2):
        return None
    end = (
        10 + int.from_bytes(data[8:10], "little")
        if data[6] == 1
        else 12 + int.from_bytes(data[8:12], "little")
    )
    key = data[:end]
    header = _read.get(key)
    if header is None:
        try:
            header = read_header(data)
        except DecodeError:
            return None  # np.load says what is wrong
        _keep(_read, key, header)
    if header.fortran_order or len(data) - header.offset != header.nbytes:
        return None
    return header


def view_of(array: Array) -> np.ndarray:
    """``array``'s values as a read-only view of its bytes (no copy), or ``array.numpy()``
    where the fast read does not apply."""
    header = _header(array)
    if header is None:
        return array.numpy()
    if header.count == 0:
        return np.empty(header.shape, header.dtype)
    flat = np.frombuffer(array.data, header.dtype, header.count, header.offset)
    return flat.reshape(header.shape)


def values_of(array: Array) -> np.ndarray:
    """``array.numpy()``: a writable copy of its values."""
    values = view_of(array)
    return values.copy() if not values.flags.writeable else values


def state_dict_of(record: ArrayRecord) -> dict[str, torch.Tensor]:
    """``record.to_torch_state_dict()``: every array as a tensor of its own memory, in the
    record's order."""
    return {key: torch.from_numpy(values_of(array)) for key, array in record.items()}


def record_of(state: Mapping[str, np.ndarray | torch.Tensor]) -> ArrayRecord:
    """``ArrayRecord(state)`` for a ``state_dict`` (or a mapping of numpy arrays), in its
    order."""
    record = ArrayRecord()
    for key, value in state.items():
        record[key] = to_array(value)
    return record
