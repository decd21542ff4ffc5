"""FDNAS and CFDNAS, unchanged, on the simulation engine (`flwr run`, Ray).

One engine run serves both tests: CFDNAS first runs the whole of FDNAS (the search on
every client, the derivation, the FedAvg training of the "fdnas" net) with the same
message types and client handlers, then searches per cluster.  What differs for
``method = "fdnas"`` is server-side only (the ServerApp's dispatch and `FDNAS.start`), and
no engine is needed to show that: it runs through the ServerApp's ``main`` in-process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from fedorasflwr.client_app import app as client_app
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.launch import find_pids
from fedorasflwr.server_app import main as server_main
from tests.runconfig import pyproject_run_config

pytestmark = pytest.mark.slow

NUM_NODES = 6

# The engine run budgets by latency: every node times its table of the search space
# (docs/latency.md); targets above every path of the tiny space, on any machine.
BY_LATENCY = {
    "fdnas.resource": "latency",
    "fdnas.target-ms": 1000.0,
    "fdnas.cluster-target-ms": "1000",
    "latency.repeats": 1,
    "latency.warmup": 0,
    "latency.validation-paths": 2,
}


def tiny(output_dir: Path, data_cache: Path, method: str) -> dict:
    return {
        "method": method,
        "output-dir": str(output_dir),
        "data.cache-dir": str(data_cache),
        "onnx": False,
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


@pytest.fixture(scope="module")
def node_cache(tmp_path_factory) -> Path:
    """The nodes' cache (``$FEDORASFLWR_CACHE``) of the engine run: their latency tables."""
    return tmp_path_factory.mktemp("node-cache")


@pytest.fixture(scope="module")
def cfdnas_on_engine(module_simulation_runner, tmp_path_factory, data_cache, node_cache) -> dict:
    """CFDNAS by latency on 6 simulated SuperNodes: its FDNAS phase and its clusters."""
    out = tmp_path_factory.mktemp("cfdnas") / "out"
    _, home = module_simulation_runner(
        num_supernodes=NUM_NODES,
        client_num_cpus=1,
        run_config={**tiny(out, data_cache, "cfdnas"), **BY_LATENCY},
        env={"FEDORASFLWR_CACHE": str(node_cache)},
    )
    assert find_pids(flwr_home=home) == []
    return only_result(out, "cfdnas")


def test_fdnas_runs_on_the_simulation_engine(cfdnas_on_engine, tmp_path, data_cache):
    # on the engine: FDNAS's search over every client, derivation and trained net
    result = cfdnas_on_engine
    assert result["search_history"][0]["clients"] == NUM_NODES
    net = result["nets"][0]
    assert net["name"] == "fdnas" and net["partitions"] == list(range(NUM_NODES))
    assert 0.0 <= net["averaged_accuracy"] <= 1.0
    assert result["ledger"]["search"]["totals"]["replies"] == NUM_NODES
    # method = "fdnas" through the ServerApp's main: exactly that one net
    out = tmp_path / "out"
    config = {**pyproject_run_config(), **tiny(out, data_cache, "fdnas")}
    context = Context(run_id=7, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    server_main(InProcessGrid(client_app, config, NUM_NODES), context)
    result = only_result(out, "fdnas")
    assert result["search_history"][0]["clients"] == NUM_NODES
    (net,) = result["nets"]
    assert net["name"] == "fdnas" and net["partitions"] == list(range(NUM_NODES))
    assert 0.0 <= net["averaged_accuracy"] <= 1.0
    assert result["ledger"]["search"]["totals"]["replies"] == NUM_NODES


def test_cfdnas_runs_on_the_simulation_engine(cfdnas_on_engine):
    result = cfdnas_on_engine
    assert [net["name"] for net in result["nets"]] == [
        "fdnas",
        "cluster-0",
        "cluster-1",
        "cluster-2",
    ]
    assert result["cluster_of_partition"] == {str(p): p // 2 for p in range(NUM_NODES)}
    assert all(len(net["partitions"]) == 2 for net in result["nets"][1:])


def test_cfdnas_by_latency_on_the_engine_times_one_table_per_host(cfdnas_on_engine, node_cache):
    tables = cfdnas_on_engine["latency_tables"]
    assert [n["partition_id"] for n in tables["nodes"]] == list(range(NUM_NODES))
    assert sorted(tables["groups"]) == ["cluster-0", "cluster-1", "cluster-2", "search"]
    # one host, one thread per ClientApp: the first node to ask timed the table (under the
    # cache's lock), the five others read it from the node cache
    assert len({json.dumps(n["option_ms"]) for n in tables["nodes"]}) == 1
    assert len(list((node_cache / "latency").glob("*.json"))) == 1
    for net in cfdnas_on_engine["nets"]:
        assert net["target_ms"] == 1000.0
        assert 0 < net["predicted_ms"] <= net["target_ms"]
