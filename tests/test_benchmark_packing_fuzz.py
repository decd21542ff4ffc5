"""``benchmarks/packing_fuzz.py --quick`` as a smoke test: every fuzz case of the reply
decoder came to the arrays sent or to a refusal, within a small allocation."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_packing_fuzz_quick_decodes_what_was_sent_or_refuses():
    saved = run_quick("packing_fuzz")
    head = saved["headline"]
    assert head["cases"] == 200 and head["bad"] == 0
    assert head["decoded"] + head["refused"] == 200
    assert head["decoded"] > 0 and head["refused"] > 0
    assert saved["bad_cases"] == []
    assert head["largest_peak_kib"] < 1024  # cases declare up to 2^62 elements
    # every family of change was tried: the index, the packed array, a plain array
    assert {"index-field-2", "packed-array", "plain-array"} <= saved["by_kind"].keys()
