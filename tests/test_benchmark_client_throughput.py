"""``benchmarks/client_throughput.py --quick`` finishes and reports consistent ratios."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_client_throughput_quick_reports_ours_over_plain():
    saved = run_quick("client_throughput")
    headline, rows = saved["headline"], saved["rows"]
    assert headline["repeats"] == len(rows) == 3
    # interleaved: a different side goes first in each repeat
    assert len({row["first"] for row in rows}) == 3
    for row in rows:
        assert row["samples"] == saved["train_samples"] > 0  # one epoch, every sample
        for side in ("ours", "ours_call", "plain"):
            assert row[f"{side}_samples_per_second"] == pytest.approx(
                row["samples"] / row[f"{side}_seconds"]
            )
        assert row["ours_over_plain"] == pytest.approx(
            row["ours_samples_per_second"] / row["plain_samples_per_second"]
        )
    assert 0 < headline["ours_over_plain"] < 10
    assert 0 < headline["ours_call_over_plain"] < 10
