"""Checkpoints, partial results and resuming: one mechanism for every method.

A strategy reports where it is with ``FederatedNASStrategy.reached`` (a ``Snapshot``:
stage, rounds or iterations done in it, the weights, its own progress, the history
and the ledger).  The runner's ``Checkpointer`` turns a snapshot into

- ``checkpoint.pt`` every ``checkpoint-every`` steps and at the end of every stage,
  written atomically (a temporary file, then ``os.replace``), so a crash while
  writing leaves the previous checkpoint whole;
- a partial ``result.json`` beside it, saying where the run stopped and whether
  it finished (``status``: ``state`` running / finished / failed / interrupted, the stage,
  its steps and whether it ended, the error once (``error_text``) or what interrupted it).

A checkpoint holds plain values and tensors only, so ``torch.load(weights_only=True)``
reads it (``artifacts.load_checkpoint`` also checks it).  Its entries:
``format``, ``method``, ``seed``, ``space`` (what rebuilds the weights),
``state_dict``, ``stage``, ``step``, ``stage-done``, ``progress`` (the strategy's
own state), ``history``, ``ledger``, ``settings``.  Run config ``resume-from`` hands a
checkpoint back as a ``Resume``; the strategy continues at the next round of its stage.

A checkpoint is bound to the settings that made its state: ``settings`` holds every
run-config value the run read (given or default; ``config.bound_settings``) except the keys
a resume may change (``config.resume_safe_keys``: where files go, when they are written,
where loops compute, how long to wait) and the other methods' tables.  ``read_resume`` refuses
a run whose values differ, naming every differing key with both values, and checks the
stage, the step (within the stage's rounds) and the ledger's counters.

Randomness needs no saved stream: every generator the strategies and clients use
is derived afresh from (seed, purpose, round or iteration, partition) by
``FederatedNASStrategy.rng`` or another stream of :mod:`fedorasflwr.seeding`; none is
advanced across rounds.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord

from .arrays import state_dict_of
from .artifacts import load_checkpoint, plain, write_json
from .config import RunSettings, bound_settings, resume_safe_keys
from .ledger import Ledger, check_summary
from .results import result_json

__all__ = [
    "CHECKPOINT_FILE",
    "FAILED",
    "FINISHED",
    "FORMAT",
    "INTERRUPTED",
    "RUNNING",
    "STATES",
    "Checkpointer",
    "Resume",
    "Snapshot",
    "atomic_save",
    "error_text",
    "finite",
    "read_resume",
]

#: 2: ``settings`` (the run config a resume must keep); 1: none (refused on resume)
FORMAT = 2
CHECKPOINT_FILE = "checkpoint.pt"
RESULT_FILE = "result.json"

#: ``result.json``'s ``status.state``: the run is going on (a partial result), ended with its
#: results, stopped by an error (``status.error``), or stopped by a signal or by whoever ran
#: it (``status.interrupted_by``)
RUNNING, FINISHED, FAILED, INTERRUPTED = "running", "finished", "failed", "interrupted"
STATES = (RUNNING, FINISHED, FAILED, INTERRUPTED)

#: terminal colour and cursor codes (a Ray or rich traceback's) that a file must not hold
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_TRACEBACK = "Traceback (most recent call last):"
_REASONS = " Reasons: "


@dataclass(frozen=True)
class Snapshot:
    """Where a strategy is.  ``arrays`` ``None``: a stage has just begun (nothing to save)."""

    stage: str
    step: int
    arrays: ArrayRecord | None
    ledger: Ledger
    history: Any = None
    progress: Mapping[str, Any] = field(default_factory=dict)
    stage_done: bool = False
    space: Mapping[str, Any] | None = None  # when the weights are not of the run's space


@dataclass
class Resume:
    """A checkpoint read back: the stage, the steps done in it, and what continues."""

    path: str
    stage: str
    step: int
    stage_done: bool
    arrays: ArrayRecord
    progress: dict[str, Any]
    history: Any
    ledger: dict[str, Any]

    def within(self, stage: str) -> bool:
        """Whether the run stopped inside ``stage`` (some steps done, not all)."""
        return self.stage == stage and not self.stage_done

    def past(self, stage: str) -> bool:
        """Whether ``stage`` had ended when the checkpoint was written."""
        return self.stage == stage and self.stage_done


def atomic_save(content: Any, path: Path) -> Path:
    """``torch.save`` to a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    torch.save(content, temporary)
    os.replace(temporary, path)
    return path


def error_text(error: BaseException) -> str:
    """``error`` as ``result.json``'s ``status.error``: ``<type>: <message>`` on one line,
    colour codes removed, each ``; ``-separated part once; a traceback inside it (a client's
    error as Ray or Flower report it, in a ``StageFailedError``'s reasons) stands as its
    last line, the error that started it (the original cause, not the frames above it)."""
    text = _ESCAPES.sub("", f"{type(error).__name__}: {error}")
    head, marker, reasons = text.partition(_REASONS)  # StageFailedError's list of reasons
    parts = []
    for part in (reasons if marker else text).split("; "):
        before, traceback, trace = part.partition(_TRACEBACK)
        if traceback:
            lines = [line.strip() for line in trace.splitlines() if line.strip()]
            part = f"{before.strip()} {lines[-1]}" if lines else before
        parts.append(" ".join(part.split()))
    text = "; ".join(dict.fromkeys(p for p in parts if p))
    return f"{' '.join(head.split())}{marker}{text}" if marker else text


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None`` (JSON has none)."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, Mapping):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def check_bound_settings(
    where: str, saved: Mapping[str, Any], current: Mapping[str, Any], method: str
) -> None:
    """Raise a ``ValueError`` naming every key whose value differs between the checkpoint's
    ``saved`` settings and this run's ``current`` ones (both values) of a ``method`` run."""
    absent = "(absent)"
    differing = [
        f"{key!r} = {saved.get(key, absent)!r} there, {current.get(key, absent)!r} here"
        for key in sorted(set(saved) | set(current))
        if key not in saved or key not in current or saved[key] != current[key]
    ]
    if differing:
        raise ValueError(
            f"{where}: written by a run with other settings; a resume continues the same "
            "configuration, so it must keep them "
            f"(only {sorted(resume_safe_keys(method))} may change): " + "; ".join(differing)
        )


class Checkpointer:
    """Writes one run's checkpoints and partial ``result.json``.

    Parameters
    ----------
    out_dir : Path
        The run directory.
    method, seed : str, int
        Recorded in every checkpoint (a resume must match both).
    settings : mapping
        The run config the checkpoint is bound to (``config.bound_settings``); a resume
        must have the same.
    space : mapping, optional
        ``build_space`` arguments of the weights (unless a snapshot names its own);
        the runner sets it once it has built the space.
    every : int
        Steps between checkpoints (run config ``checkpoint-every``); 0: stage ends only.
    header : mapping
        What every ``result.json`` starts with (method, settings, run id).
    stage_files : mapping
        Stage -> file name: at that stage's end the checkpoint is also saved
        under that name (FedorAS: ``{"supernet": "supernet.pt"}``).
    """

    def __init__(
        self,
        out_dir: Path,
        *,
        method: str,
        seed: int,
        space: Mapping[str, Any] | None = None,
        every: int = 0,
        header: Mapping[str, Any] | None = None,
        stage_files: Mapping[str, str] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.method = method
        self.seed = seed
        self.settings = dict(settings or {})
        self.space = dict(space or {})
        self.every = every
        self.header = dict(header or {})
        self.stage_files = dict(stage_files or {})
        self.stage = ""
        self.step = 0
        self.stage_done = False
        self.written: Path | None = None
        self._partial: dict[str, Any] = {}

    @classmethod
    def for_run(
        cls, out_dir: Path, settings: RunSettings, *, header: Mapping[str, Any] | None = None
    ) -> Checkpointer:
        """The checkpointer of a run of ``settings``: its method, seed, ``checkpoint-every``
        and bound settings (``config.bound_settings``); ``header`` opens its result.json."""
        return cls(
            out_dir,
            method=settings.method,
            seed=settings.seed,
            every=settings.checkpoint_every,
            settings=bound_settings(settings.method, settings.values),
            header=header,
        )

    @property
    def path(self) -> Path:
        return self.out_dir / CHECKPOINT_FILE

    def due(self, snapshot: Snapshot) -> bool:
        """At a stage's end, or every ``every`` steps inside it."""
        if snapshot.arrays is None:
            return False
        return snapshot.stage_done or (
            self.every > 0 and snapshot.step > 0 and snapshot.step % self.every == 0
        )

    def __call__(self, snapshot: Snapshot) -> None:
        """Note where the run is; write a checkpoint and ``result.json`` when due."""
        self.stage, self.step, self.stage_done = snapshot.stage, snapshot.step, snapshot.stage_done
        if not self.due(snapshot):
            return
        assert snapshot.arrays is not None
        ledger = snapshot.ledger.summary()
        history = plain(snapshot.history)
        content = {
            "format": FORMAT,
            "method": self.method,
            "seed": self.seed,
            "space": dict(snapshot.space if snapshot.space is not None else self.space),
            "state_dict": state_dict_of(snapshot.arrays),
            "stage": snapshot.stage,
            "step": snapshot.step,
            "stage-done": snapshot.stage_done,
            "progress": plain(snapshot.progress),
            "history": history,
            "ledger": ledger,
            "settings": dict(self.settings),
        }
        self.written = atomic_save(content, self.path)
        name = self.stage_files.get(snapshot.stage)
        if snapshot.stage_done and name:
            atomic_save(content, self.out_dir / name)
        self._partial = {"history": history, "ledger": ledger}
        self.write_result()

    def status(
        self,
        *,
        finished: bool,
        error: BaseException | None = None,
        interrupted: str | None = None,
    ) -> dict[str, Any]:
        """Where the run is or stopped (``STATES``): ``state``, ``finished``, the stage, the
        steps done in it and whether it ended (a finished run's last stage did), the last
        checkpoint; a failed run's ``error`` (``error_text``), an interrupted one's
        ``interrupted_by`` (the signal's name, or what stopped it)."""
        state = (
            FINISHED
            if finished
            else INTERRUPTED
            if interrupted is not None
            else FAILED
            if error is not None
            else RUNNING
        )
        status: dict[str, Any] = {
            "state": state,
            "finished": finished,
            "stage": self.stage or None,
            "step": self.step,
            "stage_done": self.stage_done or finished,
            "checkpoint": self.written.name if self.written is not None else None,
        }
        if interrupted is not None:
            status["interrupted_by"] = interrupted
        if error is not None:
            status["error"] = error_text(error)
        return status

    def result(
        self,
        document: Mapping[str, Any] | None = None,
        *,
        finished: bool = False,
        error: BaseException | None = None,
        interrupted: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """What ``result.json`` holds (``results.result_json``): the header, ``status``, and
        ``document`` (else the last checkpoint's history and ledger)."""
        body = dict(document) if document is not None else dict(self._partial)
        status = self.status(finished=finished, error=error, interrupted=interrupted)
        return finite(result_json(plain({**self.header, "status": status, **extra, **body})))

    def write_result(
        self, document: Mapping[str, Any] | None = None, **options: Any
    ) -> dict[str, Any]:
        """Write ``result.json``: ``result(document, **options)`` (``finished``, ``error``,
        ``interrupted``, extra entries); returns what it wrote."""
        content = self.result(document, **options)
        write_json(self.out_dir / RESULT_FILE, content)
        return content


def read_resume(
    path: str,
    *,
    method: str,
    seed: int,
    reference: Mapping[str, torch.Tensor] | None,
    space: Mapping[str, Any] | None,
    key: str = "resume-from",
    settings: Mapping[str, Any] | None = None,
    stages: Mapping[str, int | None] | None = None,
) -> Resume:
    """A checkpoint to continue from, checked (``load_checkpoint``) against the run's
    space, ``method``, ``seed`` and (given) ``settings`` (``config.bound_settings``: every
    differing key is named), and checked in itself: with ``stages`` (stage -> its rounds,
    ``None``: a stage of counted items, no round bound) its stage must be one of them and
    its step within ``[0, rounds]``; the ledger's counters non-negative integers.

    A checkpoint without ``format`` is a Stage-1 ``supernet.pt`` of an earlier version
    (FedorAS only): a finished Stage 1, weights only, so no settings to compare.  One of
    format 1 records no settings: refused."""
    content = load_checkpoint(path, reference=reference, space=space, key=key)
    where = f"run config {key!r} = {str(path)!r}"
    if "format" not in content:
        if method != "fedoras" or content["stage"] != "supernet":
            raise ValueError(
                f"{where}: an old-format checkpoint of stage {content['stage']!r}; "
                "only a FedorAS Stage-1 supernet.pt of that format can be resumed"
            )
        content = {**content, "method": method, "seed": seed, "step": 0, "stage-done": True}
        settings = None
    elif content["format"] != FORMAT:
        raise ValueError(
            f"{where}: 'format' = {content['format']!r}, this version reads format {FORMAT} "
            "(format 1 records no run settings, so a resume cannot check that it continues "
            "the same configuration); start the run afresh"
        )
    for name, expected in (("method", method), ("seed", seed)):
        if content.get(name) != expected:
            raise ValueError(
                f"{where}: written by a run with {name} {content.get(name)!r}, this run has "
                f"{expected!r}; resume with the same {name}"
            )
    missing = [k for k in ("step", "stage-done") if k not in content]
    if missing:
        raise ValueError(f"{where}: lacks the entries {missing}")
    if settings is not None:
        saved = content.get("settings")
        plain = (str, int, float, bool, list)  # what a run config holds
        if not isinstance(saved, dict) or not all(
            isinstance(k, str) and isinstance(v, plain) for k, v in saved.items()
        ):
            raise ValueError(
                f"{where}: 'settings' = {saved!r}, expected a dict of run-config keys to "
                "values (text, numbers, true / false)"
            )
        check_bound_settings(where, saved, settings, method)
    stage, step, stage_done = content["stage"], content["step"], content["stage-done"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"{where}: 'step' = {step!r}, expected an integer >= 0")
    if not isinstance(stage_done, bool):
        raise ValueError(f"{where}: 'stage-done' = {stage_done!r}, expected true or false")
    if stages is not None:
        if stage not in stages:
            raise ValueError(
                f"{where}: 'stage' = {stage!r} is not a stage of {method}; allowed: "
                + ", ".join(map(repr, stages))
            )
        rounds = stages[stage]
        if rounds is not None and step > rounds:
            raise ValueError(
                f"{where}: 'step' = {step} of stage {stage!r}, which has {rounds} rounds; "
                f"allowed: 0..{rounds}"
            )
    reason = check_summary(content.get("ledger") or {})
    if reason is not None:
        raise ValueError(f"{where}: 'ledger' {reason}")
    return Resume(
        path=str(path),
        stage=str(stage),
        step=step,
        stage_done=stage_done,
        arrays=ArrayRecord(content["state_dict"]),
        progress=dict(content.get("progress") or {}),
        history=content.get("history") or [],
        ledger=dict(content.get("ledger") or {}),
    )
