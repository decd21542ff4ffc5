"""Smoke test of ``benchmarks/baselines.py --quick``: FedorAS, HeteroFL and FjORD on one
split, the baselines' tiers and MACs matched to FedorAS's, their compute to its."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import ROOT, run_quick


@pytest.mark.slow
def test_baselines_quick_matches_tiers_macs_and_compute():
    saved = run_quick("baselines")
    assert not (ROOT / "benchmarks/results/baselines.quick.partial.json").exists()
    (case,) = saved["cases"]
    assert (case["seed"], case["alpha"]) == (0, 0.1)
    tiers = case["tiers"]
    for method in ("heterofl", "fjord"):
        served = case[method]["tiers"]
        assert [t["tier"] for t in served] == [t["index"] for t in tiers]
        for entry, tier in zip(served, tiers, strict=True):
            assert entry["macs"] <= tier["high-macs"]  # the tier's budget, in MACs
            # the same clients in the same tier as FedorAS's
            expected = sorted(
                int(p) for p, t in case["tier-of-partition"].items() if t == tier["index"]
            )
            assert entry["partitions"] == expected
            assert 0.0 <= entry["global_test_accuracy"] <= 1.0
        assert case[method]["rounds"] >= 1 and case[method]["client-flops"] > 0
    widths = case["widths"]
    assert widths == sorted(widths) and all(w * 64 == int(w * 64) for w in widths)
    headline = saved["headline"]
    for key in ("fedoras_minus_fjord_pp", "fedoras_minus_heterofl_pp", "t1_fedoras_minus_fjord_pp"):
        assert key in headline
    assert headline["seeds"] == "0"
