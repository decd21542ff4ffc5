"""``python -m fedorasflwr.compare`` without ``--inprocess``: one tiny method through the
launcher on the simulation engine (its own process, its Flower home under the method's
directory, every Flower process stopped afterwards), then the leaderboard from its
result.json; a second call reuses the finished run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fedorasflwr.launch import find_pids
from tests.runconfig import ROOT

pytestmark = pytest.mark.slow

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
nodes = 3

[methods.heterofl.heterofl]
widths = "0.25,0.5,1.0"
rounds = 1
batch-size = 64
lr-probe = false
"""


def test_one_method_on_the_simulation_engine(tmp_path, data_cache) -> None:
    config = tmp_path / "one.toml"
    config.write_text(CONFIG.format(cache=data_cache))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "fedorasflwr.compare", "--run-config", str(config)]
    command += ["--out", str(out), "--app-dir", str(ROOT), "--timeout", "600"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout's package in every process
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
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

    again = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "heterofl (run) reused" in again.stdout
    assert json.loads((out / "leaderboard.json").read_text())["rows"] == content["rows"]
