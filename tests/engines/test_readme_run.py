"""The README's run command, exactly as a new user types it (after `pip install -e .`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedorasflwr.launch import find_pids

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def readme_run_command() -> str:
    """The first command of the README: the one that installs and runs the default search."""
    first = re.search(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text(), re.S)
    assert first, "README.md must open with a bash block holding the run command"
    return first.group(1).strip()


def test_readme_opens_with_the_run_and_test_commands():
    blocks = re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text(), re.S)
    assert blocks[0].endswith("python -m fedorasflwr.launch")
    assert blocks[1].endswith('pip install -e ".[test]" && python -m pytest')
    ci = (ROOT / ".ci" / "run").read_text()
    assert blocks[1].split("&& ", 2)[-1] in ci  # CI runs exactly the README's test command


def test_default_search_runs_three_stages_above_chance_and_leaves_nothing_running(tmp_path):
    command = readme_run_command().split("&& ")[-1].split()  # the venv and install are ours
    assert command == ["python", "-m", "fedorasflwr.launch"]
    home = tmp_path / "flwr-home"
    env = dict(os.environ, FEDORASFLWR_CACHE=str(tmp_path / "cache"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedorasflwr.launch",
            "--app-dir",
            str(ROOT),
            "--flwr-home",
            str(home),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert ":INFO:" not in done.stdout  # no second, timestamped copy of each line (opacus)
    assert "=== fedoras summary ===" in done.stdout
    results = list((tmp_path / "outputs").glob("fedoras-*/result.json"))
    assert len(results) == 1
    result = json.loads(results[0].read_text())
    assert len(result["tier-of-partition"]) == 20
    assert len(result["tiers"]) == 4
    curve = [h["val-accuracy"] for h in result["history"]]
    assert curve[0] < 0.2
    assert curve[-1] > 0.3  # ten classes: chance is 0.1
    run_dir = results[0].parent
    assert [m["tier"] for m in result["models"] if m["init"] == "supernet"] == [1, 2, 3, 4]
    assert [m["tier"] for m in result["models"] if m["init"] == "random"] == [1, 2, 3, 4]
    for model, tier in zip(result["models"][::2], result["tiers"], strict=True):
        assert tier["low"] < model["flops"] <= tier["high"]
        assert model["test"]["accuracy"] > 0.3
        assert (run_dir / f"tier-{model['tier']}.pt").exists()
    for plot in ("supernet_accuracy.png", "tiers_accuracy_flops.png", "finetune_curves.png"):
        assert (run_dir / plot).exists()
    assert find_pids(flwr_home=home) == []
