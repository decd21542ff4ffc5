"""Smoke test of ``benchmarks/checkpoint_cost.py --quick``: it times every write."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_checkpoint_cost_quick_times_a_write_per_round():
    saved = run_quick("checkpoint_cost")
    headline = saved["headline"]
    assert headline["writes"] == headline["rounds"] == 1  # checkpoint-every = 1: every round
    assert 0 < headline["write_ms"] <= headline["write_ms_max"]
    assert headline["checkpoint_mb"] > 0
    assert headline["share_of_round"] == pytest.approx(
        headline["write_ms"] / 1000 / headline["round_s"], abs=1e-3
    )
