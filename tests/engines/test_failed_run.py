"""A run whose ServerApp raised, through the launcher as a user runs it (issue 32): ``flwr
run --stream`` exits 0 for it; the launcher reads the run's status from Flower and exits 1
with the error, the real run id and its ``flwr log`` command, and leaves nothing running."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from fedorasflwr.launch import find_pids, format_run_config
from tests.engines.conftest import flwr_ls
from tests.runconfig import ROOT

pytestmark = pytest.mark.slow


def test_a_serverapp_that_raised_exits_1_with_the_run_id_and_its_log_command(tmp_path):
    out, home = tmp_path / "out", tmp_path / "flwr-home"
    command = [sys.executable, "-m", "fedorasflwr.launch", "--app-dir", str(ROOT)]
    command += ["--num-supernodes", "2", "--output-dir", str(out), "--flwr-home", str(home)]
    # a run config the launcher's up-front check passes (a bad value, e.g. fedoras.lr=-1.0,
    # exits 2 there: tests/test_unknown_keys.py) and the ServerApp fails on: its data cache
    # is a file
    (tmp_path / "a-file").write_text("")
    cache = format_run_config({"data.cache-dir": str(tmp_path / "a-file")})
    command += ["--run-config", cache, "--timeout", "300"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout's launcher
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"NotADirectoryError: data cache directory .*a-file", done.stderr), done.stderr

    (run,) = flwr_ls(home)  # Flower's own word on the run, and its id
    assert run["status"] == "finished:failed"
    run_id = run["run-id"]
    assert f"run {run_id} ended as 'finished:failed'" in done.stderr
    assert f"run {run_id}: finished:failed; exit code 1" in done.stderr
    assert f"FLWR_HOME={home} flwr log {run_id} local --show" in done.stderr
    assert "<run-id>" not in done.stderr
    # the run directory was made before the data cache failed: kept, its result.json says why
    (run_dir,) = out.glob("fedoras-*")
    assert f"run directory {run_dir}: kept" in done.stderr
    assert "NotADirectoryError" in (run_dir / "result.json").read_text()
    assert find_pids(flwr_home=home) == []
