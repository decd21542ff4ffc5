"""Running one method of a comparison: on the simulation engine through the project's
launcher (``python -m fedorasflwr.launch``, a process of its own) or on the in-process grid;
a finished run with the same settings is reused, a failed one is recorded with its reason.

Each run lives in ``<out>/<method>/<attempt>/``: ``run-config.toml`` (the overrides it ran
with), ``launch.log`` (the launcher's output, engine runs), the ServerApp's run directory
``<method>-<UTC time>-run<id>/`` with its ``result.json``, and ``compare-run.json`` (how it
ran: engine, wall seconds, status).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from ..artifacts import plain, write_json
from ..checkpoints import finite
from ..data.folder import absolute_folder
from ..results import result_json
from ..rounds import parse_with_rounds_rule

__all__ = [
    "MethodRun",
    "comparable",
    "expected_settings",
    "failure_cause",
    "find_result",
    "one_line",
    "run_method",
]

#: how a run ran: the simulation engine through the launcher, or the in-process grid
ENGINES = ("simulation", "inprocess")
RUN_FILE = "compare-run.json"
CONFIG_FILE = "run-config.toml"
LOG_FILE = "launch.log"


@dataclass
class MethodRun:
    """One run of a method: ``status`` ``finished`` (``document``: its result.json),
    ``failed`` (``reason``) or ``reused`` (a finished run found in place, not run again)."""

    method: str
    attempt: str
    status: str
    document: dict[str, Any] | None
    result: Path | None
    reason: str = ""
    engine: str = ""
    wall_seconds: float | None = None

    @property
    def ok(self) -> bool:
        return self.document is not None


def expected_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``settings`` entry a run of the full run config ``config`` writes in its
    result.json (``RunSettings.document()`` as ``results.result_json`` writes it), less
    where files go (``comparable``)."""
    settings = parse_with_rounds_rule(config).document()  # as the ServerApp parses it
    content = finite(result_json(plain({"settings": settings})))
    return comparable(json.loads(json.dumps(content["settings"])))


def comparable(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A result.json's ``settings`` less where its files went (``output_dir``, the data's
    ``cache_dir``): a comparison directory moved or copied elsewhere still resumes."""
    kept = {k: v for k, v in settings.items() if k != "output_dir"}
    if isinstance(kept.get("data"), Mapping):
        kept["data"] = {k: v for k, v in kept["data"].items() if k != "cache_dir"}
    return kept


def find_result(directory: Path, config: Mapping[str, Any]) -> Path | None:
    """The newest finished ``result.json`` under ``directory`` whose settings are those a
    run of ``config`` (the full run config) writes; ``None`` if there is none."""
    expected = expected_settings(config)
    found = sorted(directory.glob("*/result.json"), key=lambda p: p.stat().st_mtime)
    for path in reversed(found):
        try:
            document = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        status = document.get("status") or {}
        settings = document.get("settings")
        if status.get("finished") is True and comparable(settings or {}) == expected:
            return path
    return None


def _nested(values: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys as TOML tables (``fedoras.rounds`` -> ``[fedoras] rounds``)."""
    nested: dict[str, Any] = {}
    for key, value in values.items():
        *tables, leaf = key.split(".")
        node = nested
        for table in tables:
            node = node.setdefault(table, {})
        node[leaf] = value
    return nested


def run_method(
    method: str,
    attempt: str,
    overrides: Mapping[str, Any],
    defaults: Mapping[str, Any],
    out: Path,
    *,
    nodes: int,
    inprocess: bool,
    app_dir: Path,
    timeout: float | None = None,
) -> MethodRun:
    """Run ``method`` with the run-config ``overrides`` (over the app's ``defaults``) in
    ``<out>/<method>/<attempt>/``, or reuse a finished run there with the same settings."""
    directory = (out / method / attempt).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    # the launcher runs in ``directory``: a relative folder: dataset is the user's, from here
    values = absolute_folder({**overrides, "output-dir": str(directory)}, Path.cwd())
    config = {**defaults, **values}
    found = find_result(directory, config)
    if found is not None:
        record = _read_record(directory)
        return MethodRun(
            method,
            attempt,
            "reused",
            json.loads(found.read_text()),
            found,
            engine=record.get("engine", ""),
            wall_seconds=record.get("wall_seconds"),
        )
    (directory / CONFIG_FILE).write_text(tomli_w.dumps(_nested(values)))
    started = time.time()
    if inprocess:
        reason = _run_inprocess(config, nodes)
    else:
        reason = _run_engine(directory, nodes, app_dir, timeout)
    wall = round(time.time() - started, 2)
    engine = "inprocess" if inprocess else "simulation"
    found = find_result(directory, config)
    if found is None and not reason:
        reason = "the run wrote no finished result.json"
    if found is None:
        reason = one_line(_result_error(directory) or reason)
    status = "finished" if found is not None else "failed"
    write_json(
        directory / RUN_FILE,
        {
            "method": method,
            "engine": engine,
            "wall_seconds": wall,
            "status": status,
            "reason": reason,
            "result": None if found is None else str(found.relative_to(directory)),
        },
    )
    document = None if found is None else json.loads(found.read_text())
    return MethodRun(method, attempt, status, document, found, reason, engine, wall)


def _read_record(directory: Path) -> dict[str, Any]:
    try:
        return json.loads((directory / RUN_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _result_error(directory: Path) -> str:
    """The error of the newest unfinished result.json under ``directory`` (the ServerApp
    writes it when the run raises), else ``""``."""
    found = sorted(directory.glob("*/result.json"), key=lambda p: p.stat().st_mtime)
    for path in reversed(found):
        try:
            status = json.loads(path.read_text()).get("status") or {}
        except (OSError, json.JSONDecodeError):
            continue
        if status.get("error"):
            return f"{status['error']} (stage {status.get('stage') or 'setup'})"
    return ""


def _run_inprocess(config: Mapping[str, Any], nodes: int) -> str:
    """The ServerApp's ``main`` on the in-process grid (``nodes`` nodes); the reason it
    failed, or ``""``."""
    from flwr.app import Context, RecordDict

    from ..client_app import app as client_app
    from ..inprocess import InProcessGrid
    from ..server_app import main

    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=dict(config)
    )
    try:
        main(InProcessGrid(client_app, config, nodes), context)
    except Exception as error:  # noqa: BLE001 - one method's failure must not stop the others
        return f"{type(error).__name__}: {error}"
    return ""


def _run_engine(directory: Path, nodes: int, app_dir: Path, timeout: float | None) -> str:
    """``python -m fedorasflwr.launch`` with the run's ``run-config.toml`` (its output in
    ``launch.log``); the reason it failed, or ``""``."""
    command = [sys.executable, "-m", "fedorasflwr.launch", "--app-dir", str(app_dir)]
    command += ["--num-supernodes", str(nodes), "--run-config", str(directory / CONFIG_FILE)]
    if timeout is not None:
        command += ["--timeout", str(timeout)]
    with open(directory / LOG_FILE, "w", encoding="utf-8") as log:
        done = subprocess.run(
            command, cwd=directory, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ)
        )
    if done.returncode == 0:
        return ""
    cause = failure_cause((directory / LOG_FILE).read_text(errors="replace"))
    return f"launcher exit code {done.returncode}: {cause}"


#: an exception's last traceback line, also inside a log line's prefix (``ERROR : ...``) or
#: as Ray re-raises it (``ray.exceptions.RayTaskError(KeyError): ...``)
_EXCEPTION_LINE = re.compile(
    r"(?<![\w.])((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit)(?:\(\w+\))?: \S.*)$"
)
#: the launcher's closing lines that say where to look, not what went wrong (cli._how_to_see)
_HINTS = ("Flower home of this run:", "see it with:", "FLWR_HOME=", "then stop the SuperLink")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: the longest reason kept (a leaderboard cell)
REASON_CHARS = 300


def failure_cause(log: str) -> str:
    """What made a launch fail, on one line, from its output ``log``: the launcher's own
    refusal (``error: ...``, exit 2: a bad value, nothing run), else the last exception line
    (the ServerApp's, a client's as Flower or Ray reported it), else its ``FAILED:`` or
    ``interrupted by`` line, else its last line that is not a hint on where to look."""
    lines = [line.strip() for line in _ANSI.sub("", log).splitlines() if line.strip()]
    refused = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    if refused:
        return one_line(" / ".join(lines[refused[-1] :]))
    for line in reversed(lines):
        match = _EXCEPTION_LINE.search(line)
        if match:
            return one_line(match[1])
    for line in reversed(lines):
        if line.startswith(("FAILED: ", "interrupted by ")):
            return one_line(line)
    causes = [line for line in lines if not line.startswith(_HINTS)]
    return one_line(causes[-1] if causes else "no output")


def one_line(text: str, limit: int = REASON_CHARS) -> str:
    """``text`` with its whitespace runs (newlines too) made single spaces, cut at `limit`
    characters (an ellipsis says so)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "\u2026"
