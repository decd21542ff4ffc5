"""A quick preset, run the way the README says (``python -m fedorasflwr.launch --run-config
configs/quick-....toml``), shrunk further with a second ``--run-config``; afterwards the run's
Flower home is kept and ``flwr ls`` shows the run, and no Flower process is left."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedorasflwr.launch import find_pids, format_run_config
from fedorasflwr.launch.flwr_cli import _flower_env
from fedorasflwr.launch.processes import _free_ports, _stop_flower_processes
from tests.runconfig import ROOT

pytestmark = pytest.mark.slow

PRESET = "configs/quick-decnas.toml"  # the cheapest quick preset
SHRINK = {"decnas.max-iterations": 1, "decnas.gm0-rounds": 1, "decnas.final-rounds": 1}


def test_quick_preset_runs_through_the_launcher_and_stays_listable(tmp_path, data_cache):
    out = tmp_path / "out"
    overrides = format_run_config(SHRINK | {"data.cache-dir": str(data_cache)})
    command = [sys.executable, "-m", "fedorasflwr.launch", "--app-dir", str(ROOT)]
    command += ["--num-supernodes", "6", "--output-dir", str(out), "--timeout", "600"]
    command += ["--run-config", str(ROOT / PRESET), "--run-config", overrides]
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout's launcher, not an installed one
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # what a person reads: Flower's preamble filtered, each line once, a short page
    assert "Starting logstream" not in done.stdout
    assert done.stdout.count("=== decnas summary ===") == 1
    assert len(done.stdout.splitlines()) < 60, done.stdout

    results = list(out.glob("decnas-*/result.json"))
    assert len(results) == 1
    result = json.loads(results[0].read_text())
    assert result["settings"]["space"]["width"] == 0.125  # from the preset
    assert len(result["frontier"]) == 2  # GM_0 and GM_1: max-iterations from the override

    match = re.search(r"FLWR_HOME=(\S+) flwr log (\d+) local --show", done.stdout)
    assert match, done.stdout[-2000:]
    home, run_id = Path(match.group(1)), match.group(2)
    assert home.parent == out / "flwr-home"
    assert (home / "local-superlink" / "state.db").exists()
    assert find_pids(flwr_home=home) == []  # the launcher stopped what it started

    http, control = _free_ports(2)  # not Flower's default ports: another SuperLink may hold them
    ports = {
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control),
    }
    env = _flower_env(home, ports)  # FLWR_HOME; the venv's bin on PATH: flwr starts a SuperLink
    flwr = str(Path(sys.executable).parent / "flwr")
    try:
        listed = subprocess.run(
            [flwr, "ls", "local", "--format", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        _stop_flower_processes(home)  # the SuperLink `flwr ls` started
    runs = json.loads(listed.stdout[listed.stdout.find("{") :])["runs"]
    assert [(str(run["run-id"]), run["status"]) for run in runs] == [(run_id, "finished:completed")]
    assert find_pids(flwr_home=home) == []
