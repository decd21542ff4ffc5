"""FedorAS with latency as the resource on the deployment engine: each SuperNode measures its
own table and declares its budget in its node config; the tiers, the assignment and the
tables land in ``result.json``."""

from __future__ import annotations

import json

import pytest

from tests.runconfig import tiny_fedoras

pytestmark = pytest.mark.slow


def test_supernodes_measure_their_tables_and_their_budgets_place_them(
    deployment, project_root, tmp_path, data_cache
):
    node_configs = [
        {"device-class": "server", "latency-budget-ms": 1.0e6},  # above every tier: the top
        {"device-class": "watch", "latency-budget-ms": 1.0e-6},  # below every tier: the lowest
        {},  # no budget: dealt by its table's speed
    ]
    engine = deployment(
        num_supernodes=3,
        node_configs=node_configs,
        env={"PYTHONPATH": str(project_root), "FEDORASFLWR_CACHE": str(tmp_path / "cache")},
    )
    out = tmp_path / "out"
    config = tiny_fedoras(
        data_cache,
        **{
            "output-dir": str(out),
            "fedoras.resource": "latency",
            "fedoras.rounds": 1,
            "fedoras.clients-per-round": 3,
            "fedoras.min-replies": 1,
            "fedoras.finetune-clients-per-round": 3,
            "latency.repeats": 3,
            "latency.warmup": 1,
            "latency.validation-paths": 4,
        },
    )
    run = engine.run(project_root, config, timeout=900)  # raises unless finished:completed
    (result_file,) = out.glob("fedoras-*/result.json")
    result = json.loads(result_file.read_text())
    assert result["resource"] == "latency"
    assert result["tier-of-partition"]["0"] == 3
    assert result["tier-of-partition"]["1"] == 0
    nodes = {n["partition-id"]: n for n in result["latency-tables"]["nodes"]}
    assert sorted(nodes) == [0, 1, 2]
    assert nodes[0]["device-class"] == "server" and nodes[1]["latency-budget-ms"] == 1.0e-6
    assert all(0 < n["min-path-ms"] <= n["max-path-ms"] for n in nodes.values())
    assert all("validation" in n for n in nodes.values())
    tiers = result["tiers"]
    assert all(t["low"] < t["high"] for t in tiers) and tiers[-1]["high"] < 1.0e6
    for model in result["models"]:
        assert model["latency-ms"] > 0 and model["flops"] > 0
    watch = engine.node_ids[1]
    assert f"node {watch}: latency-budget-ms = 1e-06 is below every tier" in run.stdout
