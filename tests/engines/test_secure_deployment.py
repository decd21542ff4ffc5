"""Secure deployment: certificates, keys and launcher flags (fast), and a whole tiny
FedorAS run over TLS with authenticated SuperNodes where an unregistered SuperNode is
refused and a registered one is killed mid-round (slow: the session's one deployment run,
``secure_deployment_run`` in tests/engines/conftest.py, which every test of the
deployment engine's app run asserts on, so they all live in this module)."""

from __future__ import annotations

import urllib.error
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
    load_ssh_public_key,
)

from fedorasflwr.launch import (
    Deployment,
    TlsFiles,
    make_node_key,
    make_tls_files,
)
from fedorasflwr.launch.cli import _parse_args
from fedorasflwr.launch.security import node_key
from tests.engines.conftest import NODE_CONFIGS

REFUSED = "No SuperNode found with the given public key"


# ------------------------------------------------------------------ fast: files and flags


def by_node(stage: dict) -> dict[int, dict[str, int]]:
    """Node id -> counters of one stage of result.json's ledger (by partition there; each
    partition held by one node in these runs)."""
    nodes = {int(n): counters for n, counters in stage.get("unprofiled", {}).items()}
    for entry in stage["partitions"].values():
        (node,) = entry["node_ids"]
        nodes[node] = {k: v for k, v in entry.items() if k != "node_ids"}
    return nodes


def test_throwaway_certificate_is_signed_by_the_ca_for_localhost(tmp_path):
    tls = make_tls_files(tmp_path / "certs")
    ca = x509.load_pem_x509_certificate(tls.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(tls.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    key = load_pem_private_key(tls.server_key.read_bytes(), None)
    assert key.public_key() == server.public_key()
    assert tls.server_key.stat().st_mode & 0o077 == 0  # private: owner only


def test_node_key_is_an_openssh_p384_pair(tmp_path):
    pair = make_node_key(tmp_path, "node-0")
    public = load_ssh_public_key(pair.public_key.read_bytes())
    assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp384r1"
    assert pair.private_key.stat().st_mode & 0o077 == 0
    again = node_key(pair.private_key, tmp_path / "derived")  # a key the user brings
    assert again.public_key.read_bytes() == pair.public_key.read_bytes()


def test_keys_flower_cannot_use_are_refused_with_the_fix(tmp_path):
    garbage = tmp_path / "garbage"
    garbage.write_text("not a key")
    with pytest.raises(ValueError, match="not an unencrypted OpenSSH private key.*ssh-keygen"):
        node_key(garbage, tmp_path)
    edwards = tmp_path / "ed"
    edwards.write_bytes(
        ed25519.Ed25519PrivateKey.generate().private_bytes(
            Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()
        )
    )
    with pytest.raises(ValueError, match="Ed25519PrivateKey; Flower needs an EC key"):
        node_key(edwards, tmp_path)
    with pytest.raises(FileNotFoundError, match="TLS server key .*missing"):
        TlsFiles(garbage, garbage, tmp_path / "missing").check()


def test_deployment_refuses_contradictory_security(tmp_path):
    tls = TlsFiles(tmp_path / "a", tmp_path / "b", tmp_path / "c")
    with pytest.raises(ValueError, match="insecure=True turns TLS .* off"):
        Deployment(num_supernodes=2, insecure=True, tls=tls)
    with pytest.raises(ValueError, match="node_keys has 1 keys for 2 supernodes"):
        Deployment(num_supernodes=2, node_keys=[tmp_path / "k"])
    with pytest.raises(ValueError, match="supernode_auth=False"):
        Deployment(num_supernodes=1, supernode_auth=False, node_keys=[tmp_path / "k"])


def test_launcher_security_flags(tmp_path, capsys):
    files = [str(tmp_path / n) for n in ("ca.crt", "server.pem", "server.key")]
    args = _parse_args(
        ["--deployment", "--num-supernodes", "1", "--ca-cert", files[0], "--server-cert"]
        + [files[1], "--server-key", files[2], "--supernode-key", str(tmp_path / "k")]
    )
    assert args.tls == TlsFiles(*map(Path, files)) and args.supernode_key == [tmp_path / "k"]
    assert not args.insecure and _parse_args(["--deployment"]).tls is None  # throwaway
    assert _parse_args(["--deployment", "--insecure"]).insecure
    bad = [
        (["--insecure"], "need --deployment"),
        (["--deployment", "--ca-cert", files[0]], "needs --ca-cert, --server-cert and"),
        (["--deployment", "--insecure", "--no-supernode-auth"], "--insecure turns TLS"),
        (["--deployment", "--supernode-key", "k"], "1 --supernode-key for --num-supernodes 20"),
    ]
    for argv, message in bad:
        with pytest.raises(SystemExit):
            _parse_args(argv)
        assert message in capsys.readouterr().err


# ------------------------------------------------------------------ slow: a whole run


@pytest.mark.slow
def test_tls_run_with_registered_supernodes_refuses_an_unregistered_one(secure_deployment_run):
    done = secure_deployment_run  # the session's one deployment run (tests/engines/conftest.py)
    superlink = done.superlink_args
    assert "--insecure" not in superlink and "--enable-supernode-auth" in superlink
    assert superlink[superlink.index("--ssl-certfile") + 1] == str(done.tls.server_cert)
    for args in done.supernode_args:
        assert "--insecure" not in args and str(done.tls.ca_cert) in args

    # The port speaks TLS only, with a certificate the CA vouches for.
    assert isinstance(done.http_error, (urllib.error.URLError, ConnectionError))
    assert isinstance(done.https_error, urllib.error.URLError)
    assert "CERTIFICATE_VERIFY_FAILED" in str(done.https_error)

    # A SuperNode with a key nobody registered: refused at sign-in, it exits.
    assert done.rogue_exit not in (None, 0)
    assert "Failed to activate SuperNode" in done.rogue_log
    assert REFUSED in done.superlink_log

    registered = set(done.node_ids)
    assert len(registered) == 3
    assert set(done.listed) == registered
    assert {done.listed[n] for n in registered - {done.victim_id}} == {"online"}
    result = done.result
    assert [h["round"] for h in result["history"]] == [0, 1]
    # A model per tier that some client can run: tiers 1 .. the highest held.
    highest = max(result["tier_of_partition"].values())
    assert [m["tier"] for m in result["models"]] == list(range(1, highest + 1))
    assert all(0.0 <= m["test"]["accuracy"] <= 1.0 for m in result["models"])
    ledger = result["ledger"]
    assert set(by_node(ledger["profile"])) == registered
    for stage in ledger.values():
        assert set(by_node(stage)) <= registered
    assert ledger["supernet"]["totals"]["replies"] == 2
    assert ledger["supernet"]["totals"]["failed"] == 1  # the killed node's, below
    assert done.left_running == []


def test_relative_certificate_and_key_paths_are_made_absolute():
    # Flower's config.toml refuses a relative root-certificates path (seen: the launcher
    # failed to register keys when given certs/ca.crt).
    engine = Deployment(
        num_supernodes=1,
        tls=TlsFiles(Path("ca.crt"), Path("server.pem"), Path("server.key")),
        node_keys=[Path("node-0")],
    )
    assert engine.tls is not None and engine.tls.ca_cert == Path.cwd() / "ca.crt"
    assert engine._given_keys == [Path.cwd() / "node-0"]


@pytest.mark.slow
def test_deployment_engine_runs_the_same_app(secure_deployment_run):
    # The session's one deployment run (TLS and SuperNode authentication, as `Deployment`
    # starts by default), shared with the security test above: three SuperNodes (one
    # killed mid-round), one Stage-1 round, then Stages 2 and 3 for two tiers, each
    # message in its own ClientApp process.
    result = secure_deployment_run.result
    assert [h["round"] for h in result["history"]] == [0, 1]
    assert result["history"][1]["clients"] == 2
    assert result["ledger"]["supernet"]["totals"]["replies"] == 2
    assert [m["tier"] for m in result["models"]] == [1, 2]
    assert "=== fedoras summary ===" in secure_deployment_run.run.stdout
    assert secure_deployment_run.left_running == []
    # Every message's ClientApp was forked by its node's warm executor (TLS and SuperNode
    # authentication on): one process per message, none started by Flower's SuperExec.
    timings, warm = secure_deployment_run.timings, secure_deployment_run.warm_pids
    assert len(warm) == 3 and len(timings) >= 3 + 2  # profile queries, Stage-1 replies
    assert {record["ppid"] for record in timings} <= set(warm)
    assert len({record["pid"] for record in timings}) == len(timings)
    # each imported the app from its node's FAB, not the executor's (or this) copy
    home = secure_deployment_run.flwr_home
    for record in timings:
        where = Path(record["app-file"]).relative_to(home).parts
        assert where[0].startswith("supernode-") and where[1] == "apps", record["app-file"]


@pytest.mark.slow
def test_supernodes_measure_their_tables_and_their_budgets_place_them(secure_deployment_run):
    # Latency as FedorAS's resource on the deployment engine (the same shared run): each
    # SuperNode times its own table, its node config's budget places it in a tier.
    done = secure_deployment_run
    result = done.result
    assert result["resource"] == "latency"
    # budget 1e6 ms: top; 1e-6: lowest
    assert result["tier_of_partition"] == {"0": 2, "1": 1, "2": 2}
    nodes = {n["partition_id"]: n for n in result["latency_tables"]["nodes"]}
    assert sorted(nodes) == [0, 1, 2]
    for pid, config in enumerate(NODE_CONFIGS):
        assert nodes[pid]["device_class"] == config["device-class"]
        assert nodes[pid]["latency_budget_ms"] == config["latency-budget-ms"]
        assert 0 < nodes[pid]["min_path_ms"] <= nodes[pid]["max_path_ms"]
        assert nodes[pid]["validation"]["paths"] == 4
    tiers = result["tiers"]
    assert all(t["low"] < t["high"] for t in tiers) and tiers[-1]["high"] < 1.0e6
    for model in result["models"]:
        assert model["latency_ms"] > 0 and model["flops"] > 0
    assert result["ledger"]["latency"]["totals"]["replies"] == 3
    watch = done.node_ids[1]
    assert f"node {watch}: latency-budget-ms = 1e-06 is below every tier" in done.run.stdout


@pytest.mark.slow
def test_a_supernode_killed_mid_round_is_booked_once_to_itself(secure_deployment_run):
    # The same shared run: the last SuperNode was killed (with its running ClientApp) when
    # its Stage-1 message arrived. The run completes on the others, and the ledger books
    # the lost message once, to the killed node, as lost; no phantom node.
    done = secure_deployment_run
    assert done.victim_killed and done.victim_exit is not None
    victim_id = done.victim_id
    result = done.result
    ledger = result["ledger"]
    nodes = set(done.node_ids)
    assert set(by_node(ledger["profile"])) == nodes
    for name, stage in ledger.items():
        assert set(by_node(stage)) <= nodes, f"phantom node in {name}"
    supernet = by_node(ledger["supernet"])[victim_id]
    assert (supernet["messages"], supernet["replies"], supernet["failed"]) == (1, 0, 1)
    # Lost, not timed out: the SuperLink gives up on a silent node after ~60 s (two missed
    # 30-s heartbeats) and answers NODE_UNAVAILABLE, well before the 240-s reply timeout.
    assert (supernet["lost"], supernet["timed_out"], supernet["error_replies"]) == (1, 0, 0)
    assert ledger["supernet"]["totals"]["replies"] == 2
    # Booked once: each failed message once, to the victim, split by kind; no one else fails.
    for name, stage in ledger.items():
        for node, costs in by_node(stage).items():
            kinds = costs["lost"] + costs["timed_out"] + costs["error_replies"]
            assert costs["failed"] == kinds, (name, node, costs)
            unanswered = costs["messages"] - costs["replies"]
            if int(node) == victim_id:
                assert costs["failed"] == unanswered and costs["error_replies"] == 0
            else:
                assert costs["failed"] == 0, (name, node, costs)
        assert stage["totals"]["failed"] == by_node(stage).get(victim_id, {}).get("failed", 0)
    assert [h["round"] for h in result["history"]] == [0, 1]
    assert f"[supernet] node {victim_id} lost: error code 5" in done.run.stdout
    assert "node 1 " not in done.run.stdout  # the SuperLink's own id never stands for a node
