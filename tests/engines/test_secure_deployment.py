"""A whole tiny FedorAS run over TLS with authenticated SuperNodes; an unregistered
SuperNode is refused.  One run, shared by the assertions (engine time is dear)."""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.error
import urllib.request

import pytest

from fedorasflwr.launch import LOOPBACK, find_pids, make_node_key, make_tls_files
from tests.runconfig import tiny_fedoras

pytestmark = pytest.mark.slow

REFUSED = "No SuperNode found with the given public key"


def wait_for_exit(process: subprocess.Popen[bytes], seconds: float) -> int | None:
    try:
        return process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None


def test_tls_run_with_registered_supernodes_refuses_an_unregistered_one(
    deployment, project_root, tmp_path, data_cache
):
    tls = make_tls_files(tmp_path / "certs")
    keys = [make_node_key(tmp_path / "keys", f"node-{i}") for i in range(2)]
    engine = deployment(num_supernodes=2, tls=tls, node_keys=[key.private_key for key in keys])
    superlink = engine.processes[0].args
    assert "--insecure" not in superlink and "--enable-supernode-auth" in superlink
    assert superlink[superlink.index("--ssl-certfile") + 1] == str(tls.server_cert)
    for node in engine.supernodes:
        assert "--insecure" not in node.args and str(tls.ca_cert) in node.args

    # The port speaks TLS only, with a certificate the CA vouches for.
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://{LOOPBACK}:{engine.port}/health", timeout=5)
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(
            f"https://{LOOPBACK}:{engine.port}/health",
            timeout=5,
            context=ssl.create_default_context(),  # system CAs only
        )

    # A SuperNode with a key nobody registered: refused at sign-in, it exits.
    rogue_key = make_node_key(tmp_path / "rogue", "rogue")
    rogue = engine.start_supernode(
        "rogue", {"partition-id": 0, "num-partitions": 2}, rogue_key.private_key
    )
    assert wait_for_exit(rogue, 90) not in (None, 0)
    rogue_log = (engine.flwr_home / "logs" / "rogue.log").read_text(errors="replace")
    assert "Failed to activate SuperNode" in rogue_log
    superlink_log = (engine.flwr_home / "logs" / "superlink.log").read_text(errors="replace")
    assert REFUSED in superlink_log

    out = tmp_path / "out"
    config = tiny_fedoras(
        data_cache,
        **{
            "output-dir": str(out),
            "fedoras.rounds": 1,
            "fedoras.clients-per-round": 2,
            "fedoras.finetune-clients-per-round": 2,
        },
    )
    engine.run(project_root, config, timeout=900)

    registered = set(engine.node_ids)
    assert len(registered) == 2
    listed = {int(node["node-id"]): node["status"] for node in engine.list_nodes()}
    assert set(listed) == registered and set(listed.values()) == {"online"}
    (result_file,) = out.glob("fedoras-*/result.json")
    result = json.loads(result_file.read_text())
    assert [h["round"] for h in result["history"]] == [0, 1]
    tiers = sorted(set(result["tier-of-partition"].values()))
    assert [m["tier"] for m in result["models"]] == tiers  # one searched model per tier held
    ledger = result["ledger"]
    assert {int(n) for n in ledger["profile"]["nodes"]} == registered
    for stage in ledger.values():
        assert {int(n) for n in stage["nodes"]} <= registered
    assert ledger["supernet"]["totals"]["replies"] == 2
    assert ledger["supernet"]["totals"]["failed"] == 0

    home = engine.flwr_home
    engine.stop()
    assert find_pids(flwr_home=home) == []
