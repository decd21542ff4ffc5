"""FDNAS and CFDNAS, unchanged, on the simulation engine (`flwr run`, Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def tiny(output_dir: Path, data_cache: Path, method: str) -> dict:
    return {
        "method": method,
        "output-dir": str(output_dir),
        "data.cache-dir": str(data_cache),
        "data.partitioner": "class-groups",
        "space.width": 0.25,
        "space.layers-per-block": 1,
        "fdnas.rounds": 1,
        "fdnas.cluster-rounds": 1,
        "fdnas.final-rounds": 1,
        "fdnas.batch-size": 64,
    }


def only_result(output_dir: Path, method: str) -> dict:
    results = list(output_dir.glob(f"{method}-*/result.json"))
    assert len(results) == 1, results
    return json.loads(results[0].read_text())


def test_fdnas_runs_on_the_simulation_engine(simulation_runner, tmp_path, data_cache):
    out = tmp_path / "out"
    simulation_runner(
        num_supernodes=6, client_num_cpus=1, run_config=tiny(out, data_cache, "fdnas")
    )
    result = only_result(out, "fdnas")
    assert result["search-history"][0]["clients"] == 6
    (net,) = result["nets"]
    assert net["name"] == "fdnas" and net["partitions"] == list(range(6))
    assert 0.0 <= net["averaged-accuracy"] <= 1.0
    assert result["ledger"]["search"]["totals"]["replies"] == 6


def test_cfdnas_runs_on_the_simulation_engine(simulation_runner, tmp_path, data_cache):
    out = tmp_path / "out"
    simulation_runner(
        num_supernodes=6, client_num_cpus=1, run_config=tiny(out, data_cache, "cfdnas")
    )
    result = only_result(out, "cfdnas")
    assert [net["name"] for net in result["nets"]] == [
        "fdnas",
        "cluster-0",
        "cluster-1",
        "cluster-2",
    ]
    assert result["cluster-of-partition"] == {str(p): p // 2 for p in range(6)}
    assert all(len(net["partitions"]) == 2 for net in result["nets"][1:])
