"""A run whose ServerApp raised, through the launcher as a user runs it (issue 32): ``flwr
run --stream`` exits 0 for it; the launcher reads the run's status from Flower and exits 1
with the error, the real run id and its ``flwr log`` command, and leaves nothing running."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from fedorasflwr.launch import find_pids
from tests.engines.conftest import flwr_ls
from tests.runconfig import ROOT

pytestmark = pytest.mark.slow


def test_a_serverapp_that_raised_exits_1_with_the_run_id_and_its_log_command(tmp_path):
    out, home = tmp_path / "out", tmp_path / "flwr-home"
    command = [sys.executable, "-m", "fedorasflwr.launch", "--app-dir", str(ROOT)]
    command += ["--num-supernodes", "2", "--output-dir", str(out), "--flwr-home", str(home)]
    # a known key with a value the ServerApp refuses (ValueError), past the launcher's check
    command += ["--run-config", "fedoras.lr=-1.0", "--timeout", "300"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout's launcher
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"ValueError.*fedoras\.lr.*-1", done.stderr), done.stderr[-3000:]

    (run,) = flwr_ls(home)  # Flower's own word on the run, and its id
    assert run["status"] == "finished:failed"
    run_id = run["run-id"]
    assert f"run {run_id} ended as 'finished:failed'" in done.stderr
    assert f"run {run_id}: finished:failed; exit code 1" in done.stderr
    assert f"FLWR_HOME={home} flwr log {run_id} local --show" in done.stderr
    assert "<run-id>" not in done.stderr
    assert "no run directory was created" in done.stderr  # it failed parsing its config
    assert not any(out.glob("fedoras-*"))
    assert find_pids(flwr_home=home) == []
