"""fedorasflwr.arrays: the same Flower Arrays as ``Array(value)`` / ``Array.numpy()`` (numpy's
``np.save`` / ``np.load``), byte for byte and value for value, with each header written
and parsed once per process."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from fedorasflwr import arrays
from fedorasflwr.arrays import record_of, state_dict_of, to_array, values_of, view_of

VALUES = {
    "float32 conv weight": np.arange(16 * 8 * 9, dtype=np.float32).reshape(16, 8, 3, 3) / 7,
    "float64 scalar": np.array(2.5),
    "int64 counter": np.array(3, dtype=np.int64),
    "int32 vector": np.arange(-5, 5, dtype=np.int32),
    "bool mask": np.array([[True, False], [False, True]]),
    "uint8 empty": np.zeros((0, 3), dtype=np.uint8),
    "complex64": np.array([1 + 2j, -3j], dtype=np.complex64),
    "big-endian float32": np.arange(6, dtype=">f4").reshape(2, 3),
    "float16": np.linspace(-1, 1, 5, dtype=np.float16),
}


def _saved(value: np.ndarray) -> bytes:
    stream = io.BytesIO()
    np.save(stream, value, allow_pickle=False)
    return stream.getvalue()


@pytest.mark.parametrize("name", list(VALUES))
def test_to_array_is_flowers_array_byte_for_byte(name):
    value = VALUES[name]
    for _ in range(2):  # the header written, then the one kept
        made = to_array(value)
        flowers = Array(value)
        assert made.data == flowers.data == _saved(value)
        assert (made.dtype, tuple(made.shape), made.stype) == (
            flowers.dtype,
            tuple(flowers.shape),
            flowers.stype,
        )


@pytest.mark.parametrize("name", list(VALUES))
def test_values_of_is_np_load_and_a_writable_copy(name):
    value = VALUES[name]
    array = Array(value)
    for _ in range(2):  # the header parsed, then the parse kept
        read = values_of(array)
        loaded = array.numpy()
        assert read.dtype.str == loaded.dtype.str and read.shape == loaded.shape
        assert np.array_equal(read, loaded)
        assert read.flags.writeable and read.flags.c_contiguous
        read[...] = 0  # its own memory: the Array's bytes are unchanged
        assert array.data == _saved(value)


def test_views_share_the_bytes_and_are_read_only():
    array = Array(VALUES["float32 conv weight"])
    view = view_of(array)
    assert not view.flags.writeable
    assert np.array_equal(view, VALUES["float32 conv weight"])


def test_fortran_and_strided_arrays_go_through_numpy_itself():
    fortran = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    strided = np.arange(20, dtype=np.int64)[::3]
    for value in (fortran, strided):
        made = to_array(value)
        assert made.data == Array(value).data
        assert np.array_equal(values_of(made), value)
    # np.save wrote the Fortran array in Fortran order: read as np.load reads it
    assert np.array_equal(values_of(Array(fortran)), fortran)


def test_a_version_2_header_reads_as_np_load_reads_it():
    value = np.arange(6, dtype=np.float64).reshape(2, 3)
    stream = io.BytesIO()
    np.lib.format.write_array_header_2_0(stream, np.lib.format.header_data_from_array_1_0(value))
    array = Array(
        dtype="float64",
        shape=(2, 3),
        stype="numpy.ndarray",
        data=stream.getvalue() + value.tobytes(),
    )
    assert np.array_equal(values_of(array), array.numpy())


def test_headers_of_one_length_are_kept_apart():
    # (2, 3) and (3, 2): the same header length, other bytes: each parse is its own
    a = np.zeros((2, 3), dtype=np.float32)
    b = np.ones((3, 2), dtype=np.float32)
    assert len(_saved(a)) == len(_saved(b))
    assert values_of(to_array(a)).shape == (2, 3)
    assert values_of(to_array(b)).shape == (3, 2)
    assert values_of(to_array(b)).sum() == 6


def test_bad_bytes_fail_as_np_load_fails():
    good = Array(VALUES["int32 vector"])
    short = Array(dtype=good.dtype, shape=tuple(good.shape), stype=good.stype, data=good.data[:-4])
    with pytest.raises(ValueError):
        short.numpy()
    with pytest.raises(ValueError):
        values_of(short)
    not_npy = Array(dtype="float32", shape=(1,), stype="numpy.ndarray", data=b"garbage!!!!!!")
    with pytest.raises(ValueError):
        values_of(not_npy)


def test_the_caches_stay_bounded(monkeypatch):
    monkeypatch.setattr(arrays, "MAX_CACHED", 4)
    monkeypatch.setattr(arrays, "_written", {})  # this process's own, from earlier tests
    monkeypatch.setattr(arrays, "_read", {})
    for n in range(1, 12):
        assert values_of(to_array(np.zeros(n, dtype=np.float32))).shape == (n,)
    assert len(arrays._written) <= 4 and len(arrays._read) <= 4


def test_state_dicts_round_trip_as_flowers_do():
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4))
    state = net.state_dict()
    made, flowers = record_of(state), ArrayRecord(state)
    assert list(made) == list(flowers)
    assert all(made[k].data == flowers[k].data for k in made)
    back, flowers_back = state_dict_of(made), flowers.to_torch_state_dict()
    assert list(back) == list(flowers_back)
    for key, tensor in back.items():
        assert tensor.dtype == flowers_back[key].dtype
        assert torch.equal(tensor, flowers_back[key])
    torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4)).load_state_dict(back)
