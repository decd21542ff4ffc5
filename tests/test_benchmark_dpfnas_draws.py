"""Smoke test of ``benchmarks/dpfnas_draws.py --quick``: the preset's final training of the
worst cell and of one drawn genotype, each scored on the parties' and the global test set."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_dpfnas_draws_quick_trains_the_worst_cell_and_a_drawn_one():
    saved = run_quick("dpfnas_draws")
    rows = saved["rows"]
    assert [row["genotype"] for row in rows] == ["worst", "draw-0"]
    assert set(rows[0]["reduce"]) == {"max_pool_3x3"}  # no weights in the searched cell
    for row in rows:
        for key in ("test-accuracy", "global-test-accuracy"):
            assert 0.0 <= row[key] <= 1.0, row
