"""Warm ClientApps on SuperNodes an operator started (issue 44): the executor run by the
operator's one command, beside each ``flower-supernode --isolation process``.

The test starts what an operator starts, none of it through `fedorasflwr.launch.Deployment`:
a ``flower-superlink`` (plain HTTP on loopback) and two ``flower-supernode --isolation
process`` that require SuperExec auth (``--superexec-auth-secret-file``), and beside each
one the executor by Flower's documented ``flower-superexec`` command with the program
swapped (``fedorasflwr-clientapp-executor`` where installed, else ``python -m
fedorasflwr.launch.warm``), with no ``--parent-pid``. Then ``flwr run`` runs a tiny FedorAS
Stage 1 against the SuperLink. Every ClientApp message must have been handled by a process
the node's executor forked (its parent, in the ClientApp's timing log; one executor log
line per task), an executor with the wrong secret must be refused and say so, and every
process must stop on SIGTERM, the executors with exit status 0.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fedorasflwr.client_app import TIMING_LOG_ENV
from fedorasflwr.launch import LOOPBACK, find_pids, format_run_config, free_port, stop_pids
from fedorasflwr.launch.deployment import SUPEREXEC_POLL_ENV
from fedorasflwr.launch.fab import packable_app
from fedorasflwr.launch.flwr_cli import (
    _add_connection,
    _flower_env,
    _flower_tool,
    _flwr_run,
    _run_command,
)
from fedorasflwr.launch.warm import TASK_TIMING_LOG_ENV
from tests.engines.conftest import PROJECT_ROOT
from tests.runconfig import tiny_fedoras

pytestmark = pytest.mark.slow

NODES = 2
CONNECTION = "operator"
SCRIPT = Path(sys.executable).parent / "fedorasflwr-clientapp-executor"
#: the operator's command: the console script once installed (pip install), else the module
EXECUTOR = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "fedorasflwr.launch.warm"]


@dataclass
class OperatorNodes:
    """What the operator started: processes by name, with their logs under ``home/logs``."""

    home: Path
    secret: Path
    timing_log: Path
    task_log: Path
    runtime_addresses: list[str] = field(default_factory=list)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def env(self, home: Path) -> dict[str, str]:
        extra = {
            "OMP_NUM_THREADS": "1",
            TIMING_LOG_ENV: str(self.timing_log),
            TASK_TIMING_LOG_ENV: str(self.task_log),
            SUPEREXEC_POLL_ENV: "0.1",  # the SuperLink's own SuperExec (the ServerApp)
        }
        return _flower_env(home, extra)

    def start(self, name: str, command: list[str], home: Path) -> subprocess.Popen[bytes]:
        home.mkdir(parents=True, exist_ok=True)
        with (self.home / "logs" / f"{name}.log").open("wb") as sink:
            process = subprocess.Popen(
                command,
                env=self.env(home),
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes[name] = process
        return process

    def log(self, name: str) -> str:
        return (self.home / "logs" / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM every process by its PID (then SIGKILL what is left), and reap them: the
        executors first, with time to exit on a loaded machine (an interpreter that has
        imported torch takes seconds to tear down there; the 3 s default grace once
        SIGKILLed one that had already printed that it stopped), then the rest."""
        executors = [p.pid for n, p in self.processes.items() if n.startswith("executor-")]
        stop_pids(executors, grace=30.0)
        stop_pids([p.pid for p in self.processes.values()], flwr_home=self.home)
        for process in self.processes.values():
            process.wait(timeout=30)


def _wait(ready, what: str, nodes: OperatorNodes, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        dead = {n: p.returncode for n, p in nodes.processes.items() if p.poll() is not None}
        if dead or time.monotonic() > deadline:
            logs = "\n".join(f"--- {n}\n{nodes.log(n)[-2000:]}" for n in nodes.processes)
            raise AssertionError(f"gave up waiting for {what} (exited: {dead})\n{logs}")
        time.sleep(0.3)


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/health", timeout=1):
            return True
    except (urllib.error.URLError, OSError):
        return False


def _online(nodes: OperatorNodes) -> bool:
    listed = subprocess.run(
        [_flower_tool("flwr"), "supernode", "ls", CONNECTION, "--format", "json"],
        env=nodes.env(nodes.home),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    try:
        found = json.loads(listed[listed.find("{") :]).get("nodes", [])
    except json.JSONDecodeError:
        return False
    return sum(node.get("status") == "online" for node in found) >= NODES


def _executor_logs(nodes: OperatorNodes) -> str:
    return "".join(nodes.log(f"executor-{i}") for i in range(NODES))


def _executor_command(address: str, secret: Path, *extra: str) -> list[str]:
    # Flower's documented command beside a SuperNode with --isolation process, program swapped
    return [
        *EXECUTOR,
        "--insecure",
        "--plugin-type",
        "clientapp",
        "--appio-api-address",
        address,
        "--superexec-auth-secret-file",
        str(secret),
        *extra,
    ]


@pytest.fixture
def operator_nodes(tmp_path: Path) -> Iterator[OperatorNodes]:
    """A SuperLink and ``NODES`` SuperNodes requiring SuperExec auth, each with a warm
    executor started by the operator's command; all stopped by PID at teardown."""
    home = tmp_path / "flwr-home"
    (home / "logs").mkdir(parents=True)
    secret = tmp_path / "superexec.secret"
    secret.write_bytes(os.urandom(32))
    nodes = OperatorNodes(
        home=home,
        secret=secret,
        timing_log=tmp_path / "timing.jsonl",
        task_log=tmp_path / "tasks.jsonl",
    )
    try:
        port = free_port()
        superlink = [_flower_tool("flower-superlink"), "--insecure"]
        superlink += ["--disable-runtime-dependency-installation"]
        nodes.start("superlink", [*superlink, "--host", LOOPBACK, "--port", str(port)], home)
        _wait(lambda: _healthy(port), "the SuperLink's /health", nodes)
        _add_connection(home, CONNECTION, {"address": f"{LOOPBACK}:{port}", "insecure": True})
        for index in range(NODES):
            address = f"{LOOPBACK}:{free_port()}"
            host, runtime_port = address.split(":")
            config = {"partition-id": index, "num-partitions": NODES, "num-threads": 1}
            node = [_flower_tool("flower-supernode"), "--superlink", f"{LOOPBACK}:{port}"]
            node += ["--insecure", "--isolation", "process", "--host", host]
            node += ["--port", runtime_port, "--node-config", format_run_config(config)]
            node += ["--superexec-auth-secret-file", str(secret)]
            node_home = home / f"supernode-{index}"
            nodes.start(f"supernode-{index}", node, node_home)
            nodes.start(f"executor-{index}", _executor_command(address, secret), node_home)
            nodes.runtime_addresses.append(address)
        _wait(lambda: _online(nodes), f"{NODES} SuperNodes online", nodes)
        yield nodes
    finally:
        nodes.stop()


def test_operator_started_executors_serve_every_clientapp_task(
    operator_nodes: OperatorNodes, tmp_path: Path, data_cache: Path
) -> None:
    nodes = operator_nodes
    out = tmp_path / "out"
    config = tiny_fedoras(
        data_cache,
        **{
            "output-dir": str(out),
            "min-nodes": NODES,
            "fedoras.stop-after": "supernet",
            "fedoras.rounds": 1,
            "fedoras.clients-per-round": NODES,
            "fedoras.eval-every": 0,
        },
    )
    logs = [nodes.home / "logs" / f"{name}.log" for name in nodes.processes]
    with packable_app(PROJECT_ROOT) as app:
        command = _run_command(app, CONNECTION, config)
        _flwr_run(command, CONNECTION, nodes.env(nodes.home), 300, False, logs)
    (result_file,) = out.glob("fedoras-*/result.json")
    assert json.loads(result_file.read_text())["status"]["finished"] is True

    # every ClientApp message ran in a child of its node's executor, one logged task each
    executors = {nodes.processes[f"executor-{i}"].pid for i in range(NODES)}
    records = [json.loads(line) for line in nodes.timing_log.read_text().splitlines()]
    assert len(records) >= 2 * NODES  # a profile query and a Stage-1 round per node
    assert {record["ppid"] for record in records} == executors
    assert {record["partition-id"] for record in records} == set(range(NODES))
    forked = re.findall(r"\[warm\] task \d+ of run \d+: process (\d+)", _executor_logs(nodes))
    assert sorted(int(pid) for pid in forked) == sorted(record["pid"] for record in records)
    for index in range(NODES):
        assert "signed AcquireTask" in nodes.log(f"executor-{index}")

    # each executor installed the FAB and imported the app in its first task only: its
    # later tasks forked with the app imported from that FAB's directory under the node's
    # FLWR_HOME (the next round's message waits for every node's reply, so the first task
    # has ended by then), and every task's app is the FAB's copy, never the executor's own
    tasks = {t["pid"]: t for t in map(json.loads, nodes.task_log.read_text().splitlines())}
    assert set(tasks) == {record["pid"] for record in records}
    for index in range(NODES):
        executor = nodes.processes[f"executor-{index}"].pid
        mine = [r for r in records if r["ppid"] == executor]
        mine.sort(key=lambda r: tasks[r["pid"]]["forked"])
        steps = [tasks[r["pid"]] for r in mine]
        assert [(t["fab_reused"], t["app_kept"]) for t in steps] == [(False, False)] + [
            (True, True)
        ] * (len(steps) - 1), steps
        assert "imported for the next tasks" in nodes.log(f"executor-{index}")
        for record in mine:
            where = Path(record["app-file"]).relative_to(nodes.home / f"supernode-{index}")
            assert where.parts[0] == "apps", record["app-file"]

    # the SuperNode refuses an executor without its secret, which stops and says why
    wrong = tmp_path / "wrong.secret"
    wrong.write_bytes(b"not the secret")
    refused = subprocess.run(
        _executor_command(nodes.runtime_addresses[0], wrong, "--preload", ""),
        env=nodes.env(nodes.home / "supernode-0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "refused this executor's SuperExec auth" in refused.stderr

    # SIGTERM by PID stops everything; the executors (no --parent-pid) exit cleanly
    nodes.stop()
    for index in range(NODES):
        executor = nodes.processes[f"executor-{index}"]
        assert executor.returncode == 0, nodes.log(f"executor-{index}")
        assert "[warm] stopped after" in nodes.log(f"executor-{index}")
    assert find_pids(flwr_home=nodes.home) == []
