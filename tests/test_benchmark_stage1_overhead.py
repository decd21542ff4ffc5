"""Smoke test of ``benchmarks/stage1_overhead.py --quick``: it finishes and reports."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_stage1_overhead_quick_reports_a_ratio():
    saved = run_quick("stage1_overhead")
    assert saved["engine_over_direct"] == saved["headline"]["engine_over_direct"] > 0
    assert len(saved["engine_round_seconds"]) == len(saved["direct_round_seconds"]) == 3
