"""Smoke test of ``benchmarks/fdnas_clusters.py --quick``: it finishes and reports."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_fdnas_clusters_quick_reports_every_comparison():
    saved = run_quick("fdnas_clusters")
    assert saved["headline"]["clusters"] == 3
    names = [row["net"] for row in saved["rows"]]
    assert names[:2] == ["FDNAS", "fixed MobileNetV2-like"]
    assert sum(name.startswith("naive-CFDNAS") for name in names) == 3
    assert names[-1].startswith("centralised DNAS")
    # by default no derived net may exceed the fixed net's FLOPs ("at no more FLOPs")
    fixed = saved["rows"][1]["flops"]
    assert saved["settings"]["fdnas.max-flops"] < 1.0
    assert all(row["flops"] <= fixed for row in saved["rows"] if row["net"] != names[1])
