"""The README's run command, exactly as a new user types it (after `pip install -e .`).

The run itself is the session fixture ``readme_run`` (tests/engines/conftest.py): the
default search is the suite's most expensive run, so every test that needs all three stages
on the simulation engine asserts on this one run, and they all live in this module (the
suite runs on several workers, one module per worker: a second module would run it again).
"""

from __future__ import annotations

import json

import pytest

from fedorasflwr.artifacts import load_checkpoint
from fedorasflwr.launch import find_pids
from fedorasflwr.search_spaces import build_space
from tests.runconfig import ROOT, readme_bash_blocks, readme_run_command

pytestmark = pytest.mark.slow


def test_readme_opens_with_the_run_and_test_commands():
    blocks = readme_bash_blocks()
    assert blocks[0].endswith("python -m fedorasflwr.launch")
    assert readme_run_command() == blocks[0].strip()
    assert blocks[1].endswith('pip install -e ".[test]" -c constraints.txt && python -m pytest')
    ci = (ROOT / ".ci" / "run").read_text()
    assert blocks[1].split("&& ", 2)[-1] in ci  # CI runs exactly the README's test command


def test_default_search_runs_three_stages_above_chance_and_leaves_nothing_running(readme_run):
    done = readme_run.done
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert ":INFO:" not in done.stdout  # no second, timestamped copy of each line (opacus)
    assert "=== fedoras summary ===" in done.stdout
    results = list((readme_run.cwd / "outputs").glob("fedoras-*/result.json"))
    assert len(results) == 1
    result = json.loads(results[0].read_text())
    assert len(result["tier_of_partition"]) == 20
    assert len(result["tiers"]) == 4
    curve = [h["val_accuracy"] for h in result["history"]]
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
    assert find_pids(flwr_home=readme_run.flwr_home) == []


def test_default_search_exports_a_model_per_tier_and_init_that_rebuilds(readme_run):
    # All three stages on the simulation engine: one run of them is enough, the README's.
    # one searched, fine-tuned and exported model per tier and init, rebuilt from its file
    assert readme_run.done.returncode == 0, readme_run.done.stderr[-3000:]
    out = readme_run.cwd / "outputs"
    (result_file,) = out.glob("fedoras-*/result.json")
    result = json.loads(result_file.read_text())
    run_dir = next(out.glob("fedoras-*"))
    supernet_init = [m for m in result["models"] if m["init"] == "supernet"]
    assert [m["tier"] for m in supernet_init] == [1, 2, 3, 4]
    for model in result["models"]:
        tier = result["tiers"][model["tier"] - 1]
        assert tier["low"] < model["flops"] <= tier["high"]
        assert model["macs"] * 2 == model["flops"]  # MACs beside FLOPs: the papers' unit
        assert tier["low_macs"] < model["macs"] <= tier["high_macs"]
        assert 0.0 <= model["test"]["accuracy"] <= 1.0
        suffix = "" if model["init"] == "supernet" else f"-{model['init']}-init"
        exported = load_checkpoint(run_dir / f"tier-{model['tier']}{suffix}.pt")
        assert exported["options"] == model["options"]
        net = build_space(**exported["space"]).subnet(exported["arch"])
        net.load_state_dict(exported["state_dict"])  # strict: the export rebuilds
    for plot in ("tiers_accuracy_flops.png", "supernet_accuracy.png", "finetune_curves.png"):
        assert (run_dir / plot).stat().st_size > 0
    assert {f"tier-{t}.pt" for t in range(1, 5)} <= set(result["files"])
    assert find_pids(flwr_home=readme_run.flwr_home) == []
