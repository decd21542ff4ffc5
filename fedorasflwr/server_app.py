"""ServerApp: parse the run config, run the method's runner, write ``result.json``.

Each method's runner (``methods/<method>/runner.py``: run config -> space, strategy ->
``start`` -> artifacts) is imported only when its method runs.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import threading
import time
from collections.abc import Iterator
from logging import ERROR, INFO
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

from .artifacts import run_directory
from .checkpoints import Checkpointer
from .config import RunSettings
from .federation.polling import prompt
from .progress import RESULTS_MESSAGE, format_seconds, setup_logging, summary_lines
from .rounds import RoundsRule, parse_with_rounds_rule
from .runs import Runner
from .training import apply_determinism, resolve_device, using_device

__all__ = ["RUNNERS", "STOP_SIGNALS", "app", "interruption", "main", "recorded_signals", "runner"]

app = ServerApp()

#: run config ``method`` -> its runner's import path
RUNNERS: dict[str, str] = {
    "fedoras": "fedorasflwr.methods.fedoras.runner:run_fedoras",
    "fdnas": "fedorasflwr.methods.fdnas.runner:run_fdnas",
    "cfdnas": "fedorasflwr.methods.fdnas.runner:run_cfdnas",
    "dpfnas": "fedorasflwr.methods.dpfnas.runner:run_dpfnas",
    "decnas": "fedorasflwr.methods.decnas.runner:run_decnas",
    "fednas": "fedorasflwr.methods.fednas.runner:run_fednas",
    "heterofl": "fedorasflwr.methods.widths.runner:run_heterofl",
    "fjord": "fedorasflwr.methods.widths.runner:run_fjord",
}


def runner(method: str) -> Runner:
    """The runner of ``method`` (imported on first use)."""
    module, _, name = RUNNERS[method].partition(":")
    return getattr(importlib.import_module(module), name)


#: the signals that stop a run (those the platform has): each one's name is recorded
STOP_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
    if hasattr(signal, name)
)


@contextlib.contextmanager
def recorded_signals(caught: list[str]) -> Iterator[None]:
    """Append the name of each ``STOP_SIGNALS`` signal that arrives to ``caught``, then let
    it take its course: the handler in place (Flower's ServerApp process: a graceful exit),
    or for the system's default a ``KeyboardInterrupt`` (so that the run's status is written
    before the process ends). Outside the main thread (the simulation engine's ServerApp
    thread) signals cannot be handled there: nothing is recorded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.getsignal(number) for number in STOP_SIGNALS}

    def record(number: int, frame: object) -> None:
        caught.append(signal.Signals(number).name)
        handler = previous[number]
        if callable(handler):
            handler(number, frame)
        elif handler != signal.SIG_IGN:
            raise KeyboardInterrupt(signal.Signals(number).name)

    for number in STOP_SIGNALS:
        signal.signal(number, record)
    try:
        yield
    finally:
        for number, handler in previous.items():
            if handler is not None:
                signal.signal(number, handler)


def interruption(stop: BaseException, caught: list[str]) -> str:
    """What interrupted a run, for ``result.json``'s ``status.interrupted_by``: the last
    signal recorded (``recorded_signals``), else the exception (``KeyboardInterrupt``,
    ``SystemExit(<code>)``)."""
    if caught:
        return caught[-1]
    if isinstance(stop, SystemExit):
        return f"SystemExit({stop.code})"
    return type(stop).__name__


def run_header(settings: RunSettings, run_id: int) -> dict[str, Any]:
    """What opens a run's result.json: method, settings, Flower's run id, the resumed file."""
    return {
        "method": settings.method,
        "settings": settings.document(),
        "run_id": run_id,
        "resumed_from": settings.resume_from or None,
    }


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Parse the run config (fail before any training), run the method, write artifacts.

    ``result.json`` is written at every checkpoint (unfinished), when the run fails
    (with the error, keeping what was finished) and at the end (``status.finished``)."""
    started = time.time()
    setup_logging()
    grid = prompt(grid)  # replies collected as they arrive, not on Flower's 3-s beat
    settings = parse_with_rounds_rule(context.run_config)  # the rounds rule (rounds.py)
    run_method = runner(settings.method)
    out_dir = run_directory(settings.output_path, settings.method, context.run_id)
    log(INFO, RESULTS_MESSAGE, settings.method, out_dir)  # the launcher reads it
    rule = settings.rounds_rule or {}
    if rule.get("scale", 1.0) != 1.0:
        log(INFO, "fedorasflwr: %s", RoundsRule(**rule).line())
    progress = Checkpointer.for_run(out_dir, settings, header=run_header(settings, context.run_id))
    caught: list[str] = []
    try:
        device = resolve_device(settings.device)
        apply_determinism(device, settings.deterministic)
        with recorded_signals(caught), using_device(device):  # the server's scoring loops
            document = run_method(grid, settings, out_dir, progress)
    except Exception as exc:
        seconds = round(time.time() - started, 2)
        written = progress.write_result(error=exc, seconds=seconds)
        where = progress.stage or "setup"
        log(ERROR, "fedorasflwr: run stopped in %s: %s", where, written["status"]["error"])
        raise
    except BaseException as stop:  # Ctrl-C, a signal (Flower's handler exits), an exit
        seconds = round(time.time() - started, 2)
        cause = interruption(stop, caught)
        progress.write_result(interrupted=cause, seconds=seconds)
        log(ERROR, "fedorasflwr: run interrupted in %s by %s", progress.stage or "setup", cause)
        raise
    seconds = round(time.time() - started, 2)
    written = progress.write_result(document, finished=True, seconds=seconds)
    for line in summary_lines(settings.method, written, settings.method_settings):
        log(INFO, "%s", line)
    log(
        INFO,
        "fedorasflwr: finished in %s, wrote %s",
        format_seconds(seconds),
        out_dir / "result.json",
    )
