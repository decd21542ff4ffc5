"""Every method and baseline on Flower's deployment engine, with packed messages (issue 30).

One local deployment (``flower-superlink`` and three ``flower-supernode`` processes on
loopback, TLS and SuperNode authentication on, each message's ClientApp forked from its
node's warm executor) runs the eight methods one after another, each on a tiny setting.
Each SuperNode's ClientApp logs what every message carried as it arrived and what its
reply carried as it left (the timing log's mod runs outside the library's packing mod):
every message with arrays travels as one packed array each way, and every run finishes
with no reply rejected or failed. FedorAS's run also shows its Stage-1 round aggregated with
each of its messages packed both ways (this was ``test_packed_deployment.py``'s own
deployment and run; the run here covers it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedorasflwr.client_app import TIMING_LOG_ENV
from fedorasflwr.methods.fedoras.messages import FEDORAS_SUPERNET
from fedorasflwr.protocol import QUERY_PROFILE
from tests.engines.conftest import PROJECT_ROOT
from tests.reliability.trials import run_config_for
from tests.runconfig import FEW_ROWS, tiny_fdnas, tiny_fedoras

pytestmark = pytest.mark.slow

NODES = 3


def _config(method: str, cache: Path) -> dict[str, Any]:
    """A tiny run config of ``method`` for ``NODES`` nodes (``min-nodes``: all of them), each
    training on 64 rows of its own (``FEW_ROWS``), but CFDNAS, whose clusters are the class
    groups its partitioner gives the nodes."""
    if method == "fedoras":  # the whole pipeline: Stage 1, search, fine-tuning
        config = tiny_fedoras(cache, **{"fedoras.rounds": 1, "fedoras.clients-per-round": NODES})
    elif method == "cfdnas":
        config = tiny_fdnas(cache, method="cfdnas", **{"fdnas.final-rounds": 0})
    elif method in ("heterofl", "fjord"):
        config = {
            **tiny_fedoras(cache),
            "method": method,
            f"{method}.rounds": 1,
            f"{method}.batch-size": 64,
            f"{method}.lr-probe": False,  # server-side steps before round 1: nothing sent
        }
    else:
        config = run_config_for(method, cache)
    if method != "cfdnas":
        config |= FEW_ROWS  # packing holds at any data size
    return {**config, "min-nodes": NODES}


def _ledger_totals(result: dict[str, Any]) -> dict[str, int]:
    totals = {"replies": 0, "rejected": 0, "failed": 0}
    for stage in result["ledger"].values():
        if isinstance(stage, dict) and isinstance(stage.get("totals"), dict):
            for key in totals:
                totals[key] += int(stage["totals"].get(key, 0))
    return totals


def test_every_method_and_baseline_runs_deployed_with_packed_messages(
    deployment, tmp_path, data_cache
):
    timing = tmp_path / "timing.jsonl"
    engine = deployment(num_supernodes=NODES, env={TIMING_LOG_ENV: str(timing)})
    seen = 0
    for method in ("fedoras", "fdnas", "cfdnas", "dpfnas", "decnas", "fednas", "heterofl", "fjord"):
        out = tmp_path / method
        engine.run(PROJECT_ROOT, {**_config(method, data_cache), "output-dir": str(out)}, 1800)
        (result_file,) = out.glob(f"{method}-*/result.json")
        result = json.loads(result_file.read_text())
        assert result["status"]["finished"] is True, method
        totals = _ledger_totals(result)
        assert totals["replies"] > 0 and totals["rejected"] == 0 and totals["failed"] == 0, (
            method,
            totals,
        )
        lines = [json.loads(line) for line in timing.read_text().splitlines()][seen:]
        seen += len(lines)
        carrying = [line for line in lines if line["arrays"] > 0]
        assert carrying, f"{method}: no message carried arrays"
        assert all(line["arrays"] == 1 for line in carrying), method
        assert all(line["arrays-out"] <= 1 for line in lines), method
        assert any(line["arrays-out"] == 1 for line in lines), method
        profiles = [line for line in lines if line["message-type"] == QUERY_PROFILE]
        assert len(profiles) >= NODES and all(line["arrays"] == 0 for line in profiles), method
        if method == "fedoras":  # Stage 1's one round: every node trained, packed both ways
            assert [h["round"] for h in result["history"]] == [0, 1]
            assert result["history"][1]["clients"] == NODES
            stage1 = result["ledger"]["supernet"]["totals"]
            assert stage1["replies"] == NODES and stage1["rejected"] == stage1["failed"] == 0
            supernet = [line for line in lines if line["message-type"] == FEDORAS_SUPERNET]
            assert len(supernet) == NODES
            assert all(line["arrays"] == 1 and line["arrays-out"] == 1 for line in supernet)
