"""FjORD and HeteroFL on the simulation engine (`flwr run`, Ray).

One engine run (FjORD) serves both: the two methods send the same message types to the same
client handlers (``train.widths``, ``evaluate.widths``; the client's loop is the config's
``mode``); what differs for HeteroFL is its settings and the ServerApp's dispatch, shown
through the ServerApp's ``main`` in-process.
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
from tests.runconfig import FEW_ROWS, pyproject_run_config

pytestmark = pytest.mark.slow

NUM_NODES = 4


def tiny(output_dir: Path, data_cache: Path, method: str) -> dict:
    return {
        "method": method,
        "output-dir": str(output_dir),
        "data.cache-dir": str(data_cache),
        "onnx": False,
        f"{method}.rounds": 1,
        f"{method}.batch-size": 64,
        f"{method}.lr-probe": False,  # server-side steps before round 1 (test_widths.py)
        **FEW_ROWS,  # 64 rows per node
    }


def only_result(output_dir: Path, method: str) -> dict:
    results = list(output_dir.glob(f"{method}-*/result.json"))
    assert len(results) == 1, results
    return json.loads(results[0].read_text())


def check(result: dict) -> None:
    assert result["status"]["finished"] is True
    assert [t["partitions"] for t in result["tiers"]] == [[p] for p in range(NUM_NODES)]
    assert all(0.0 <= t["test_accuracy"] <= 1.0 for t in result["tiers"])
    assert result["ledger"]["train"]["totals"]["replies"] == NUM_NODES


def test_fjord_and_heterofl_run_on_the_simulation_engine(
    module_simulation_runner, tmp_path, data_cache
):
    out = tmp_path / "engine"
    _, home = module_simulation_runner(
        num_supernodes=NUM_NODES, client_num_cpus=1, run_config=tiny(out, data_cache, "fjord")
    )
    assert find_pids(flwr_home=home) == []
    check(only_result(out, "fjord"))
    out = tmp_path / "inprocess"
    config = {**pyproject_run_config(), **tiny(out, data_cache, "heterofl")}
    context = Context(run_id=7, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    server_main(InProcessGrid(client_app, config, NUM_NODES), context)
    check(only_result(out, "heterofl"))
