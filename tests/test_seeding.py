"""Named random streams (``fedorasflwr.seeding``): fixed by (seed, purpose, keys), independent
across purposes, the same in any process."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from fedorasflwr.seeding import (
    numpy_stream,
    stable_hash,
    stream_words,
    substream,
    torch_stream,
)


def test_stable_hash_is_fnv1a_32():
    # FNV-1a 32-bit reference values (offset basis 2166136261, prime 16777619)
    assert stable_hash("") == 0x811C9DC5
    assert stable_hash("a") == 0xE40C292C
    assert stable_hash("foobar") == 0xBF9CF968


def test_words_name_the_purpose_and_hash_text_keys():
    assert stream_words(3, "a", 7, "foobar") == (3, 0xE40C292C, 7, 0xBF9CF968)
    assert substream((1, 2), "a") == (1, 2, 0xE40C292C)
    with pytest.raises(ValueError, match="purpose"):
        stream_words(0, "")


def test_streams_are_fixed_by_their_words_and_differ_by_purpose_and_keys():
    draw = numpy_stream(0, "tiers", 2).integers(2**31, size=8)
    assert np.array_equal(draw, numpy_stream(0, "tiers", 2).integers(2**31, size=8))
    for other in (
        numpy_stream(0, "sample", 2),
        numpy_stream(0, "tiers", 3),
        numpy_stream(1, "tiers", 2),
    ):
        assert not np.array_equal(draw, other.integers(2**31, size=8))
    a = torch.randn(5, generator=torch_stream(0, "loader", 1))
    assert torch.equal(a, torch.randn(5, generator=torch_stream(0, "loader", 1)))
    assert not torch.equal(a, torch.randn(5, generator=torch_stream(0, "loader", 2)))


def test_a_stream_is_the_same_in_another_process():
    code = (
        "from fedorasflwr.seeding import numpy_stream; "
        "print(numpy_stream(5, 'client-split', 3).integers(10**9))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) == numpy_stream(5, "client-split", 3).integers(10**9)
