"""``benchmarks/latency.py --quick`` finishes and reports consistent numbers (never
compared with a wall-clock constant): the tables per space, and the FedorAS run with two
emulated device classes, each tier's chosen model timed on its nodes' class."""

from __future__ import annotations

import math

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_latency_quick_reports_every_space_and_the_two_class_fedoras_run():
    saved = run_quick("latency")
    headline, rows = saved["headline"], saved["rows"]
    assert [row["space"] for row in rows] == ["cnn_s", "cnn_l", "rnn", "mbconv", "darts"]
    for row in rows:
        assert row["paths"] == headline["paths"] == len(row["archs"]) == 20
        assert -1 <= row["spearman_rho"] <= 1
        assert headline[f"rho_{row['space']}"] == pytest.approx(row["spearman_rho"])
        assert 0 <= row["relative_error"] <= row["relative_error_p90"]
        options, fixed = row["table"]["option_ms"], row["table"]["fixed_ms"]
        assert sum(map(len, options)) == row["options"]
        assert all(v > 0 and math.isfinite(v) for layer in options for v in layer)
        for arch, predicted, measured in zip(
            row["archs"], row["predicted_ms"], row["measured_ms"], strict=True
        ):
            expected = fixed + sum(options[layer][o] for layer, o in enumerate(arch))
            assert predicted == pytest.approx(expected)
            assert measured > 0
        errors = sorted(
            abs(p - m) / m for p, m in zip(row["predicted_ms"], row["measured_ms"], strict=True)
        )
        assert row["relative_error"] == pytest.approx((errors[9] + errors[10]) / 2)
    assert headline["min_rho"] == pytest.approx(min(r["spearman_rho"] for r in rows))
    assert headline["goal_met"] == (headline["min_rho"] >= 0.9)
    # the FedorAS run: two classes in adjacent tiers, each declaring its tier's bound
    run = saved["fedoras"]
    classes, rows = run["classes"], run["rows"]
    assert sorted(classes) == ["1-thread", "2-threads"]
    assert {name: c["threads"] for name, c in classes.items()} == {"1-thread": 1, "2-threads": 2}
    (slow_tier,), (fast_tier,) = (
        classes[run["slower_class"]]["tiers"],
        next(c["tiers"] for n, c in classes.items() if n != run["slower_class"]),
    )
    assert fast_tier == slow_tier + 1 and headline["fedoras_distinct_tiers"] is True
    bounds = {t["tier"]: t["high_ms"] for t in run["tiers"]}
    assert [row["tier"] for row in rows] == sorted([slow_tier, fast_tier])
    for row in rows:
        name = row["class"]
        assert classes[name]["tiers"] == [row["tier"]] and row["nodes"] == run["nodes"] // 2
        assert row["budget_ms"] == classes[name]["budget_ms"] == bounds[row["tier"]]
        assert row["tier_high_ms"] == bounds[row["tier"]]
        # a tier of one class: its table is the class's; the search kept the model in it
        # when the class can run a path within the bound at all
        assert row["predicted_ms"] == pytest.approx(row["class_predicted_ms"])
        assert row["class_fastest_ms"] <= row["class_predicted_ms"] * (1 + 1e-9)
        assert row["reachable"] == (row["class_fastest_ms"] <= row["tier_high_ms"] * (1 + 1e-9))
        if row["reachable"]:
            assert row["predicted_ms"] <= row["tier_high_ms"] * (1 + 1e-9)
        else:
            assert row["predicted_ms"] > row["tier_high_ms"]
        assert row["measured_ms"] > 0
        assert row["measured_over_predicted"] == pytest.approx(
            row["measured_ms"] / row["class_predicted_ms"]
        )
        assert row["within_budget"] == (row["measured_ms"] <= row["budget_ms"])
    assert headline["fedoras_budgets_reachable"] == all(row["reachable"] for row in rows)
    within = sum(row["within_budget"] for row in rows) / len(rows)
    assert headline["fedoras_tiers_within_measured_budget"] == pytest.approx(within)
    ratios = sorted(row["measured_over_predicted"] for row in rows)
    assert headline["fedoras_measured_over_predicted_median"] == pytest.approx(
        (ratios[0] + ratios[-1]) / 2
    )
