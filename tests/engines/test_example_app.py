"""The example apps (``examples/digits``, ``examples/netadapt``), Flower apps of their own,
under ``flwr run`` on the simulation engine, as their READMEs run them: nothing installed
(the examples are not in the venv: Flower loads each app's package from its FAB, unpacked
under ``$FLWR_HOME/apps``, which it puts on ``sys.path`` of the ServerApp and of every
ClientApp), nothing downloaded.

The netadapt example runs through the launcher (``python -m fedorasflwr.launch --app-dir``,
as docs/library.md recommends for an exit code that tells), with an override of one of the
app's own keys (``noise``) and its ``output-dir`` from ``--output-dir``; the digits example
runs through ``flwr run`` directly.

Both runs start at once, one thread each, in one module-scoped fixture: most of a run's
wall time is Flower and Ray starting and messages waiting, so the two overlap well on a
small machine (about 105 s together under load, against 99 s and 44 s one after the other).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fedorasflwr.launch import RunResult, find_pids
from fedorasflwr.launch.flwr_cli import format_run_config
from tests import digits_example, netadapt_example

pytestmark = pytest.mark.slow

ENV = {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "OMP_NUM_THREADS": "1"}
# the netadapt example shrunk to its wiring (GM_0, one NetAdapt iteration, one tuning round):
# its effect is tests/test_netadapt_example_inprocess.py's, on the pyproject's own defaults
NETADAPT_SHRUNK = {
    "decnas.gm0-rounds": 2,
    "decnas.initial-reduction": 0.7,
    "decnas.final-rounds": 1,
}


@dataclass(frozen=True)
class ExampleRun:
    """One example's run: Flower's result, its ``FLWR_HOME``, output dir and run config."""

    result: RunResult
    flwr_home: Path
    out: Path
    config: dict[str, Any]


@pytest.fixture(scope="module")
def example_runs(module_simulation_runner, tmp_path_factory) -> dict[str, ExampleRun]:
    """Both examples run once under ``flwr run``, at the same time; each stops its own
    SuperLink and children (``run_simulation``), also when the other fails."""
    overrides = {"digits": {}, "netadapt": NETADAPT_SHRUNK}
    modules = {"digits": digits_example, "netadapt": netadapt_example}

    def launch(name: str) -> ExampleRun:
        out = tmp_path_factory.mktemp(f"{name}-out")
        home = tmp_path_factory.mktemp("flwr-home")
        run_config = {**overrides[name], "noise": 0.4}  # "noise": the app's own key
        command = [sys.executable, "-m", "fedorasflwr.launch"]
        command += ["--app-dir", str(modules[name].EXAMPLE_DIR), "--num-supernodes", "4"]
        command += ["--output-dir", str(out), "--flwr-home", str(home), "--verbose"]
        command += ["--run-config", format_run_config(run_config), "--timeout", "300"]
        done = subprocess.run(
            command, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        match = re.search(r"^run (\d+) (\S+) in ([\d.]+)s$", done.stdout, re.MULTILINE)
        assert match is not None, done.stdout[-3000:]
        result = RunResult(
            run_id=int(match[1]),
            status=match[2],
            returncode=done.returncode,
            stdout=done.stdout,
            wall_time=float(match[3]),
        )
        config = modules[name].run_config(**run_config, **{"output-dir": str(out)})
        return ExampleRun(result, home, out, config)

    def run(name: str) -> ExampleRun:
        if name == "netadapt":
            return launch(name)
        out = tmp_path_factory.mktemp(f"{name}-out")
        run_config = {"output-dir": str(out), **overrides[name]}
        result, home = module_simulation_runner(
            app_dir=modules[name].EXAMPLE_DIR,
            num_supernodes=4,
            run_config=run_config,
            client_num_cpus=1,
            timeout=900,
            env=ENV,
        )
        return ExampleRun(result, home, out, modules[name].run_config(**run_config))

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run, name) for name in overrides}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("package", ["digitsnas", "shapesprune"])
def test_example_is_not_installed(tmp_path, package):
    # what makes the runs below load the examples from their FABs: no other copy is importable
    done = subprocess.run(
        [sys.executable, "-c", f"import {package}"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode != 0 and f"No module named '{package}'" in done.stderr


def test_digits_example_runs_under_flwr_run(example_runs):
    run = example_runs["digits"]  # the pyproject's (tiny) defaults
    assert run.result.status == "finished:completed"
    (app_dir,) = (run.flwr_home / "apps").glob("*.digitsnas.*")  # the FAB, unpacked
    assert (app_dir / "digitsnas" / "space.py").is_file()
    found = digits_example.check_result(run.out, run.config)
    stdout = run.result.stdout
    assert f"digitsnas: search space {digits_example.SPACE_PATH}, 2 tier(s)" in stdout
    for model in found["models"]:
        assert f"tier {model['tier']} (supernet): {'-'.join(model['names'])}" in stdout
    assert find_pids(flwr_home=run.flwr_home) == []  # the SuperLink and its children stopped


def test_netadapt_example_runs_under_flwr_run(example_runs):
    run = example_runs["netadapt"]
    assert run.result.status == "finished:completed"
    (app_dir,) = (run.flwr_home / "apps").glob("*.shapesprune.*")  # the FAB, unpacked
    assert (app_dir / "shapesprune" / "model.py").is_file()
    found, _ = netadapt_example.check_result(run.out, run.config)
    stdout = run.result.stdout
    assert f"shapesprune: {netadapt_example.MODEL_PATH}, prunable layers" in stdout
    for gm in found["frontier"]:
        assert f"GM_{gm['gm']}: widths {gm['widths']}, {gm['macs']} MACs" in stdout
    final = found["final"]
    assert f"final model GM_{final['gm']}, {final['macs-fraction']:.2f} of GM_0's MACs" in stdout
    assert find_pids(flwr_home=run.flwr_home) == []  # the SuperLink and its children stopped
