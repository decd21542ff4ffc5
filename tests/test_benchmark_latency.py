"""``benchmarks/latency.py --quick`` finishes and reports consistent numbers (never
compared with a wall-clock constant)."""

from __future__ import annotations

import math

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_latency_quick_reports_every_space_with_consistent_predictions():
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
