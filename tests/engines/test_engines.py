"""The app, unchanged, on the simulation engine (`flwr run`, Ray).

One real run per thing only an engine shows: Stage 1 on the simulation engine equals the
in-process computation (a tiny run here); a bad run config fails the run. All three stages
with their exports: the README's default run (`test_readme_run.py`); the deployment engine:
`test_secure_deployment.py` (one run, TLS and authenticated SuperNodes, as by default).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord

from fedorasflwr.artifacts import load_checkpoint
from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.data import load_server_data
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.launch import FlowerRunError, find_pids
from fedorasflwr.methods.fedoras.strategy import FedorAS
from fedorasflwr.runs import build_supernet
from tests.runconfig import pyproject_run_config

pytestmark = pytest.mark.slow


def tiny(output_dir: Path, data_cache: Path, **overrides) -> dict:
    config = {
        "output-dir": str(output_dir),
        "data.cache-dir": str(data_cache),
        "onnx": False,  # ONNX export: test_export.py and the README run
        "space.width": 0.25,
        "fedoras.tier-samples": 500,
        "fedoras.eval-paths": 2,
        "fedoras.search-population": 4,
        "fedoras.search-offspring": 2,
        "fedoras.search-evaluations": 6,
        "fedoras.finetune-rounds": 1,
        "fedoras.finetune-clients-per-round": 2,
        "fedoras.compare-rand-init": False,
    }
    config.update(overrides)
    return config


def only_result(output_dir: Path) -> dict:
    results = list(output_dir.glob("fedoras-*/result.json"))
    assert len(results) == 1, results
    return json.loads(results[0].read_text())


def in_process_supernet(overrides: dict, num_nodes: int) -> dict:
    """The same run on the in-process grid: the engine must not change the computation."""
    config = {**pyproject_run_config(), **overrides}
    settings = parse_run_config(config)
    strategy = FedorAS(
        space=build_supernet(settings),
        settings=settings.fedoras,
        seed=settings.seed,
        server_data=load_server_data(settings.data),
    )
    strategy.settings = replace(strategy.settings, stop_after="supernet")
    grid = InProcessGrid(client_app, config, num_nodes)
    result = strategy.start(grid, ArrayRecord(), num_rounds=settings.fedoras.train.rounds)
    return result.arrays.to_torch_state_dict()


def test_simulation_engine_runs_stage1_as_in_process_and_stops_everything(
    simulation_runner, flwr_home, tmp_path, data_cache
):
    # Stage 1 on a tiny config: the engine must not change the computation
    out = tmp_path / "out"
    overrides = tiny(
        out,
        data_cache,
        **{
            "fedoras.rounds": 2,
            "fedoras.clients-per-round": 5,
            "fedoras.local-epochs": 1,
            "fedoras.stop-after": "supernet",
        },
    )
    simulation_runner(num_supernodes=10, client_num_cpus=1, run_config=overrides)
    result = only_result(out)
    assert [h["round"] for h in result["history"]] == [0, 1, 2]
    assert all(h["clients"] == 5 for h in result["history"][1:])
    ledger = result["ledger"]["supernet"]
    assert ledger["totals"]["messages"] == 10 and ledger["totals"]["replies"] == 10
    assert ledger["totals"]["bytes_down"] > 0 and ledger["totals"]["bytes_up"] > 0
    assert len(result["tier-of-partition"]) == 10
    assert find_pids(flwr_home=flwr_home) == []
    run_dir = next(out.glob("fedoras-*"))
    engine = load_checkpoint(run_dir / "supernet.pt")["state_dict"]
    expected = in_process_supernet(overrides, num_nodes=10)
    assert engine.keys() == expected.keys()
    # Same draws, same batches, same paths: equal up to float32 rounding (depthwise-conv
    # kernels may sum in another order on deserialized buffers; seen: <= 3e-8).  A real
    # difference (another path, batch or thread count) moves weights by ~1e-2.
    for key, value in expected.items():
        torch.testing.assert_close(engine[key], value, rtol=0, atol=1e-6, msg=key)


def test_bad_run_config_fails_before_any_training(simulation_runner, tmp_path, data_cache):
    out = tmp_path / "out"
    with pytest.raises(FlowerRunError, match=r"fedoras\.lr.*-1"):
        simulation_runner(
            num_supernodes=2, run_config=tiny(out, data_cache, **{"fedoras.lr": -1.0})
        )
    assert not list(out.glob("*/supernet.pt"))
