"""``benchmarks/recalibration.py --quick``: BatchNorm recalibration timed beside a plain
forward pass and beside the float64-copy pooling it replaced, on two nets; both give the
same statistics to float32 rounding (the times are the benchmark's, never asserted)."""

from __future__ import annotations

from tests.test_benchmarks import run_quick


def test_recalibration_quick_times_both_poolings_and_they_agree():
    saved = run_quick("recalibration")
    assert set(saved["rows"]) == {"fedoras-default-largest", "mbconv-0.5-largest"}
    for row in saved["rows"].values():
        for key in ("forward_cpu_s", "recalibration_cpu_s", "float64_copy_cpu_s"):
            assert row[key] > 0
        assert row["max_relative_difference"] < 1e-5
    assert saved["headline"]["max_relative_difference"] < 1e-5
