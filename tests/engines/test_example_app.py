"""The digits example (``examples/digits``), a Flower app of its own, under ``flwr run`` on
the simulation engine, as its README runs it: nothing installed (the example is not in the
venv: Flower loads ``digitsnas`` from the app's FAB, unpacked under ``$FLWR_HOME/apps``,
which it puts on ``sys.path`` of the ServerApp and of every ClientApp), nothing downloaded."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedorasflwr.launch import find_pids, run_simulation
from tests.digits_example import EXAMPLE_DIR, SPACE_PATH, check_result, run_config

pytestmark = pytest.mark.slow


def test_example_is_not_installed(tmp_path):
    # what makes the run below load the example from its FAB: no other copy is importable
    done = subprocess.run(
        [sys.executable, "-c", "import digitsnas"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode != 0 and "No module named 'digitsnas'" in done.stderr


def test_example_runs_under_flwr_run(flwr_home, tmp_path):
    out = tmp_path / "out"
    config = run_config(**{"output-dir": str(out)})  # the pyproject's (tiny) defaults
    result = run_simulation(
        EXAMPLE_DIR,
        num_supernodes=4,
        run_config={"output-dir": str(out)},
        flwr_home=flwr_home,
        client_num_cpus=1,
        timeout=300,
        env={"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "OMP_NUM_THREADS": "1"},
    )
    assert result.status == "finished:completed"
    (app_dir,) = (flwr_home / "apps").glob("*.digitsnas.*")  # the FAB, unpacked
    assert (app_dir / "digitsnas" / "space.py").is_file()
    found = check_result(out, config)
    assert f"digitsnas: search space {SPACE_PATH}, 2 tier(s)" in result.stdout
    for model in found["models"]:
        assert f"tier {model['tier']} (supernet): {'-'.join(model['names'])}" in result.stdout
    assert find_pids(flwr_home=flwr_home) == []  # the SuperLink and its children stopped
