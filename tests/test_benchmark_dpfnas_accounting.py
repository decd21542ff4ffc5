"""Smoke test of ``benchmarks/dpfnas_accounting.py --quick``: before and after agree."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_dpfnas_accounting_quick_is_equal_and_cheaper():
    saved = run_quick("dpfnas_accounting")
    headline = saved["headline"]
    assert headline["same_epsilon"] is True and headline["scale_equal"] is True
    # after the first iteration, each iteration's accounting is a cache look-up
    assert headline["share_after"] < headline["share_before"]
    assert headline["scale_after_s"] < headline["scale_before_s"]
