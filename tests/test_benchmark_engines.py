"""Smoke test of ``benchmarks/engines.py --quick`` (tiny config, 2 nodes, all three engines)."""

from __future__ import annotations

import os

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_engines_quick_reports_every_engine_and_the_breakdown():
    saved = run_quick("engines")
    tiny = saved["results"]["tiny"]
    for engine in ("inprocess", "simulation", "deployment"):
        assert len(tiny[engine]["round_seconds"]) == 2
        assert tiny[engine]["median_round_after_first"] > 0
        assert tiny[engine]["breakdown"]["training"] > 0
    deployment = tiny["deployment"]
    assert saved["clients"] == 2
    assert deployment["threads"] == [max(1, (os.cpu_count() or 1) // 2)]
    assert deployment["breakdown"]["fixed_start_to_handler"] > 0
    # one profile query and one Stage-1 message per node and round, each its own process
    assert deployment["messages"] == 2 + 2 * 2
    assert len({record["pid"] for record in deployment["timings"]}) == deployment["messages"]
    headline = saved["headline"]
    assert headline["tiny_deployment_over_simulation"] == tiny["deployment_over_simulation"] > 0
    assert headline["tiny_fixed_over_torch_import"] > 0
    # what the simulation engine adds to a Stage-1 round (the former stage1_overhead.py)
    sim, inprocess = (tiny[e]["median_round_after_first"] for e in ("simulation", "inprocess"))
    assert headline["tiny_simulation_over_inprocess"] == tiny["simulation_over_inprocess"]
    assert tiny["simulation_over_inprocess"] == pytest.approx(sim / inprocess, abs=1e-3)
