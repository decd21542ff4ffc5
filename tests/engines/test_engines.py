"""The app, unchanged, on the simulation engine (`flwr run`, Ray).

One real run per thing only an engine shows: Stage 1 on the simulation engine, by latency,
equals the in-process computation (a tiny run here: the nodes time their tables on the
engine, the server tiers them as in-process, and the supernet it trains is the in-process
one); a bad run config fails the run. All three stages
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
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.launch import FlowerRunError, find_pids
from fedorasflwr.methods.fedoras.runner import build_fedoras
from fedorasflwr.methods.fedoras.strategy import FedorAS
from tests.runconfig import FEW_ROWS, pyproject_run_config

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
        **FEW_ROWS,  # 64 rows per node: the engine's sameness holds at any data size
    }
    config.update(overrides)
    return config


def tiny_stage1(output_dir: Path, data_cache: Path, rounds: int, **overrides) -> dict:
    """`tiny`, Stage 1 only: ``rounds`` rounds of 5 of the 10 nodes, 1 local epoch."""
    stage1 = {
        "fedoras.rounds": rounds,
        "fedoras.clients-per-round": 5,
        "fedoras.local-epochs": 1,
        "fedoras.stop-after": "supernet",
    }
    return tiny(output_dir, data_cache, **stage1, **overrides)


def only_result(output_dir: Path) -> dict:
    results = list(output_dir.glob("fedoras-*/result.json"))
    assert len(results) == 1, results
    return json.loads(results[0].read_text())


def in_process_fedoras(overrides: dict, num_nodes: int) -> tuple[FedorAS, InProcessGrid]:
    """The run's strategy, built as the ServerApp builds it, on an in-process grid."""
    config = {**pyproject_run_config(), **overrides}
    strategy = build_fedoras(parse_run_config(config))
    strategy.settings = replace(strategy.settings, stop_after="supernet")
    return strategy, InProcessGrid(client_app, config, num_nodes)


def test_simulation_engine_runs_stage1_by_the_nodes_tables_as_in_process_and_stops_everything(
    simulation_runner, flwr_home, tmp_path, data_cache, monkeypatch
):
    # fedoras.resource = "latency" on the engine: the nodes time their tables, the server
    # forms tiers in milliseconds from them and places the nodes, Stage 1 trains; the engine
    # must not change the computation (one tiny run shows both).
    out = tmp_path / "out"
    overrides = tiny_stage1(
        out,
        data_cache,
        rounds=2,
        **{
            "fedoras.resource": "latency",
            "latency.repeats": 1,
            "latency.warmup": 0,
            "latency.validation-paths": 2,
        },
    )
    node_cache = tmp_path / "node-cache"
    simulation_runner(
        num_supernodes=10,
        client_num_cpus=1,
        run_config=overrides,
        env={"FEDORASFLWR_CACHE": str(node_cache)},
    )
    result = only_result(out)
    assert [h["round"] for h in result["history"]] == [0, 1, 2]
    assert all(h["clients"] == 5 for h in result["history"][1:])
    ledger = result["ledger"]["supernet"]
    assert ledger["totals"]["messages"] == 10 and ledger["totals"]["replies"] == 10
    assert ledger["totals"]["bytes_down"] > 0 and ledger["totals"]["bytes_up"] > 0
    assert len(result["tier_of_partition"]) == 10
    assert find_pids(flwr_home=flwr_home) == []
    assert result["resource"] == "latency"
    # one host, one thread per ClientApp: the first node to ask timed the table (under the
    # cache's lock), the nine others read it
    tables = result["latency_tables"]["nodes"]
    assert [n["partition_id"] for n in tables] == list(range(10))
    assert len({json.dumps(n["option_ms"]) for n in tables}) == 1
    (cache_file,) = (node_cache / "latency").glob("*.json")
    assert result["ledger"]["latency"]["totals"]["replies"] == 10
    # The tiers split the table's path range in milliseconds.
    option_ms = tables[0]["option_ms"]
    fixed = tables[0]["fixed_ms"]
    lowest = fixed + sum(min(layer) for layer in option_ms)
    highest = fixed + sum(max(layer) for layer in option_ms)
    tiers = result["tiers"]
    assert [t["index"] for t in tiers] == [1, 2, 3, 4]  # 1-based, as users see them
    assert all(t["low"] < t["high"] for t in tiers)
    assert lowest * (1 - 1e-9) <= tiers[0]["low"] and tiers[-1]["high"] <= highest * (1 + 1e-9)
    assert sorted(result["tier_latency_tables"]) == ["1", "2", "3", "4"]
    # The same run in this process, from the same cached table: the same tiers and
    # placements, and the same supernet.
    monkeypatch.setenv("FEDORASFLWR_CACHE", str(node_cache))
    before = cache_file.read_bytes()
    strategy, grid = in_process_fedoras(overrides, num_nodes=10)
    expected = strategy.start(grid, ArrayRecord(), num_rounds=strategy.settings.train.rounds)
    assert cache_file.read_bytes() == before  # read, not timed again
    assert [(t.low, t.high) for t in strategy.tiers] == [(t["low"], t["high"]) for t in tiers]
    placed = {str(p): t + 1 for p, t in strategy.tier_of_partition.items()}
    assert result["tier_of_partition"] == placed
    run_dir = next(out.glob("fedoras-*"))
    engine = load_checkpoint(run_dir / "supernet.pt")["state_dict"]
    expected_state = expected.arrays.to_torch_state_dict()
    assert engine.keys() == expected_state.keys()
    # Same draws, same batches, same paths: equal up to float32 rounding (depthwise-conv
    # kernels may sum in another order on deserialized buffers; seen: <= 3e-8).  A real
    # difference (another path, batch or thread count) moves weights by ~1e-2.
    for key, value in expected_state.items():
        torch.testing.assert_close(engine[key], value, rtol=0, atol=1e-6, msg=key)

    # The same seed on the engine a second time: the same numbers, to the bit. Five replies
    # a round come back from two ClientApp workers in whatever order they finish; the
    # server sums them by partition id, so arrival order cannot move a float.
    again = tmp_path / "again"
    simulation_runner(
        num_supernodes=10,
        client_num_cpus=1,
        run_config={**overrides, "output-dir": str(again)},
        env={"FEDORASFLWR_CACHE": str(node_cache)},
    )
    second = only_result(again)

    def numbers(history: list[dict]) -> list[dict]:  # every figure but the wall time
        return [{k: v for k, v in entry.items() if k != "seconds"} for entry in history]

    assert numbers(second["history"]) == numbers(result["history"])
    assert second["tier_of_partition"] == result["tier_of_partition"]
    rerun = load_checkpoint(next(again.glob("fedoras-*")) / "supernet.pt")["state_dict"]
    assert rerun.keys() == engine.keys()
    differing = [key for key, value in engine.items() if not torch.equal(rerun[key], value)]
    assert differing == [], (
        f"{len(differing)} tensor(s) differ between two runs, e.g. {differing[:3]}"
    )


def test_bad_run_config_fails_before_any_training(simulation_runner, tmp_path, data_cache):
    out = tmp_path / "out"
    with pytest.raises(FlowerRunError, match=r"fedoras\.lr.*-1"):
        simulation_runner(
            num_supernodes=2, run_config=tiny(out, data_cache, **{"fedoras.lr": -1.0})
        )
    assert not list(out.glob("*/supernet.pt"))
