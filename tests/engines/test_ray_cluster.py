"""The simulation engine on a Ray cluster it did not start (docs/scaling.md), and the
suite's DP-FNAS run on the simulation engine (the same run).

A Ray head is started here with ``ray start --head`` on loopback, in a temporary
directory and a session of its own; the app runs through it with ``ray_address``; the
head is stopped by its process group (the ``ray start`` process's PID), and the test
checks that nothing of it is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedorasflwr.launch import find_pids, run_simulation
from fedorasflwr.launch.processes import _free_ports
from fedorasflwr.launch.simulation import RAY_CLUSTER_ENV, ray_env

PROJECT_ROOT = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).parent / "ray"


@dataclass(frozen=True)
class RayHead:
    address: str
    temp_dir: Path
    pgid: int

    def actor_logs(self, name: str) -> list[Path]:
        """The worker logs of the actors called ``name`` that ran on this cluster."""
        logs = self.temp_dir / "session_latest" / "logs"
        return [
            path
            for path in sorted(logs.glob("worker-*.out"))
            if f":actor_name:{name}" in path.read_text(errors="replace")
        ]


def _group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid and _alive(int(entry.name)):
                    found.append(int(entry.name))
            except ProcessLookupError:
                continue
    return found


def _alive(pid: int) -> bool:
    try:  # a zombie (exited, not yet reaped by its parent) no longer runs
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.fixture
def ray_head() -> Iterator[RayHead]:
    """A 2-CPU Ray head on 127.0.0.1 (every port it serves on loopback), stopped after."""
    # Unix socket paths are limited to 107 bytes: a short directory, not pytest's tmp_path.
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    gcs_port, client_port = _free_ports(2)
    # the actors are the head's workers and inherit its environment, not the run's: the
    # nodes' cache (their latency tables) in the head's directory, not the user's
    env = {
        **os.environ,
        RAY_CLUSTER_ENV: "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "FEDORASFLWR_CACHE": str(temp_dir / "node-cache"),
    }
    command = [
        str(RAY), "start", "--head",
        "--node-ip-address=127.0.0.1", f"--port={gcs_port}",
        f"--ray-client-server-port={client_port}",
        f"--temp-dir={temp_dir}", "--num-cpus=2",
        "--include-dashboard=false", "--disable-usage-stats",
    ]  # fmt: skip
    # A session of its own: every daemon `ray start` leaves shares its process group.
    starter = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=600, start_new_session=True
    )
    output = starter.stdout[-2000:] + starter.stderr[-2000:]
    try:
        pgid = _session_pgid(temp_dir)
    except AssertionError:
        subprocess.run(["rm", "-rf", str(temp_dir)], check=False)
        raise AssertionError(f"`ray start --head` did not start a head: {output}") from None
    try:
        assert starter.returncode == 0, output
        yield RayHead(f"127.0.0.1:{gcs_port}", temp_dir, pgid)
    finally:
        _stop_group(pgid)
        assert not _group(pgid), "Ray processes left after stopping the head"
        subprocess.run(["rm", "-rf", str(temp_dir)], check=False)


def _session_pgid(temp_dir: Path) -> int:
    """The process group of the head's daemons: that of its GCS server (found by its
    log directory, which lies in ``temp_dir``)."""
    for pid in find_pids(cmdline_contains=str(temp_dir)):
        if "gcs_server" in _cmdline(pid):
            return os.getpgid(pid)
    raise AssertionError(f"no Ray GCS server with its logs in {temp_dir}")


def _stop_group(pgid: int) -> None:
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _group(pgid):
            time.sleep(0.2)
        if not _group(pgid):
            return


#: the suite's DP-FNAS run on the simulation engine (tiny, but the real app end to end), by
#: latency: each party times its table; a budget above every genotype
DPFNAS = {
    "method": "dpfnas",
    "onnx": False,
    "data.partitioner": "iid",
    "space.width": 0.25,
    "space.layers-per-block": 2,
    "dpfnas.iterations": 1,
    "dpfnas.batch-size": 8,
    "dpfnas.eval-every": 0,
    "dpfnas.final-rounds": 1,
    "dpfnas.resource": "latency",
    "dpfnas.latency-budget-ms": 1000.0,
    "latency.repeats": 1,
    "latency.warmup": 0,
    "latency.validation-paths": 2,
}


@pytest.mark.slow
def test_a_simulation_runs_its_clientapps_on_a_running_ray_cluster(
    ray_head: RayHead, tmp_path: Path, data_cache: Path
) -> None:
    # One engine run serves two claims: the simulation joins a Ray cluster it did not start,
    # and DP-FNAS runs whole on the simulation engine (this was test_dpfnas_engine.py's
    # run on a Ray instance of the simulation's own, until issue 44's cut: where Ray runs
    # its actors is not DP-FNAS's concern, and every other engine test starts its own Ray).
    home, out = tmp_path / "flwr-home", tmp_path / "out"
    run_config = {**DPFNAS, "output-dir": str(out), "data.cache-dir": str(data_cache)}
    result = run_simulation(
        PROJECT_ROOT,
        num_supernodes=2,
        run_config=run_config,
        flwr_home=home,
        client_num_cpus=1,
        env={"OMP_NUM_THREADS": "1"},
        timeout=900,
        ray_address=ray_head.address,
    )
    assert result.status == "finished:completed"
    # The ClientApps ran as actors of the head's raylet (2 CPUs, 1 per ClientApp), not
    # in a Ray instance of the simulation's own.
    actors = ray_head.actor_logs("ClientAppActor")
    assert 1 <= len(actors) <= 2, actors
    # The head outlives the run: the cluster is the user's, not the launcher's.
    assert any("gcs_server" in _cmdline(pid) for pid in _group(ray_head.pgid))
    assert find_pids(flwr_home=home) == []
    check_dpfnas_result(out)
    # each party timed its table on the head's workers, into the head's node cache
    assert list((ray_head.temp_dir / "node-cache" / "latency").glob("*.json"))


def check_dpfnas_result(out: Path) -> None:
    """What DP-FNAS's engine run wrote: one iteration of the noised search by latency, both
    parties' privacy, every stage's client FLOPs booked, the derived net trained."""
    results = list(out.glob("dpfnas-*/result.json"))
    assert len(results) == 1, results
    result = json.loads(results[0].read_text())
    assert result["iterations"] == 1 and result["stopped"] == "completed"
    assert len(result["privacy"]) == 2
    assert result["noise"]["private_against_server"] is True  # OS-CSPRNG noise by default
    assert all(0 < party["epsilon"] < 100 for party in result["privacy"])
    assert 0.0 <= result["test_accuracy"] <= 1.0
    assert result["ledger"]["weights"]["totals"]["replies"] == 2
    # every stage's client training FLOPs crossed the engine and were booked
    assert all(
        result["ledger"][s]["totals"]["train_flops"] > 0 for s in ("weights", "arch", "final")
    )
    assert {"supernet.pt", "derived.pt"} <= set(result["files"])
    tables = result["latency_tables"]
    assert [n["partition_id"] for n in tables["nodes"]] == [0, 1]
    assert 0 < result["latency"]["predicted_ms"] <= result["latency"]["budget_ms"] == 1000.0
    assert result["ledger"]["latency"]["totals"]["replies"] == 2


def test_ray_addresses_are_checked_and_loopback_kept() -> None:
    assert ray_env("10.0.0.5:6379") == {"RAY_ADDRESS": "10.0.0.5:6379"}
    assert ray_env("127.0.0.1:6379") == {"RAY_ADDRESS": "127.0.0.1:6379", RAY_CLUSTER_ENV: "0"}
    for bad in ("10.0.0.5", ":6379", "host:port", "host:70000"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            ray_env(bad)


def test_cluster_resources_are_not_set_by_the_run(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="init-args-num-cpus=4.*declare their own resources"):
        run_simulation(
            PROJECT_ROOT,
            num_supernodes=2,
            federation_config={"init-args-num-cpus": 4},
            flwr_home=tmp_path,
            ray_address="127.0.0.1:6379",
        )


def test_the_launcher_refuses_a_bad_ray_address_or_one_with_deployment(capsys) -> None:
    from fedorasflwr.launch import cli

    assert cli._parse_args(["--ray-address", "127.0.0.1:6379"]).ray_address == "127.0.0.1:6379"
    for argv, said in (
        (["--ray-address", "headnode"], "ray_address='headnode': expected HOST:PORT"),
        (["--ray-address", "127.0.0.1:6379", "--deployment"], "not --deployment"),
    ):
        with pytest.raises(SystemExit):
            cli._parse_args(argv)
        assert said in capsys.readouterr().err
