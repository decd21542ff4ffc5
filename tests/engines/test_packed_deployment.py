"""Packed messages through Flower's deployment engine (docs/protocol.md, "Packed
arrays"): flower-superlink and two flower-supernodes with TLS and SuperNode
authentication, one FedorAS Stage-1 round. Each SuperNode's ClientApp logs what every
message carried as it arrived and what its reply carried as it left (the timing log's
mod runs outside the library's): one array each way, and the round is aggregated."""

from __future__ import annotations

import json

import pytest

from fedorasflwr.client_app import TIMING_LOG_ENV
from fedorasflwr.methods.fedoras.messages import FEDORAS_SUPERNET
from fedorasflwr.protocol import QUERY_PROFILE
from tests.engines.conftest import PROJECT_ROOT
from tests.runconfig import tiny_fedoras


@pytest.mark.slow
def test_packed_messages_pass_through_superlink_and_supernodes(deployment, tmp_path, data_cache):
    timing = tmp_path / "timing.jsonl"
    engine = deployment(num_supernodes=2, env={TIMING_LOG_ENV: str(timing)})
    out = tmp_path / "out"
    config = tiny_fedoras(
        data_cache,
        **{
            "output-dir": str(out),
            "fedoras.stop-after": "supernet",
            "fedoras.rounds": 1,
            "fedoras.clients-per-round": 2,
        },
    )
    engine.run(PROJECT_ROOT, config, timeout=600)
    (result_file,) = out.glob("fedoras-*/result.json")
    result = json.loads(result_file.read_text())
    assert [h["round"] for h in result["history"]] == [0, 1]
    assert result["history"][1]["clients"] == 2
    totals = result["ledger"]["supernet"]["totals"]
    assert totals["replies"] == 2 and totals["rejected"] == 0 and totals["failed"] == 0
    lines = [json.loads(line) for line in timing.read_text().splitlines()]
    supernet = [line for line in lines if line["message-type"] == FEDORAS_SUPERNET]
    assert len(supernet) == 2
    assert all(line["arrays"] == 1 and line["arrays-out"] == 1 for line in supernet)
    profiles = [line for line in lines if line["message-type"] == QUERY_PROFILE]
    assert profiles and all(line["arrays"] == 0 for line in profiles)
