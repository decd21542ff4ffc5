"""Smoke test of ``benchmarks/array_codec.py --quick``: both sides of a run, the same
results."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_array_codec_quick_compares_both_sides_with_the_same_results():
    saved = run_quick("array_codec")
    headline = saved["headline"]
    assert headline["same_results"] is True
    assert set(saved["rows"]) == {"state_dict", "fedoras-tiny"}
    for row in saved["rows"].values():
        assert len(row["flower_cpu_s"]) == len(row["fast_cpu_s"]) == 1
        assert all(seconds > 0 for seconds in row["flower_cpu_s"] + row["fast_cpu_s"])
        assert row["fast_over_flower"] == pytest.approx(
            row["fast_cpu_s"][0] / row["flower_cpu_s"][0], abs=1e-3
        )
