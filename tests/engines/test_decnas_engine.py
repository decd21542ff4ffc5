"""DecNAS, unchanged, on the simulation engine (`flwr run`, Ray)."""

from __future__ import annotations

import json

import pytest

from fedorasflwr.artifacts import load_checkpoint
from fedorasflwr.search_spaces.prunable import build_prunable
from tests.runconfig import pyproject_run_config, tiny_decnas

pytestmark = pytest.mark.slow


def test_decnas_runs_on_the_simulation_engine(simulation_runner, tmp_path, data_cache):
    out = tmp_path / "out"
    overrides = {
        key: value
        for key, value in tiny_decnas(data_cache, **{"decnas.gm0-rounds": 0}).items()
        if pyproject_run_config().get(key) != value
    }
    simulation_runner(
        num_supernodes=6,
        client_num_cpus=1,
        run_config={**overrides, "output-dir": str(out)},
    )
    (run_dir,) = out.glob("decnas-*")
    result = json.loads((run_dir / "result.json").read_text())
    gm0, gm1 = result["frontier"]
    assert gm1["macs"] <= gm1["budget"] < gm0["macs"]
    assert 0.0 <= gm1["tuned-test-accuracy"] <= 1.0
    (entry,) = result["history"]
    assert len(entry["dropped"]) == 2 and len(entry["survivors"]) == 4
    assert result["ledger"]["tune"]["totals"]["bytes_up"] == 0
    assert result["ledger"]["upload"]["totals"]["replies"] > 0
    assert {"gm0.pt", "gm1.pt", "gm1-tuned.pt", "frontier.png"} <= set(result["files"])
    checkpoint = load_checkpoint(run_dir / "gm1-tuned.pt")
    net = build_prunable(**checkpoint["space"])
    net.load_state_dict(checkpoint["state_dict"])
    assert list(net.widths) == gm1["widths"]
