"""A SuperNode killed mid-round: the run completes on the others, and the ledger books
the lost message once, to the killed node, as lost (or timed out); no phantom node."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.runconfig import tiny_fedoras

pytestmark = pytest.mark.slow

SUPERNET_MESSAGE = "Receiving: train.fedoras_supernet message"


def kill_when_logged(pid: int, log_file: Path, text: str, killed: threading.Event) -> None:
    """SIGKILL the process group ``pid`` leads as soon as ``text`` is in ``log_file``."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if log_file.exists() and text in log_file.read_text(errors="replace"):
            os.killpg(pid, signal.SIGKILL)  # the SuperNode and its running ClientApp
            killed.set()
            return
        time.sleep(0.2)


def test_a_supernode_killed_mid_round_is_booked_once_to_itself(
    deployment, project_root, tmp_path, data_cache
):
    engine = deployment(num_supernodes=3)
    victim = engine.supernodes[2]
    victim_id = engine.node_ids[2]  # registered in supernode order
    killed = threading.Event()
    watcher = threading.Thread(
        target=kill_when_logged,
        args=(victim.pid, engine.flwr_home / "logs" / "supernode-2.log", SUPERNET_MESSAGE, killed),
        daemon=True,
    )
    watcher.start()
    out = tmp_path / "out"
    config = tiny_fedoras(
        data_cache,
        **{
            "output-dir": str(out),
            "reply-timeout": 240.0,  # the SuperLink declares a node lost after ~60 s
            "fedoras.rounds": 1,
            "fedoras.num-tiers": 1,  # every node eligible for fine-tuning: 2 survivors suffice
            "fedoras.search-evaluations": 4,  # one generation: Stage 2 runs, in fewer messages
            "fedoras.clients-per-round": 3,
            "fedoras.min-replies": 2,
            "fedoras.finetune-clients-per-round": 3,
        },
    )
    run = engine.run(project_root, config, timeout=900)  # raises unless finished:completed
    watcher.join(timeout=1)
    assert killed.is_set() and victim.poll() is not None

    (result_file,) = out.glob("fedoras-*/result.json")
    result = json.loads(result_file.read_text())
    ledger = result["ledger"]
    nodes = set(engine.node_ids)
    assert {int(n) for n in ledger["profile"]["nodes"]} == nodes
    for name, stage in ledger.items():
        assert {int(n) for n in stage["nodes"]} <= nodes, f"phantom node in {name}"
    supernet = ledger["supernet"]["nodes"][str(victim_id)]
    assert (supernet["messages"], supernet["replies"], supernet["failed"]) == (1, 0, 1)
    # Lost, not timed out: the SuperLink gives up on a silent node after ~60 s (two missed
    # 30-s heartbeats) and answers NODE_UNAVAILABLE, well before the 240-s reply timeout.
    assert (supernet["lost"], supernet["timed_out"], supernet["error_replies"]) == (1, 0, 0)
    assert ledger["supernet"]["totals"]["replies"] == 2
    # Booked once: each failed message once, to the victim, split by kind; no one else fails.
    for name, stage in ledger.items():
        for node, costs in stage["nodes"].items():
            kinds = costs["lost"] + costs["timed_out"] + costs["error_replies"]
            assert costs["failed"] == kinds, (name, node, costs)
            unanswered = costs["messages"] - costs["replies"]
            if int(node) == victim_id:
                assert costs["failed"] == unanswered and costs["error_replies"] == 0
            else:
                assert costs["failed"] == 0, (name, node, costs)
        assert stage["totals"]["failed"] == stage["nodes"].get(str(victim_id), {}).get("failed", 0)
    assert [h["round"] for h in result["history"]] == [0, 1]
    assert f"[supernet] node {victim_id} lost: error code 5" in run.stdout
    assert "node 1 " not in run.stdout  # the SuperLink's own id never stands for a node
