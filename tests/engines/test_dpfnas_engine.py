"""DP-FNAS on the simulation engine (`flwr run`, Ray): tiny, but the real app end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedorasflwr.launch import find_pids

pytestmark = pytest.mark.slow


def test_simulation_engine_runs_dpfnas(simulation_runner, flwr_home, tmp_path, data_cache):
    out = tmp_path / "out"
    overrides = {
        "method": "dpfnas",
        "output-dir": str(out),
        "data.cache-dir": str(data_cache),
        "onnx": False,
        "data.partitioner": "iid",
        "space.width": 0.25,
        "space.layers-per-block": 2,
        "dpfnas.iterations": 1,
        "dpfnas.batch-size": 8,
        "dpfnas.eval-every": 0,
        "dpfnas.final-rounds": 1,
        # by latency: each party times its table; a budget above every genotype
        "dpfnas.resource": "latency",
        "dpfnas.latency-budget-ms": 1000.0,
        "latency.repeats": 1,
        "latency.warmup": 0,
        "latency.validation-paths": 2,
    }
    simulation_runner(
        num_supernodes=2,
        client_num_cpus=1,
        run_config=overrides,
        timeout=900,
        env={"FEDORASFLWR_CACHE": str(tmp_path / "node-cache")},
    )
    results = list(Path(out).glob("dpfnas-*/result.json"))
    assert len(results) == 1, results
    result = json.loads(results[0].read_text())
    assert result["iterations"] == 1 and result["stopped"] == "completed"
    assert len(result["privacy"]) == 2
    assert result["noise"]["private_against_server"] is True  # OS-CSPRNG noise by default
    assert all(0 < party["epsilon"] < 100 for party in result["privacy"])
    assert 0.0 <= result["test_accuracy"] <= 1.0
    assert result["ledger"]["weights"]["totals"]["replies"] == 2
    # every stage's client training FLOPs crossed the engine and were booked
    assert all(
        result["ledger"][s]["totals"]["train_flops"] > 0 for s in ("weights", "arch", "final")
    )
    assert {"supernet.pt", "derived.pt"} <= set(result["files"])
    tables = result["latency_tables"]
    assert [n["partition_id"] for n in tables["nodes"]] == [0, 1]
    assert 0 < result["latency"]["predicted_ms"] <= result["latency"]["budget_ms"] == 1000.0
    assert result["ledger"]["latency"]["totals"]["replies"] == 2
    assert find_pids(flwr_home=flwr_home) == []
