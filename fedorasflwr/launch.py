"""Run this Flower app on a real engine (simulation or local deployment) and clean up.

The one implementation of "start Flower, run the app, stop everything", used by the
README's run command (``python -m fedorasflwr.launch``), the engine tests and the
benchmarks.

Facts about Flower 1.41 this module relies on:

- ``flwr run <app> --stream`` with the ``:local:`` connection starts a *detached*
  ``flower-superlink --simulation`` on ``$FLWR_LOCAL_SUPERLINK_HTTP_API_PORT`` (one HTTP
  port for the Control, Fleet and Runtime APIs) and leaves it running. It logs to
  ``$FLWR_HOME/local-superlink/superlink.log``; its ``flower-superexec`` child runs in a
  session of its own and starts ``flwr-simulation`` (Ray) or ``flwr-serverapp``. All of
  them inherit the environment of ``flwr run``, so they are found by their ``FLWR_HOME``.
- ``flwr run --stream`` exits with 0 even when the ServerApp raised; the run's status
  (``finished:completed`` / ``finished:failed`` and details) comes from
  ``flwr ls --run-id <id> --format json``.
- Unless ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` (or
  ``--disable-runtime-dependency-installation``) reaches the SuperLink, every run
  builds a fresh environment with ``uv sync`` and downloads all dependencies.
  SuperNodes install nothing unless given ``--allow-runtime-dependency-installation``.
  Both engines unpack the FAB under ``$FLWR_HOME/apps`` and import the app from there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

import tomli_w

__all__ = [
    "DEPLOYMENT_CONNECTION",
    "ConfigValue",
    "Deployment",
    "FlowerRunError",
    "RunResult",
    "find_pids",
    "format_run_config",
    "free_port",
    "main",
    "run_simulation",
    "stop_pids",
]

ConfigValue = str | int | float | bool
LOOPBACK = "127.0.0.1"
SIMULATION_CONNECTION = "local"
DEPLOYMENT_CONNECTION = "local-deployment"
QUIET_FLOWER_ENV = {
    "FLWR_DISABLE_UPDATE_CHECK": "1",  # no network look-up at every process start
    "FLWR_TELEMETRY_ENABLED": "0",  # no telemetry (and its exit timeout) per process
}
_KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_RUN_ID_PATTERN = re.compile(r"Successfully started run (\d+)")
_ANSI_PATTERN = re.compile(r"\x1b\[[0-9;]*m")
_TAIL_LINES = 60


class FlowerRunError(RuntimeError):
    """A Flower run did not start, did not finish in time, or finished as failed."""


@dataclass(frozen=True)
class RunResult:
    """Outcome of a completed run (field names follow `subprocess.CompletedProcess`).

    Attributes
    ----------
    run_id : int
        The SuperLink's run id.
    status : str
        Flower's run status, ``"finished:completed"`` for a run returned here.
    returncode : int
        Exit code of ``flwr run --stream``.
    stdout : str
        The streamed run log (stdout and stderr, colour codes removed).
    wall_time : float
        Seconds from launching ``flwr run`` to its exit.
    """

    run_id: int
    status: str
    returncode: int
    stdout: str
    wall_time: float


# --------------------------------------------------------------------- pure helpers


def format_run_config(values: Mapping[str, ConfigValue]) -> str:
    """Format key/values as one ``--run-config`` / ``--node-config`` string.

    Parameters
    ----------
    values : Mapping[str, str | int | float | bool]
        Keys are bare TOML keys, dotted for sub-tables (``fedoras.rounds``).

    Returns
    -------
    str
        ``'k1=1 k2="s" k3=true'``: TOML literals separated by spaces. Strings use TOML
        basic strings with ``"`` written as ``\\u0022``, because Flower splits the
        argument with a regex that ends a quoted value at the next ``"``.

    Raises
    ------
    ValueError
        For a key that is not a bare (dotted) TOML key.
    TypeError
        For a value that is not a str, int, float or bool.
    """
    return " ".join(f"{_check_key(key)}={_toml_literal(value)}" for key, value in values.items())


def _check_key(key: str) -> str:
    if not _KEY_PATTERN.fullmatch(key):
        raise ValueError(f"invalid config key {key!r}: use letters, digits, '-', '_' and '.'")
    return key


def _toml_literal(value: ConfigValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # 0.1, 1e-05, inf, nan are all TOML floats
    if isinstance(value, str):
        return '"' + "".join(_escape_char(char) for char in value) + '"'
    raise TypeError(f"config value {value!r} must be str, int, float or bool")


def _escape_char(char: str) -> str:
    if char == "\\":
        return "\\\\"
    if char == '"' or ord(char) < 0x20 or ord(char) == 0x7F:
        return f"\\u{ord(char):04x}"
    return char


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _free_ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


# ------------------------------------------------------------------ process control


def find_pids(*, cmdline_contains: str | None = None, flwr_home: Path | None = None) -> list[int]:
    """Find processes by a command-line substring or by their ``FLWR_HOME``.

    Parameters
    ----------
    cmdline_contains : str, optional
        Match processes whose command line contains this text (e.g. a log-file path).
    flwr_home : Path, optional
        Match processes started with ``FLWR_HOME`` equal to this directory or one
        below it; Flower's children inherit it, detached or not.

    Returns
    -------
    list[int]
        Sorted PIDs, never this process nor one of its ancestors.
    """
    spared = _ancestors(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        if _matches(entry, cmdline_contains, flwr_home):
            found.append(int(entry.name))
    return sorted(found)


def _matches(proc_dir: Path, cmdline_contains: str | None, flwr_home: Path | None) -> bool:
    try:
        if cmdline_contains and cmdline_contains in _cmdline(proc_dir):
            return True
        if flwr_home is not None:
            home = f"FLWR_HOME={flwr_home}"
            return any(item == home or item.startswith(home + "/") for item in _environ(proc_dir))
    except OSError:  # process gone, or not ours to read
        return False
    return False


def _cmdline(proc_dir: Path) -> str:
    return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def _environ(proc_dir: Path) -> list[str]:
    return (proc_dir / "environ").read_bytes().decode(errors="replace").split("\0")


def _ancestors(pid: int) -> set[int]:
    chain = {pid}
    while pid > 1:
        pid = _parent_pid(pid)
        chain.add(pid)
    return chain


def _parent_pid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def _is_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _signal(pid: int, signum: signal.Signals) -> None:
    """Signal the process group `pid` leads (else `pid` alone), never our own group."""
    try:
        if os.getpgid(pid) == pid and pid != os.getpgrp():
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def stop_pids(pids: Iterable[int], *, grace: float = 10.0) -> None:
    """SIGTERM the processes (their groups when they lead one), wait, SIGKILL leftovers.

    Parameters
    ----------
    pids : Iterable[int]
        Processes to stop.
    grace : float, default 10.0
        Seconds to wait after SIGTERM before SIGKILL.
    """
    targets = [pid for pid in pids if _is_alive(pid)]
    for pid in targets:
        _signal(pid, signal.SIGTERM)
    pending = targets
    deadline = time.monotonic() + grace
    while pending and time.monotonic() < deadline:
        time.sleep(0.1)
        pending = [pid for pid in pending if _is_alive(pid)]
    for pid in pending:
        _signal(pid, signal.SIGKILL)
    _wait_reaped(targets, timeout=2.0)


def _wait_reaped(pids: Iterable[int], timeout: float) -> None:
    """Wait until the processes are gone from /proc (zombies reaped), except our children."""
    ours = os.getpid()
    pids = [pid for pid in pids if _parent_pid(pid) != ours]
    deadline = time.monotonic() + timeout
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)


def _stop_flower_processes(flwr_home: Path, *, grace: float = 10.0) -> None:
    """Stop everything Flower started under `flwr_home`, children spawned late included."""
    log_dir = str(flwr_home / "local-superlink") + os.sep
    for _ in range(5):
        pids = find_pids(cmdline_contains=log_dir, flwr_home=flwr_home)
        if not pids:
            return
        stop_pids(pids, grace=grace)


# ---------------------------------------------------------------------- flwr CLI


def _flower_env(flwr_home: Path, extra: Mapping[str, str] | None) -> dict[str, str]:
    """Environment for Flower processes: quiet, offline, no per-run installs."""
    env = QUIET_FLOWER_ENV | dict(os.environ) | dict(extra or {})
    env["FLWR_HOME"] = str(flwr_home)
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    bin_dir = str(Path(sys.executable).parent)  # flwr spawns its tools via PATH
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    return env


def _flower_tool(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def _add_connection(flwr_home: Path, name: str, connection: Mapping[str, object]) -> None:
    """Add or replace ``[superlink.<name>]`` in ``$FLWR_HOME/config.toml``."""
    from flwr.cli.constant import DEFAULT_FLOWER_CONFIG_TOML

    path = flwr_home / "config.toml"
    text = path.read_text() if path.exists() else DEFAULT_FLOWER_CONFIG_TOML
    config = tomllib.loads(text)
    config.setdefault("superlink", {})[name] = dict(connection)
    flwr_home.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(config))


def _tail(text: str, lines: int = _TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _file_tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return f"--- {path} ---\n{_tail(_ANSI_PATTERN.sub('', text), lines)}"


def _stream_command(
    command: Sequence[str], env: Mapping[str, str], timeout: float | None, echo: bool
) -> tuple[int | None, str, float]:
    """Run `command`, collecting (and optionally echoing) its output.

    Returns ``(returncode, output, seconds)``; the return code is None when the
    command was killed after `timeout` seconds.
    """
    start = time.monotonic()
    process = subprocess.Popen(
        command,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,  # Ctrl-C reaches us only; we stop it ourselves
    )
    lines: list[str] = []
    reader = threading.Thread(target=_collect, args=(process.stdout, lines, echo), daemon=True)
    reader.start()
    returncode: int | None = None
    try:
        returncode = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if process.poll() is None:  # timeout, KeyboardInterrupt or another error
            stop_pids([process.pid], grace=5.0)
            process.wait()
        reader.join(timeout=5.0)
    return returncode, "".join(lines), time.monotonic() - start


def _collect(stream: IO[str], lines: list[str], echo: bool) -> None:
    for line in stream:
        if echo:
            sys.stdout.write(line)
            sys.stdout.flush()
        lines.append(_ANSI_PATTERN.sub("", line))


def _run_status(connection: str, run_id: int, env: Mapping[str, str]) -> tuple[str, str]:
    """Return ``(status, details)`` of a run, waiting up to 30 s for it to finish."""
    command = [_flower_tool("flwr"), "ls", connection, "--run-id", str(run_id), "--format", "json"]
    deadline = time.monotonic() + 30.0
    while True:
        result = subprocess.run(command, env=dict(env), capture_output=True, text=True, timeout=60)
        run = _parse_ls_json(result.stdout)
        status = str(run.get("status", "unknown"))
        if status.startswith("finished") or time.monotonic() > deadline:
            return status, str(run.get("status-details", result.stderr.strip()))
        time.sleep(0.5)


def _parse_ls_json(stdout: str) -> dict[str, object]:
    try:
        payload = json.loads(stdout[stdout.find("{") :])
    except json.JSONDecodeError:
        return {}
    runs = payload.get("runs") or [{}]
    return dict(runs[0])


def _flwr_run(
    command: Sequence[str],
    connection: str,
    env: Mapping[str, str],
    timeout: float | None,
    echo: bool,
    log_files: Sequence[Path] = (),
) -> RunResult:
    """Run a ``flwr run ... --stream`` command and check the run finished as completed."""
    returncode, output, wall_time = _stream_command(command, env, timeout, echo)
    match = _RUN_ID_PATTERN.search(output)
    run_id = int(match.group(1)) if match else None
    logs = "\n".join(_file_tail(path, 20) for path in log_files)
    if returncode is None:
        if run_id is not None:
            _stop_run(connection, run_id, env)
        raise FlowerRunError(f"run {run_id} timed out after {timeout}s:\n{_tail(output)}\n{logs}")
    if returncode != 0 or run_id is None:
        raise FlowerRunError(
            f"`flwr run` failed to start the run (exit code {returncode}):\n{_tail(output)}"
        )
    status, details = _run_status(connection, run_id, env)
    if status != "finished:completed":
        raise FlowerRunError(
            f"run {run_id} ended as {status!r}: {details}\n{_tail(output)}\n{logs}".rstrip()
        )
    return RunResult(run_id, status, returncode, output, wall_time)


def _stop_run(connection: str, run_id: int, env: Mapping[str, str]) -> None:
    command = [_flower_tool("flwr"), "stop", str(run_id), connection]
    subprocess.run(command, env=dict(env), capture_output=True, timeout=60, check=False)


def _run_command(
    app_dir: Path,
    connection: str,
    run_config: Mapping[str, ConfigValue] | str | None,
    federation_config: Mapping[str, ConfigValue] | None = None,
) -> list[str]:
    command = [_flower_tool("flwr"), "run", str(Path(app_dir).resolve()), connection, "--stream"]
    if federation_config:
        command += ["--federation-config", format_run_config(federation_config)]
    if run_config:
        text = run_config if isinstance(run_config, str) else format_run_config(run_config)
        command += ["--run-config", text]
    return command


# -------------------------------------------------------------------- simulation


def run_simulation(
    app_dir: Path,
    *,
    num_supernodes: int,
    run_config: Mapping[str, ConfigValue] | str | None = None,
    flwr_home: Path | None = None,
    client_num_cpus: int | None = None,
    federation_config: Mapping[str, ConfigValue] | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    echo: bool = False,
) -> RunResult:
    """Run the Flower app in `app_dir` on the simulation engine, then stop all of Flower.

    Runs ``flwr run <app_dir> local --stream --federation-config "num-supernodes=N ..."``
    against a local SuperLink on free loopback ports, checks the run's final status
    and always stops that SuperLink and its children (also on error, timeout and
    KeyboardInterrupt).

    Parameters
    ----------
    app_dir : Path
        Directory holding the app's ``pyproject.toml``.
    num_supernodes : int
        Number of simulated SuperNodes.
    run_config : Mapping or str, optional
        Run-config overrides (a mapping, or a ready ``"k=v ..."`` string).
    flwr_home : Path, optional
        ``FLWR_HOME`` to use and keep; default: a temporary directory, removed afterwards.
        Every Flower process using it is stopped at the end: pass a dedicated one.
    client_num_cpus : int, optional
        CPUs Ray reserves per ClientApp (Flower's default: 2; Flower 1.41 takes whole
        CPUs only). ClientApps running at once = Ray's CPUs // this; raise Ray's
        logical CPU count with ``federation_config={"init-args-num-cpus": n}``.
    federation_config : Mapping, optional
        Further ``--federation-config`` keys, e.g. ``init-args-num-cpus`` (CPUs Ray may
        use), ``client-resources-num-gpus``, ``backend``, ``verbose``.
    timeout : float, optional
        Seconds before the run is abandoned.
    env : Mapping, optional
        Extra environment variables; the SuperLink, the simulation process and the
        Ray workers inherit them (e.g. ``OMP_NUM_THREADS``).
    echo : bool, default False
        Also print the run's log as it streams.

    Returns
    -------
    RunResult
        The run's id, status, log and wall time.

    Raises
    ------
    FlowerRunError
        If the run did not start, timed out or did not finish as completed; the
        message carries the tail of the log.
    """
    _check_positive_int("num_supernodes", num_supernodes)
    if client_num_cpus is not None:
        _check_positive_int("client_num_cpus", client_num_cpus)
    home = Path(flwr_home) if flwr_home else Path(tempfile.mkdtemp(prefix="flwr-sim-"))
    http_port, control_port = _free_ports(2)
    run_env = _flower_env(home, env) | {
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
    }
    federation: dict[str, ConfigValue] = {"num-supernodes": num_supernodes}
    if client_num_cpus is not None:
        federation["client-resources-num-cpus"] = client_num_cpus
    federation |= dict(federation_config or {})
    command = _run_command(app_dir, SIMULATION_CONNECTION, run_config, federation)
    try:
        _add_connection(home, SIMULATION_CONNECTION, {"address": ":local:"})
        log_file = home / "local-superlink" / "superlink.log"
        return _flwr_run(command, SIMULATION_CONNECTION, run_env, timeout, echo, [log_file])
    finally:
        _stop_flower_processes(home)
        if flwr_home is None:
            shutil.rmtree(home, ignore_errors=True)


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


# -------------------------------------------------------------------- deployment


class Deployment:
    """A real deployment engine on localhost: one SuperLink and N SuperNodes.

    Use as a context manager; ``run`` submits the app through the connection
    ``local-deployment`` written into ``$FLWR_HOME/config.toml``.

    Parameters
    ----------
    num_supernodes : int
        Number of ``flower-supernode`` processes.
    node_configs : Sequence[Mapping], optional
        Per node, extra ``--node-config`` entries added to ``partition-id=i
        num-partitions=N``.
    flwr_home : Path, optional
        ``FLWR_HOME`` of the SuperLink (each node gets ``<flwr_home>/supernode-<i>``);
        default: a temporary directory, removed on exit.
    env : Mapping, optional
        Extra environment variables for every process (ClientApps inherit them).
        Unless it or the caller's environment sets ``OMP_NUM_THREADS``, each process
        gets ``cpu_count // num_supernodes`` threads (at least 1): the nodes share
        this host's cores.
    startup_timeout : float, default 60.0
        Seconds to wait for the SuperLink to be healthy and every node online.
    """

    def __init__(
        self,
        *,
        num_supernodes: int,
        node_configs: Sequence[Mapping[str, ConfigValue]] | None = None,
        flwr_home: Path | None = None,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        _check_positive_int("num_supernodes", num_supernodes)
        if node_configs is not None and len(node_configs) != num_supernodes:
            raise ValueError(
                f"node_configs has {len(node_configs)} entries for {num_supernodes} supernodes"
            )
        self.num_supernodes = num_supernodes
        self.node_configs = list(node_configs or [{}] * num_supernodes)
        self._given_home = Path(flwr_home) if flwr_home else None
        self._extra_env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.flwr_home = Path()
        self.port = 0
        self.processes: list[subprocess.Popen[bytes]] = []
        self.log_files: list[Path] = []

    def __enter__(self) -> Deployment:
        """Start the SuperLink and the SuperNodes and wait until all nodes are online."""
        self.port = free_port()
        self.flwr_home = self._given_home or Path(tempfile.mkdtemp(prefix="flwr-deploy-"))
        (self.flwr_home / "logs").mkdir(parents=True, exist_ok=True)
        try:
            self._start_superlink()
            self._wait(self._superlink_healthy, "the SuperLink to answer /health")
            _add_connection(
                self.flwr_home,
                DEPLOYMENT_CONNECTION,
                {"address": f"{LOOPBACK}:{self.port}", "insecure": True},
            )
            for index in range(self.num_supernodes):
                self._start_supernode(index)
            self._wait(self._nodes_online, f"{self.num_supernodes} SuperNodes to be online")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Stop every process and remove the temporary ``FLWR_HOME``."""
        self.stop()

    def run(
        self,
        app_dir: Path,
        run_config: Mapping[str, ConfigValue] | str | None = None,
        timeout: float | None = None,
        echo: bool = False,
    ) -> RunResult:
        """Run the app on this deployment: ``flwr run <app_dir> local-deployment --stream``.

        Raises
        ------
        FlowerRunError
            If the run did not start, timed out or did not finish as completed; the
            message carries the tails of the run, SuperLink and SuperNode logs.
        """
        command = _run_command(app_dir, DEPLOYMENT_CONNECTION, run_config)
        env = self._env(self.flwr_home)
        return _flwr_run(command, DEPLOYMENT_CONNECTION, env, timeout, echo, self.log_files)

    def stop(self) -> None:
        """Stop all processes started here (then any stragglers) and remove a temp home."""
        if not self.port:  # not started, or already stopped
            return
        started = [process.pid for process in self.processes]
        stop_pids(started + find_pids(flwr_home=self.flwr_home))
        for process in self.processes:
            process.wait()
        _stop_flower_processes(self.flwr_home)
        self.processes.clear()
        if self._given_home is None:
            shutil.rmtree(self.flwr_home, ignore_errors=True)
        self.port = 0

    def _env(self, flwr_home: Path) -> dict[str, str]:
        env = _flower_env(flwr_home, self._extra_env)
        # N SuperNodes on one host share its cores.  Each ClientApp is a fresh process
        # whose torch would otherwise start one thread per core: oversubscribed OpenMP
        # threads spin against each other and a training step gets ~25x slower here.
        if "OMP_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in self._extra_env:
            share = max(1, (os.cpu_count() or 1) // self.num_supernodes)
            env["OMP_NUM_THREADS"] = str(share)
        return env

    def _spawn(self, command: list[str], name: str, flwr_home: Path) -> None:
        log_file = self.flwr_home / "logs" / f"{name}.log"
        with log_file.open("wb") as sink:
            process = subprocess.Popen(
                command,
                env=self._env(flwr_home),
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        self.log_files.append(log_file)

    def _start_superlink(self) -> None:
        command = [_flower_tool("flower-superlink"), "--insecure"]
        command += ["--disable-runtime-dependency-installation"]
        command += ["--host", LOOPBACK, "--port", str(self.port)]
        self._spawn(command, "superlink", self.flwr_home)

    def _start_supernode(self, index: int) -> None:
        node_config: dict[str, ConfigValue] = {
            "partition-id": index,
            "num-partitions": self.num_supernodes,
        }
        node_config |= dict(self.node_configs[index])
        node_home = self.flwr_home / f"supernode-{index}"
        node_home.mkdir(exist_ok=True)
        command = [_flower_tool("flower-supernode"), "--insecure"]
        command += ["--superlink", f"{LOOPBACK}:{self.port}"]
        command += ["--host", LOOPBACK, "--port", str(free_port())]
        command += ["--node-config", format_run_config(node_config)]
        self._spawn(command, f"supernode-{index}", node_home)

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while not ready():
            dead = [p.args for p in self.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                reason = f"exited: {dead[0]}" if dead else f"{self.startup_timeout}s passed"
                logs = "\n".join(_file_tail(path, 20) for path in self.log_files)
                raise FlowerRunError(f"gave up waiting for {what} ({reason})\n{logs}")
            time.sleep(0.5)

    def _superlink_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{self.port}/health", timeout=1):
                return True
        except (urllib.error.URLError, OSError):
            return False

    def _nodes_online(self) -> bool:
        command = [_flower_tool("flwr"), "supernode", "ls", DEPLOYMENT_CONNECTION]
        command += ["--format", "json"]
        result = subprocess.run(
            command, env=self._env(self.flwr_home), capture_output=True, text=True, timeout=60
        )
        try:
            nodes = json.loads(result.stdout[result.stdout.find("{") :]).get("nodes", [])
        except json.JSONDecodeError:
            return False
        return sum(node.get("status") == "online" for node in nodes) >= self.num_supernodes


# ---------------------------------------------------------------------------- CLI


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m fedorasflwr.launch",
        description="Run the Flower app on the simulation engine (default) or on a "
        "local deployment (SuperLink + SuperNodes), then stop every Flower process.",
    )
    parser.add_argument("--app-dir", type=Path, default=Path("."), help="default: .")
    parser.add_argument("--num-supernodes", type=int, default=20, help="default: 20")
    parser.add_argument("--run-config", default=None, help='overrides, e.g. "k=1 s=\\"x\\""')
    parser.add_argument("--deployment", action="store_true", help="use the deployment engine")
    parser.add_argument(
        "--client-num-cpus",
        type=int,
        default=1,
        help="CPUs per simulated ClientApp (default: 1, so small models train in parallel)",
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path("outputs"),
        help="where results go (default: ./outputs; made absolute, since the ServerApp "
        "runs in the SuperLink's working directory) unless --run-config sets output-dir",
    )
    parser.add_argument("--flwr-home", type=Path, default=None, help="default: a temp dir")
    parser.add_argument("--timeout", type=float, default=None, help="seconds")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the process exit code."""
    args = _parse_args(argv)
    run_config = args.run_config or ""
    if "output-dir=" not in run_config:  # one key may not appear twice in a run config
        output = format_run_config({"output-dir": str(args.output_dir.resolve())})
        run_config = f"{output} {run_config}".strip()
    try:
        if args.deployment:
            with Deployment(num_supernodes=args.num_supernodes, flwr_home=args.flwr_home) as dep:
                result = dep.run(args.app_dir, run_config, args.timeout, echo=True)
        else:
            result = run_simulation(
                args.app_dir,
                num_supernodes=args.num_supernodes,
                run_config=run_config,
                flwr_home=args.flwr_home,
                client_num_cpus=args.client_num_cpus,
                timeout=args.timeout,
                echo=True,
            )
    except FlowerRunError as error:
        print(f"\nFAILED: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; Flower processes stopped", file=sys.stderr)
        return 130
    print(f"\nrun {result.run_id} {result.status} in {result.wall_time:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
