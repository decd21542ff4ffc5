"""Smoke test of ``benchmarks/decnas_latency.py --quick``: it finishes, both runs report,
and the run by latency meets the budget the run by MACs set."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_decnas_latency_quick_compares_both_resources_at_one_budget():
    saved = run_quick("decnas_latency")
    assert [row["run"] for row in saved["rows"]] == ["by MACs", "by latency"]
    headline = saved["headline"]
    assert headline["within_budget"] is True
    assert headline["latency_predicted_ms"] <= headline["budget_ms"] + 1e-9
    assert headline["macs_predicted_ms"] == pytest.approx(headline["budget_ms"])
