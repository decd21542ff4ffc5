"""Unit tests of the pure helpers of `fedorasflwr.launch` (fast, offline, no Flower engine)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from flwr.common.config import parse_config_args

from fedorasflwr import launch
from fedorasflwr.launch import (
    Deployment,
    find_pids,
    flwr_cli,
    format_run_config,
    free_port,
    processes,
    stop_pids,
)

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


# ------------------------------------------------------------------ format_run_config


def test_format_run_config_writes_toml_literals() -> None:
    text = format_run_config({"rounds": 3, "lr": 0.1, "dp": True, "off": False, "name": "cnn_l"})
    assert text == 'rounds=3 lr=0.1 dp=true off=false name="cnn_l"'


def test_format_run_config_keeps_float_type() -> None:
    assert format_run_config({"a": 1.0, "b": 1e-5}) == "a=1.0 b=1e-05"
    assert parse_config_args([format_run_config({"a": 1.0, "b": 1e-5})]) == {"a": 1.0, "b": 1e-5}


@pytest.mark.parametrize(
    "value",
    [
        "plain",
        "with spaces and = signs",
        'double "quotes"',
        "single 'quotes'",
        "both ' and \" quotes",
        "back\\slash \\n not a newline",
        "tab\tand\nnewline",
        "/abs/path/out dir",
        "ünïcødé ✓",
        "",
    ],
)
def test_format_run_config_round_trips_through_flower_parser(value: str) -> None:
    values = {"out-dir": value, "fedoras.rounds": 5, "seed": -1}
    assert parse_config_args([format_run_config(values)]) == values


def test_format_run_config_rejects_bad_keys_and_values() -> None:
    with pytest.raises(ValueError, match="invalid config key"):
        format_run_config({"two words": 1})
    with pytest.raises(ValueError, match="invalid config key"):
        format_run_config({"k=v": 1})
    with pytest.raises(TypeError, match="must be str, int, float or bool"):
        format_run_config({"layers": [1, 2]})  # type: ignore[dict-item]


def test_format_run_config_empty() -> None:
    assert format_run_config({}) == ""


# -------------------------------------------------------------------------- ports


def test_free_port_is_bindable_on_loopback() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))


# --------------------------------------------------------------- process finding


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started by a test; killed and reaped at teardown whatever happened."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    stop_pids([process.pid for process in processes], grace=1.0)  # groups too
    for process in processes:
        process.wait()


def _wait_dead(process: subprocess.Popen[bytes], timeout: float = 10.0) -> int | None:
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def _found_once_started(expected: list[int], **query: object) -> list[int]:
    """``find_pids(**query)`` once it sees ``expected``: between fork and exec a child's
    /proc cmdline and environ are still its parent's, so a fresh Popen may not match yet."""
    deadline = time.monotonic() + 10.0
    while (found := find_pids(**query)) != expected and time.monotonic() < deadline:  # type: ignore[arg-type]
        time.sleep(0.05)
    return found


def test_find_pids_by_cmdline_marker_then_stop(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    marker = str(tmp_path / "local-superlink" / "superlink.log")
    process = subprocess.Popen([*SLEEPER, "--log-file", marker])
    spawned.append(process)
    other = subprocess.Popen(SLEEPER)
    spawned.append(other)

    found = _found_once_started([process.pid], cmdline_contains=str(tmp_path / "local-superlink"))
    assert found == [process.pid]

    stop_pids(found, grace=5.0)
    assert _wait_dead(process) is not None
    assert other.poll() is None
    assert find_pids(cmdline_contains=str(tmp_path / "local-superlink")) == []


def test_find_pids_by_flwr_home_environment(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    home = tmp_path / "home"
    env = dict(os.environ)
    for flwr_home in (home, home / "supernode-0", Path(f"{home}-other")):
        spawned.append(subprocess.Popen(SLEEPER, env=env | {"FLWR_HOME": str(flwr_home)}))

    expected = sorted(process.pid for process in spawned[:2])
    found = _found_once_started(expected, flwr_home=home)
    assert found == expected
    stop_pids(found, grace=5.0)
    assert all(_wait_dead(process) is not None for process in spawned[:2])
    assert spawned[2].poll() is None


def test_stop_pids_stops_the_whole_process_group(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    marker = str(tmp_path / "group-marker")
    # The leader of a new session starts a child (same group) that lacks the marker.
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", script, marker], stdout=subprocess.PIPE, start_new_session=True
    )
    spawned.append(leader)
    assert leader.stdout is not None
    grandchild = int(leader.stdout.readline())

    assert find_pids(cmdline_contains=marker) == [leader.pid]
    stop_pids([leader.pid], grace=5.0)
    assert _wait_dead(leader) is not None
    deadline = time.monotonic() + 5.0
    while processes._is_alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes._is_alive(grandchild)


#: a process that ignores SIGTERM and answers it by starting a child of its own session
#: (as a shutting-down Flower process may): the child inherits ``FLWR_HOME``
SPAWNS_ON_SIGTERM = (
    "import signal, subprocess, sys, time\n"
    "def on_term(*_):\n"
    "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
    " start_new_session=True)\n"
    "    print(child.pid, flush=True)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def test_stop_pids_waits_on_every_group_together_and_stops_late_children(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    home = tmp_path / "home"
    env = dict(os.environ) | {"FLWR_HOME": str(home)}
    for _ in range(3):  # three groups that each need the SIGKILL
        leader = subprocess.Popen(
            [sys.executable, "-c", SPAWNS_ON_SIGTERM],
            env=env,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        spawned.append(leader)
    for leader in spawned:
        assert leader.stdout is not None and leader.stdout.readline() == b"ready\n"

    start = time.monotonic()
    stop_pids([spawned[0].pid], grace=1.0, flwr_home=home)
    took = time.monotonic() - start
    # one grace for all three (not one each), then the late children killed with them
    assert took < 2.5, took
    assert all(_wait_dead(leader, 5.0) is not None for leader in spawned)
    assert find_pids(flwr_home=home) == []
    late = [int(line) for leader in spawned for line in leader.stdout.read().split()]
    assert len(late) >= 3 and not any(processes._is_alive(pid) for pid in late), late


def test_stop_pids_kills_a_group_whose_leader_left_first(
    spawned: list[subprocess.Popen[bytes]],
) -> None:
    # the leader ends on SIGTERM at once; its child (same group, no marker, no FLWR_HOME)
    # ignores SIGTERM: only the group's SIGKILL reaches it, after the leader is gone
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)'],"
        " stdout=subprocess.PIPE)\n"
        "child.stdout.readline()\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True
    )
    spawned.append(leader)
    assert leader.stdout is not None
    child = int(leader.stdout.readline())

    start = time.monotonic()
    stop_pids([leader.pid], grace=1.0)
    assert time.monotonic() - start < 3.0  # waited on the group, not only on its leader
    assert _wait_dead(leader) is not None
    assert not processes._is_alive(child)
    assert processes._members({leader.pid}) == []  # nobody of the group is left


def test_find_pids_never_returns_this_process() -> None:
    own_cmdline = Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode()
    assert os.getpid() not in find_pids(cmdline_contains=own_cmdline)


def test_stop_pids_ignores_vanished_processes(spawned: list[subprocess.Popen[bytes]]) -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    spawned.append(process)
    process.wait()
    stop_pids([process.pid], grace=0.1)  # must not raise


# ----------------------------------------------------------- commands and config


def test_simulation_command_carries_federation_and_run_config(tmp_path: Path) -> None:
    command = flwr_cli._run_command(
        tmp_path, "local", {"rounds": 2}, {"num-supernodes": 10, "client-resources-num-cpus": 1}
    )
    assert command[1:5] == ["run", str(tmp_path.resolve()), "local", "--stream"]
    assert command[5:] == [
        "--federation-config",
        "num-supernodes=10 client-resources-num-cpus=1",
        "--run-config",
        "rounds=2",
    ]


def test_raw_run_config_string_is_passed_through(tmp_path: Path) -> None:
    command = flwr_cli._run_command(tmp_path, "local-deployment", 'a=1 b="x y"')
    assert command[-2:] == ["--run-config", 'a=1 b="x y"']


def test_flower_env_is_offline_and_isolated(tmp_path: Path) -> None:
    env = flwr_cli._flower_env(tmp_path, {"OMP_NUM_THREADS": "1"})
    assert env["FLWR_HOME"] == str(tmp_path)
    assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)


def test_connection_is_readable_by_flower(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.cli.flower_config import read_superlink_connection

    flwr_cli._add_connection(tmp_path, "local", {"address": ":local:"})
    flwr_cli._add_connection(
        tmp_path, "local-deployment", {"address": "127.0.0.1:9", "insecure": True}
    )
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))

    connection = read_superlink_connection("local-deployment")
    assert connection.address == "127.0.0.1:9"
    assert connection.insecure is True
    assert read_superlink_connection("local").address == ":local:"
    assert read_superlink_connection(None).name == "local"  # Flower's default kept


def test_run_id_and_status_parsing() -> None:
    log = "Using SuperLink\nSuccessfully started run 1754394292\n"
    match = flwr_cli._RUN_ID_PATTERN.search(log)
    assert match is not None and match.group(1) == "1754394292"
    stdout = '🔍 Displaying...\n{"success": true, "runs": [{"status": "finished:failed"}]}'
    assert flwr_cli._parse_ls_json(stdout) == {"status": "finished:failed"}
    assert flwr_cli._parse_ls_json("not json") == {}


def test_simulation_rejects_bad_sizes_before_starting_anything(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_supernodes"):
        launch.run_simulation(tmp_path, num_supernodes=0)
    with pytest.raises(ValueError, match="client_num_cpus"):
        launch.run_simulation(tmp_path, num_supernodes=2, client_num_cpus=0.5)  # type: ignore[arg-type]


def test_deployment_rejects_inconsistent_arguments() -> None:
    with pytest.raises(ValueError, match="num_supernodes"):
        Deployment(num_supernodes=0)
    with pytest.raises(ValueError, match="node_configs"):
        Deployment(num_supernodes=2, node_configs=[{"tier": 0}])


def test_stopping_refuses_a_relative_or_empty_flower_home():
    # Path("") would make the pattern "local-superlink/": every local SuperLink on the machine
    from fedorasflwr.launch.processes import _stop_flower_processes

    for home in (Path(""), Path("flwr-home"), Path("/")):
        with pytest.raises(ValueError, match="refusing to stop"):
            _stop_flower_processes(home)
    with pytest.raises(ValueError, match="absolute"):
        find_pids(flwr_home=Path("relative"))
    with pytest.raises(ValueError, match="empty"):
        find_pids(cmdline_contains=" ")
