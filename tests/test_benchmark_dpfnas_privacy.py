"""Smoke test of ``benchmarks/dpfnas_privacy.py --quick``: it finishes and reports."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_dpfnas_privacy_quick_reports_every_row():
    saved = run_quick("dpfnas_privacy")
    modes = [(row["mode"], row["parties"]) for row in saved["rows"]]
    assert modes[:3] == [("single", 1), ("fnas", 2), ("dpfnas", 2)]
    noisy = [row for row in saved["rows"] if row["mode"] == "dpfnas"]
    assert all(float(row["epsilon"]) > 0 for row in noisy)
    # more noise, less privacy loss
    by_variance = sorted(noisy, key=lambda row: row["noise_variance"])
    assert float(by_variance[0]["epsilon"]) > float(by_variance[-1]["epsilon"])
