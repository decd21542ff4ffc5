"""Smoke test of ``benchmarks/decnas_cost.py --quick``: it finishes and reports."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_decnas_cost_quick_reports_every_variant():
    saved = run_quick("decnas_cost")
    variants = [row["variant"] for row in saved["rows"]]
    assert variants == [
        "DecNAS",
        "naive",
        "no-groups",
        "no-drop",
        "no-dynamic-rounds",
        "centralised NetAdapt",
    ]
    # the naive design uploads every candidate from every client: never cheaper
    assert all(row["uplink-bytes"] <= saved["rows"][1]["uplink-bytes"] for row in saved["rows"])
    assert saved["width-multiplier"]
