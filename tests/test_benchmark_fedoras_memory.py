"""Smoke test of ``benchmarks/fedoras_memory.py --quick``: it finishes and reports."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_fedoras_memory_quick_reports_single_below_mixed():
    saved = run_quick("fedoras_memory")
    assert {row["space"] for row in saved["rows"]} == {"cnn_s", "cnn_l"}
    for row in saved["rows"]:
        # every option of every layer runs in the mixed step: well below half for one path
        assert 0 < row["sampled_over_mixed_activation"] < 0.5
        assert 0 < row["sampled_over_mixed_rss_peak_delta"] < 0.5
