"""``benchmarks/attacks.py --quick`` as a smoke test: it finishes, reports every case, and
the count check and the robust rules do what they claim on real Stage-1 replies."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_attacks_quick_reports_every_case_and_bounds_the_inflated_client():
    saved = run_quick("attacks")
    rows = saved["rows"]
    assert len(rows) == 2 * 7 * 3  # methods x attacks x rules
    assert {row["method"] for row in rows} == {"OPA", "FedAvg"}
    for row in rows:
        if row["attack"] == "inflate":  # counts above the declared size: rejected, no share
            assert row["rejected"] == row["attackers"] and row["share"] == 0.0
        else:
            assert row["rejected"] == 0
    head = saved["headline"]
    assert head["inflated_within_honest"] is True
    # a node that also lies in its profile takes a weighted mean over ...
    assert head["opa_lie_mean_share"] > 0.99 and head["fedavg_lie_mean_share"] > 0.99
    # ... but not a median or a trimmed mean: no more than its honest share
    assert head["opa_lie_median_share"] <= head["opa_honest_share"]
    assert head["opa_lie_trimmed_share"] <= head["opa_honest_share"]
    assert head["fedavg_lie_median_share"] <= head["fedavg_honest_share"]
    # FedAvg at honest counts: the share is the attacker's weight (equal data: 1 / 10)
    fedavg_poison = [
        r
        for r in rows
        if (r["method"], r["attack"], r["aggregation"]) == ("FedAvg", "poison", "mean")
    ]
    assert [r["share"] for r in fedavg_poison] == pytest.approx([0.1, 0.2], abs=1e-3)
    assert [row["aggregation"].split()[0] for row in saved["accuracy"]] == [
        "mean",
        "median",
        "trimmed-mean",
    ]
