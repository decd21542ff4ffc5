"""``python -m fedorasflwr.compare`` without ``--inprocess`` and the width baselines on the
simulation engine: one engine run serves both.

The compare command runs one tiny HeteroFL through the launcher on the simulation engine
(its own process, its Flower home under the method's directory, every Flower process
stopped afterwards), then writes the leaderboard from its result.json; a second call reuses
the finished run. The same run is the suite's width-baseline run on the engine: FjORD sends
the same message types to the same client handlers (``train.widths``, ``evaluate.widths``;
the client's loop is the config's ``mode``), and what differs for it, its settings and the
ServerApp's dispatch, runs through the ServerApp's ``main`` in-process (this module was
two engine runs, one of them FjORD's, until issue 44's cut)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from fedorasflwr.client_app import app as client_app
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.launch import find_pids
from fedorasflwr.server_app import main as server_main
from tests.runconfig import FEW_ROWS, ROOT, pyproject_run_config

pytestmark = pytest.mark.slow

NUM_NODES = 3

CONFIG = """
onnx = false

[data]
dataset = "mnist5k"
partitioner = "sampled"  # 64 rows per node (tests.runconfig.FEW_ROWS)
partition-size = 64
global-test = true
cache-dir = "{cache}"

[compare]
methods = "heterofl"
nodes = {nodes}

[methods.heterofl.heterofl]
widths = "0.25,0.5,1.0"
rounds = 1
batch-size = 64
lr-probe = false
"""


@dataclass(frozen=True)
class CompareRun:
    command: list[str]
    env: dict[str, str]
    cwd: Path
    out: Path
    done: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def compare_run(tmp_path_factory, data_cache) -> CompareRun:
    """The compare command's first call: HeteroFL through the launcher, on the engine."""
    tmp_path = tmp_path_factory.mktemp("compare-engine")
    config = tmp_path / "one.toml"
    config.write_text(CONFIG.format(cache=data_cache, nodes=NUM_NODES))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "fedorasflwr.compare", "--run-config", str(config)]
    command += ["--out", str(out), "--app-dir", str(ROOT), "--timeout", "600"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout's package in every process
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    return CompareRun(command, env, tmp_path, out, done)


def check_widths_result(result: dict, tiers: int) -> None:
    """A finished width-baseline run of one node per tier, every node's reply booked."""
    assert result["status"]["finished"] is True
    assert [t["partitions"] for t in result["tiers"]] == [[p] for p in range(tiers)]
    assert all(0.0 <= t["test_accuracy"] <= 1.0 for t in result["tiers"])
    assert result["ledger"]["train"]["totals"]["replies"] == tiers


def test_one_method_on_the_simulation_engine(compare_run) -> None:
    out, done = compare_run.out, compare_run.done
    log = (out / "heterofl" / "run" / "launch.log").read_text()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + log[-3000:]
    assert "finished:completed" in log
    content = json.loads((out / "leaderboard.json").read_text())
    (entry,) = content["methods"]
    assert entry["status"] == "finished" and entry["engine"] == "simulation"
    assert content["engine"].startswith("simulation engine")
    result = json.loads((out / entry["result"]).read_text())
    assert result["status"]["finished"] is True
    assert [r["model"] for r in content["rows"]] == ["T1 w=0.25", "T2 w=0.5", "T3 w=1"]
    for row, tier in zip(content["rows"], result["tiers"], strict=True):
        assert row["global_test_accuracy"] == tier["global_test_accuracy"]
    # the launcher kept the run's Flower home under the method's directory, nothing running
    (home,) = (out / "heterofl" / "run" / "flwr-home").iterdir()
    assert find_pids(flwr_home=home) == []

    command, env = compare_run.command, compare_run.env
    again = subprocess.run(command, cwd=compare_run.cwd, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "heterofl (run) reused" in again.stdout
    assert json.loads((out / "leaderboard.json").read_text())["rows"] == content["rows"]


def test_fjord_and_heterofl_run_on_the_simulation_engine(compare_run, tmp_path, data_cache):
    # on the engine: the compare command's HeteroFL run, one node per tier
    assert compare_run.done.returncode == 0, compare_run.done.stderr[-2000:]
    (entry,) = json.loads((compare_run.out / "leaderboard.json").read_text())["methods"]
    check_widths_result(json.loads((compare_run.out / entry["result"]).read_text()), NUM_NODES)
    # method = "fjord" through the ServerApp's main: the same handlers, its own dispatch
    out = tmp_path / "inprocess"
    config = {
        **pyproject_run_config(),
        "method": "fjord",
        "output-dir": str(out),
        "data.cache-dir": str(data_cache),
        "onnx": False,
        "fjord.rounds": 1,
        "fjord.batch-size": 64,
        "fjord.lr-probe": False,  # server-side steps before round 1 (test_widths.py)
        **FEW_ROWS,  # 64 rows per node
    }
    context = Context(run_id=7, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    server_main(InProcessGrid(client_app, config, 4), context)
    (result_file,) = out.glob("fjord-*/result.json")
    check_widths_result(json.loads(result_file.read_text()), 4)
