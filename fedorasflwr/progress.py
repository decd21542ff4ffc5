"""What a person sees of a run: compact numbers, one line per round with an ETA, a summary.

- ``fmt`` / ``format_metrics``: every number the strategies log, at 4 significant digits;
- ``StageClock``: ``round 3/10 ... | 12.3s, ETA 1m30s`` lines for long stages (plain lines:
  the ServerApp's output is streamed through ``flwr run --stream``, never a terminal), with
  the whole run's ETA beside the stage's while a ``RunEstimate`` is active;
- ``setup_logging`` / ``quiet_flower_strategy``: one copy of each line, no third-party
  DEBUG output and no Flower FedAvg banner per training job, unless ``verbose``;
- ``summary_lines``: the end-of-run table of every method, from its result document.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import IO, Any

from .costs import flops_to_macs
from .methods import summary_function

__all__ = [
    "RESULTS_LINE",
    "RESULTS_MESSAGE",
    "VERBOSE_ENV",
    "StageClock",
    "fmt",
    "format_seconds",
    "launcher_env",
    "nodes_profiled",
    "PlannedStage",
    "ProgressEcho",
    "RunEstimate",
    "format_bytes",
    "format_metrics",
    "global_test_columns",
    "quiet_flower_strategy",
    "root_logger_kept",
    "setup_logging",
    "summary_lines",
    "verbose",
]

#: environment variable the launcher sets for ``--verbose`` (reaches the ServerApp process)
VERBOSE_ENV = "FEDORASFLWR_VERBOSE"
_FLOWER_STRATEGY_DIR = os.path.join("flwr", "serverapp", "strategy")


# ------------------------------------------------------------------ numbers


def fmt(value: Any, digits: int = 4) -> str:
    """``value`` for a log line: floats at `digits` significant digits, the rest as is.

    >>> fmt(0.123456789), fmt(12345.678), fmt(3), fmt(None), fmt(1e-7)
    ('0.1235', '1.235e+04', '3', '-', '1e-07')
    """
    if value is None:
        return "-"
    if isinstance(value, bool) or isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.{digits}g}"
    if isinstance(value, Sequence) and not isinstance(value, str):
        return "[" + ", ".join(fmt(v, digits) for v in value) + "]"
    return str(value)


def format_metrics(metrics: Mapping[str, Any] | None, keys: Sequence[str] | None = None) -> str:
    """``"loss 0.4321, accuracy 0.9"``: the metrics (those in `keys`, in that order) at
    4 significant digits; ``"-"`` when there are none."""
    if not metrics:
        return "-"
    names = [k for k in keys if k in metrics] if keys is not None else list(metrics)
    return ", ".join(f"{name} {fmt(metrics[name])}" for name in names) or "-"


def format_bytes(count: float | None) -> str:
    """``1536`` -> ``"1.5 KiB"`` (3 significant digits)."""
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.3g} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return f"{value:.3g} GiB"  # pragma: no cover - loop always returns


def format_seconds(seconds: float) -> str:
    """``75.2`` -> ``"1m15s"``, ``8.25`` -> ``"8.2s"``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


@dataclass(frozen=True)
class PlannedStage:
    """One stage of a run as planned from its settings, for the whole run's ETA.

    Parameters
    ----------
    name : str
        The ``StageClock`` stages it covers, a shell-style pattern (``"finetune-t*-random"``:
        each tier's rand-init training, one after the other).
    steps : int
        Steps planned, all its clocks together (rounds, iterations, tiers).
    work : float
        Cost of one step in the run's unit of work (e.g. client-epochs: clients per round
        times local epochs), to scale the cost seen so far onto a stage not yet begun.
    """

    name: str
    steps: int
    work: float = 1.0

    def covers(self, stage: str) -> bool:
        return fnmatchcase(stage, self.name)


class RunEstimate:
    """The remaining time of a whole run, from its planned stages and the steps seen so far.

    Every ``StageClock`` created while it is active (``with estimate.active():``) reports
    its steps to it. The estimate's basis: a stage that has run steps costs, for each step
    left, the seconds per step it has shown; a stage not begun costs its planned
    ``steps * work`` at the seconds per unit of work of every step run so far (all stages
    together). Stages no clock reports (set-up, profiling) and a run stopped early
    (``stop-after``, a DecNAS target reached before its last iteration) are not foreseen:
    the estimate is of the plan. ``None`` until a step has been seen.
    """

    def __init__(
        self,
        stages: Sequence[PlannedStage],
        replan: Callable[[int], Sequence[PlannedStage]] | None = None,
    ) -> None:
        self.stages = list(stages)
        self.replan = replan
        # clock stage -> (steps run here, seconds they took, steps done before a resume)
        self._seen: dict[str, tuple[int, float, int]] = {}

    def nodes_known(self, nodes: int) -> None:
        """The run has ``nodes`` nodes (profiled): the stages planned again for them
        (``replan``), when the plan was made for another count. A plan counts clients per
        round, which are all the nodes in many runs (``clients-per-round`` 0, DP-FNAS's
        parties): made for ``min-nodes`` (what the server waits for, 2 by default) of a
        20-node federation, it put a tenth of the search's work against the final
        training's and foresaw DP-FNAS's quick preset at 41 minutes, 16 times its length."""
        if self.replan is not None and nodes > 0:
            self.stages = list(self.replan(nodes))

    def record(self, stage: str, done: int, seconds: float, before: int = 0) -> None:
        """The clock of ``stage`` has run ``done`` steps in ``seconds``, after ``before``
        steps done by the run it resumed."""
        self._seen[stage] = (done, seconds, before)

    def _progress(self, planned: PlannedStage) -> tuple[int, float, int]:
        clocks = [seen for stage, seen in self._seen.items() if planned.covers(stage)]
        return (
            sum(c[0] for c in clocks),
            sum(c[1] for c in clocks),
            sum(c[2] for c in clocks),
        )

    def remaining(self) -> float | None:
        """Seconds left in the whole plan (see the class docstring); ``None``: no step seen."""
        progress = [(p, *self._progress(p)) for p in self.stages]
        work_done = sum(done * p.work for p, done, _, _ in progress)
        seconds = sum(spent for _, done, spent, _ in progress if done > 0)
        if work_done <= 0:
            return None
        per_work = seconds / work_done
        left = 0.0
        for planned, done, spent, before in progress:
            steps_left = max(planned.steps - done - before, 0)
            if done > 0:
                left += spent / done * steps_left
            else:
                left += steps_left * planned.work * per_work
        return left

    @contextmanager
    def active(self) -> Iterator[RunEstimate]:
        """Within: every new ``StageClock`` reports here and shows the run's ETA."""
        token = _ESTIMATE.set(self)
        try:
            yield self
        finally:
            _ESTIMATE.reset(token)


#: the ``RunEstimate`` of the run in progress (set by ``RunEstimate.active``)
_ESTIMATE: ContextVar[RunEstimate | None] = ContextVar("run_estimate", default=None)


def nodes_profiled(nodes: int) -> None:
    """Tell the run's active ``RunEstimate`` (if any) that ``nodes`` nodes were profiled
    (``RunEstimate.nodes_known``); the strategies' ``profile_nodes`` calls it."""
    estimate = _ESTIMATE.get()
    if estimate is not None:
        estimate.nodes_known(nodes)


class StageClock:
    """Times the steps of one stage and words ``"round 3/10: ... | 4.1s, ETA 28.7s"``.

    Parameters
    ----------
    stage : str
        Name shown in brackets at the start of the line.
    total : int
        Steps of the stage (rounds, iterations).
    first : int (default: 1)
        The first step this process runs (after a resume: the step after the checkpoint's).
    label : str (default: "round")
        What a step is called.
    """

    def __init__(self, stage: str, total: int, first: int = 1, label: str = "round") -> None:
        self.stage, self.total, self.first, self.label = stage, total, first, label
        self.started = time.perf_counter()
        self._shown = self.started
        self.estimate = _ESTIMATE.get()

    def report(self, step: int) -> float:
        """Note `step` done for the run's estimate (if one is active); the seconds so far."""
        elapsed = time.perf_counter() - self.started
        if self.estimate is not None and step >= self.first:
            self.estimate.record(self.stage, step - self.first + 1, elapsed, self.first - 1)
        return elapsed

    def due(self, step: int, every: float = 0.0) -> bool:
        """Whether `step` (just finished, > 0) gets a line: each step when `every` is 0;
        otherwise a step before the last, `every` seconds or more after the last line."""
        if step <= 0:
            return False
        self.report(step)
        if every <= 0:
            return True
        now = time.perf_counter()
        if step < self.total and now - self._shown >= every:
            self._shown = now
            return True
        return False

    def line(
        self,
        step: int,
        metrics: Mapping[str, Any] | None = None,
        keys: Sequence[str] | None = None,
        **extra: Any,
    ) -> str:
        """The progress line of `step` (just finished): its `metrics` (those in `keys`),
        `extra` numbers, the time so far, the ETA of the stage's rest and, with an active
        ``RunEstimate``, of the whole run's (``run ETA``)."""
        elapsed = self.report(step)
        done = step - self.first + 1
        shown = format_metrics(metrics, keys)
        text = f"[{self.stage}] {self.label} {step}/{self.total}: {shown}"
        if extra:
            text += "; " + format_metrics(extra)
        text += f" | {format_seconds(elapsed)}"
        if 0 < done and step < self.total:
            text += f", ETA {format_seconds(elapsed / done * (self.total - step))}"
        left = self.estimate.remaining() if self.estimate is not None else None
        if left is not None:
            text += f", run ETA {format_seconds(left)}"
        return text


#: a ``StageClock`` line as the launcher receives it (colour codes removed)
STEP_LINE = re.compile(
    r"\[(?P<stage>[^\]]+)\] (?P<label>round|iteration) (?P<step>\d+)/(?P<total>\d+):"
)
#: the ServerApp's line naming its run directory (``log(INFO, RESULTS_MESSAGE, method, dir)``)
RESULTS_MESSAGE = "fedorasflwr: method %s, results in %s"
#: that line as the launcher receives it: the run directory, to name when interrupted
RESULTS_LINE = re.compile(r"fedorasflwr: method (?P<method>\S+), results in (?P<dir>.+?)\s*$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: ``flwr run --stream`` lines that say nothing about this run (back with ``--verbose``):
#: the log stream's start, the simulation banner, Flower 1.32's default-size warning and
#: how to resize a federation (the launcher sets the size), Ray's actor teardown, and empty
#: log records.
FLOWER_PREAMBLE = re.compile(
    r"Starting logstream for run_id|Starting Flower Simulation$"
    r"|default simulated SuperNodes changed|To change federation size"
    r"|flwr federation simulation-config|Manually terminating ClientAppActor|^INFO\s*:\s*$"
)


class ProgressEcho:
    """The launcher's echo of the streamed run log, with a progress bar on a terminal.

    Every line is printed as it comes. When `stream` is a terminal, a ``rich`` bar
    (stage, steps done, elapsed, ETA) follows the ``StageClock`` lines of the stage
    in progress, below the log; otherwise (a pipe, ``flwr run --stream`` into a file,
    CI logs) the lines are written plainly, each once, and the ETA is in the lines.
    """

    def __init__(
        self,
        stream: IO[str] | None = None,
        *,
        terminal: bool | None = None,
        verbose_output: bool = False,
    ) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.verbose_output = verbose_output
        is_tty = getattr(self.stream, "isatty", lambda: False)()
        self.terminal = is_tty if terminal is None else terminal
        self._bar: Any = None
        self._task: Any = None
        self._stage: str | None = None

    def __call__(self, line: str) -> None:
        if not self.verbose_output and FLOWER_PREAMBLE.search(_ANSI.sub("", line)):
            return
        if not self.terminal:
            self.stream.write(line)
            self.stream.flush()
            return
        from rich.text import Text

        bar = self._progress()
        bar.console.print(Text.from_ansi(line.rstrip("\n")), highlight=False)
        match = STEP_LINE.search(_ANSI.sub("", line))
        if match is not None:
            self._advance(match["stage"], int(match["step"]), int(match["total"]))

    def _progress(self) -> Any:
        if self._bar is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=True,
            )
            self._bar.start()
        return self._bar

    def _advance(self, stage: str, step: int, total: int) -> None:
        if stage != self._stage or self._task is None:
            if self._task is not None:
                self._bar.remove_task(self._task)
            self._stage = stage
            self._task = self._bar.add_task(stage, total=total, completed=step - 1)
        self._bar.update(self._task, completed=step, total=total)

    def close(self) -> None:
        """Remove the bar (the log lines stay)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            self._task = None


# ------------------------------------------------------------------ logging


def verbose() -> bool:
    """Whether the launcher asked for everything (``--verbose``)."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0", "false")


#: the format of the root handler ``opacus.utils.module_utils`` adds at import
_OPACUS_FORMAT = "%(asctime)s:%(levelname)s:%(message)s"


def setup_logging(verbose_output: bool | None = None) -> logging.Logger:
    """Print each ``flwr`` log line once, and DEBUG lines only when verbose.

    Flower's logger ``flwr`` prints through its own console handler (level INFO) and
    propagates to the root logger. opacus (imported by the DP-FNAS code) calls
    ``logging.basicConfig`` at import, which gives the root logger a timestamped
    stderr handler of level NOTSET: every ``flwr`` record, DEBUG included (the Ray
    backend set-up), was printed a second time through it. That handler is removed
    (only it: other root handlers, e.g. pytest's, stay), and a root logger left without
    handlers gets a ``NullHandler``, so that a later ``basicConfig`` adds none. With
    `verbose_output` (default: the launcher's ``--verbose``) Flower's own handler shows DEBUG
    records.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        formatter = handler.formatter
        if type(handler) is logging.StreamHandler and formatter is not None:
            if formatter._fmt == _OPACUS_FORMAT:  # noqa: SLF001 - no public accessor
                root.removeHandler(handler)
    if not root.handlers:
        # basicConfig adds nothing to a root logger that has a handler: opacus imported
        # later (the simulation engine loads the ClientApp, DP-FNAS's client imports it,
        # after the ServerApp has started) then cannot add its copy of every line.
        root.addHandler(logging.NullHandler())
    logger = logging.getLogger("flwr")
    if verbose() if verbose_output is None else verbose_output:
        for handler in logger.handlers:
            if type(handler).__name__ == "ConsoleHandler":
                handler.setLevel(logging.DEBUG)
    return logger


@contextmanager
def root_logger_kept() -> Iterator[None]:
    """Within (around a third-party import): handlers added to the root logger are
    removed again at the end.

    ``opacus.utils.module_utils`` calls ``logging.basicConfig`` at import, which gives a
    root logger without handlers a stderr handler. Flower's logger ``flwr`` prints
    through its own handler and propagates to the root, so from then on every ``flwr``
    line, the library's included, printed twice in any ServerApp that imports
    ``fedorasflwr.strategies`` (a library app under ``flwr run`` that never calls
    `setup_logging`). The modules that import opacus do it within this.
    """
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        yield
    finally:
        for handler in list(root.handlers):
            if handler not in before:
                root.removeHandler(handler)


def launcher_env(verbose_output: bool) -> dict[str, str]:
    """Environment the launcher gives every Flower process for ``--verbose`` (or not).

    Verbose: the ServerApp keeps Flower's banners (``FEDORASFLWR_VERBOSE``) and every
    Flower process logs DEBUG (``FLWR_LOG_LEVEL``). Not verbose: nothing extra.
    """
    return {VERBOSE_ENV: "1", "FLWR_LOG_LEVEL": "DEBUG"} if verbose_output else {}


class _FlowerStrategyFilter(logging.Filter):
    """Drops the INFO lines of Flower's own strategy code (the FedAvg banner, its
    per-round lines) and its ``fraction_evaluate is set to 0.0`` warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _FLOWER_STRATEGY_DIR not in record.pathname:
            return True
        if record.levelno <= logging.INFO:
            return False
        return "is set to 0.0" not in str(record.msg)


@contextmanager
def quiet_flower_strategy() -> Iterator[None]:
    """Within: no INFO line and no ``fraction_* is set to 0.0`` warning from Flower's
    strategy modules (unless ``verbose()``); the project's own lines pass."""
    if verbose():
        yield
        return
    logger = logging.getLogger("flwr")
    quiet = _FlowerStrategyFilter()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


# ------------------------------------------------------------------ end-of-run summary


def _ledger_bytes(ledger: Mapping[str, Any] | None) -> tuple[int, int]:
    down = up = 0
    for stage in (ledger or {}).values():
        totals = stage.get("totals", {})
        down += int(totals.get("bytes_down", 0))
        up += int(totals.get("bytes_up", 0))
    return down, up


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [list(header)] + [[fmt(v) if not isinstance(v, str) else v for v in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return [line.rstrip() for line in lines]


#: the cost columns, named with their unit (FLOPs and MACs of one sample, in millions):
#: every summary table of models has both, side by side (the papers' "FLOPs" are MACs)
MFLOPS, MMACS = "MFLOPs/sample", "MMACs/sample"
COST_COLUMNS = (MFLOPS, MMACS)


def cost_cells(flops: float) -> list[float]:
    """The ``COST_COLUMNS`` cells of a model of ``flops`` FLOPs per sample: MFLOPs, MMACs."""
    return [flops / 1e6, flops_to_macs(flops) / 1e6]


def cost_table(
    header: list[str], rows: list[list[Any]], entries: Sequence[Mapping[str, Any]], key: str
) -> list[str]:
    """The lines of a summary table of models (``table``), one row per entry, with a
    ``latency ms`` column after the FLOPs / MACs ones when the run budgeted by latency (its
    entries carry ``key``: milliseconds on their group's latency table)."""
    if any(key in entry for entry in entries):
        at = max(i for i, name in enumerate(header) if name in COST_COLUMNS) + 1
        for row, entry in zip(rows, entries, strict=True):
            row.insert(at, entry.get(key, "-"))
        header = [*header[:at], "latency ms", *header[at:]]
    return table(header, rows)


def global_test_columns(
    header: list[str],
    rows: list[list[Any]],
    entries: Sequence[Mapping[str, Any]],
    columns: Mapping[str, str] | None = None,
) -> list[str]:
    """Append a summary table's global-test columns (``data.global-test``), in place: for
    each ``columns`` item (default ``{"global test acc": "global_test_accuracy"}``) whose key
    some entry carries, a column of each entry's value ("-" where it has none); returns the
    header. Runs without a global test set keep their table as it was."""
    columns = {"global test acc": "global_test_accuracy"} if columns is None else columns
    for name, key in columns.items():
        if any(entry.get(key) is not None for entry in entries):
            header = [*header, name]
            for row, entry in zip(rows, entries, strict=True):
                row.append(entry.get(key, "-"))
    return header


def id_ranges(ids: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"``; no ids (a tier no client serves) -> ``"-"``."""
    ordered = sorted(ids)
    if not ordered:
        return "-"
    parts: list[str] = []
    start = prev = ordered[0]
    for value in [*ordered[1:], None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if value is not None:
            start = prev = value
    return ",".join(parts)


def summary_lines(method: str, document: Mapping[str, Any], settings: Any = None) -> list[str]:
    """The end-of-run summary of `method` from its result document (``server_app``).

    The method's own lines (``methods/<method>/summary.py``: per tier, net or GM the model,
    its cost and accuracies; DP-FNAS's genotype and the privacy spent, at the delta of
    ``settings``, the run's method settings), then the bytes moved (ledger).
    """
    lines = [f"=== {method} summary ===", *summary_function(method)(document, settings)]
    down, up = _ledger_bytes(document.get("ledger"))
    lines.append(f"bytes moved: {format_bytes(down)} to clients, {format_bytes(up)} from clients")
    return lines
