"""The ``flwr`` command line: run configs, the Flower environment, ``flwr run`` / ``flwr ls``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import tomli_w

from .heartbeat import HEARTBEAT_FAILURE, heartbeat_remedy
from .processes import held_signals, stop_pids

__all__ = [
    "DEPLOYMENT_CONNECTION",
    "SUPERLINK_START_TIMEOUT",
    "QUIET_FLOWER_ENV",
    "SIMULATION_CONNECTION",
    "ConfigValue",
    "FlowerRunError",
    "RunResult",
    "format_run_config",
]

ConfigValue = str | int | float | bool
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
#: how Flower's CLI says its local SuperLink missed its start limit (``flwr/cli/
#: local_superlink.py``: ``Failed to start local SuperLink within 15s``), which happens on
#: a loaded machine; a start that failed otherwise (``... exited with code N``) is not retried
SUPERLINK_START_TIMEOUT = re.compile(r"Failed to start local SuperLink within \d+s")
#: the frame of the error box Flower's CLI prints (rich's panel)
_BOX_TOP, _BOX_SIDE, _BOX_BOTTOM = "\u256d", "\u2502", "\u2570"


class FlowerRunError(RuntimeError):
    """A Flower run did not start, did not finish in time, or finished as failed.

    Attributes
    ----------
    run_id : int or None
        The SuperLink's run id (``None``: the run did not start).
    status : str or None
        Flower's final status of the run (``"finished:failed"``, ``"finished:stopped"``),
        ``None`` when it was not read (not started, timed out).
    details : str
        Flower's status details, e.g. ``No heartbeat received from the task``.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: int | None = None,
        status: str | None = None,
        details: str = "",
    ) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.status = status
        self.details = details


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


def box_text(output: str) -> str:
    """The text of the last error box Flower's CLI printed in `output`, on one line
    (``""`` if it printed none)."""
    lines = _ANSI_PATTERN.sub("", output).splitlines()
    tops = [i for i, line in enumerate(lines) if line.lstrip().startswith(_BOX_TOP)]
    if not tops:
        return ""
    words = []
    for line in lines[tops[-1] + 1 :]:
        if line.lstrip().startswith(_BOX_BOTTOM):
            break
        words += line.strip().strip(_BOX_SIDE).split()
    return " ".join(words)


class HeldBox:
    """An echo that passes lines on as they come, except an error box of Flower's CLI,
    kept until `release` (shown) or `drop` (a retried start: shown by the last try only),
    so that the box is printed once."""

    def __init__(self, echo: bool | Callable[[str], None]) -> None:
        self.echo = echo
        self.held: list[str] = []

    def __call__(self, line: str) -> None:
        if self.held or _ANSI_PATTERN.sub("", line).lstrip().startswith(_BOX_TOP):
            self.held.append(line)
        else:
            self._show(line)

    def _show(self, line: str) -> None:
        if callable(self.echo):
            self.echo(line)
        elif self.echo:
            sys.stdout.write(line)
            sys.stdout.flush()

    def release(self) -> None:
        """Show the lines held."""
        for line in self.held:
            self._show(line)
        self.held = []

    def drop(self) -> None:
        """Forget the lines held."""
        self.held = []


def _stream_command(
    command: Sequence[str],
    env: Mapping[str, str],
    timeout: float | None,
    echo: bool | Callable[[str], None],
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
    home: Path | None = None
    try:
        returncode = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM / SIGHUP: every Flower process at once
        home = Path(env.get("FLWR_HOME") or "relative")
        home = home if home.is_absolute() else None
        raise
    finally:
        with held_signals():
            if process.poll() is None or home is not None:  # a timeout, a signal, an error
                # on a timeout the SuperLink must stay up: `flwr stop` asks it to stop the run
                stop_pids([process.pid], flwr_home=home)
                process.wait()
            reader.join(timeout=5.0)
    return returncode, "".join(lines), time.monotonic() - start


def _collect(stream: IO[str], lines: list[str], echo: bool | Callable[[str], None]) -> None:
    for line in stream:
        if callable(echo):  # e.g. the launcher's ``ProgressEcho`` (a bar on a terminal)
            echo(line)
        elif echo:
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
    echo: bool | Callable[[str], None],
    log_files: Sequence[Path] = (),
    heartbeat_timeout: float | None = None,
) -> RunResult:
    """Run a ``flwr run ... --stream`` command and check the run finished as completed.

    ``flwr run --stream`` exits 0 when the ServerApp raised: the run's own status, from
    ``flwr ls --run-id <id> --format json``, decides. A run that ended otherwise than
    ``finished:completed`` raises `FlowerRunError` with its id, status and details (and,
    for a heartbeat failure, the remedy: `heartbeat.heartbeat_remedy`)."""
    returncode, output, wall_time = _stream_command(command, env, timeout, echo)
    match = _RUN_ID_PATTERN.search(output)
    run_id = int(match.group(1)) if match else None
    logs = "\n".join(_file_tail(path, 20) for path in log_files)
    if returncode is None:
        if run_id is not None:
            _stop_run(connection, run_id, env)
        raise FlowerRunError(
            f"run {run_id} timed out after {timeout}s:\n{_tail(output)}\n{logs}", run_id=run_id
        )
    if returncode != 0 or run_id is None:
        # the box, echoed already, once: its text here; the log's tail when not echoed
        shown = box_text(output) if echo else ""
        raise FlowerRunError(
            f"`flwr run` failed to start the run (exit code {returncode}): "
            + (shown or "\n" + _tail(output)),
            run_id=run_id,
        )
    status, details = _run_status(connection, run_id, env)
    if status != "finished:completed":
        reason = f"run {run_id} ended as {status!r}: {details}"
        if HEARTBEAT_FAILURE in details:
            reason += "\n" + heartbeat_remedy(heartbeat_timeout)
        raise FlowerRunError(
            f"{_tail(output)}\n{logs}\n{reason}".strip(),
            run_id=run_id,
            status=status,
            details=details,
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


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
