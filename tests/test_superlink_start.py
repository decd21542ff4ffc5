"""A local SuperLink that missed Flower's 15-s start limit (a loaded machine) is started
again, a bounded number of times; Flower's error box is shown once, by the last try, and
the error names the cause on one line. ``flwr run`` is stood in for (no engine starts)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fedorasflwr.launch import FlowerRunError, flwr_cli, simulation

TOP = "\u256d\u2500 Error " + "\u2500" * 40 + "\u256e\n"
BOTTOM = "\u2570" + "\u2500" * 48 + "\u256f\n"


def _box(*lines: str) -> list[str]:
    return [TOP, *(f"\u2502 {line:<46} \u2502\n" for line in lines), BOTTOM]


MISSED = _box("Failed to start local SuperLink within 15s. See", "logs at /h/superlink.log.")
EXITED = _box("Failed to start local SuperLink: `flower-superlink`", "exited with code 3.")
STARTED = ["Starting local SuperLink on 127.0.0.1:9093...\n", "Successfully started run 7\n"]


def _stand_in(monkeypatch: pytest.MonkeyPatch, outputs: list[list[str]]) -> list[int]:
    """``flwr run`` answering each call with the next of ``outputs`` (its lines, echoed);
    exit code 0 once a run started, else 1. Returns the list of calls made."""
    calls: list[int] = []

    def stream(command: list[str], env: dict, timeout: float | None, echo: Callable) -> tuple:
        lines = outputs[len(calls)]
        calls.append(1)
        for line in lines:
            echo(line)
        started = any("Successfully started run" in line for line in lines)
        return (0 if started else 1), "".join(lines), 0.1

    monkeypatch.setattr(flwr_cli, "_stream_command", stream)
    monkeypatch.setattr(flwr_cli, "_run_status", lambda *args: ("finished:completed", ""))
    return calls


def _run(tmp_path: Path, seen: list[str]) -> object:
    return simulation.run_simulation(
        tmp_path, num_supernodes=2, flwr_home=tmp_path / "home", echo=seen.append
    )


def test_a_missed_start_limit_is_tried_again_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _stand_in(monkeypatch, [MISSED, MISSED, STARTED])
    seen: list[str] = []
    result = _run(tmp_path, seen)
    assert len(calls) == 3 and result.run_id == 7  # type: ignore[attr-defined]
    assert not any(line.startswith(TOP[0]) for line in seen)  # the retried boxes not shown
    notes = [line for line in seen if "trying again" in line]
    assert notes == [
        "Failed to start local SuperLink within 15s (a loaded machine?): trying again (2 of 3)\n",
        "Failed to start local SuperLink within 15s (a loaded machine?): trying again (3 of 3)\n",
    ]


def test_every_try_missed_the_limit_the_box_once_and_the_cause_on_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _stand_in(monkeypatch, [MISSED] * 5)
    seen: list[str] = []
    with pytest.raises(FlowerRunError) as info:
        _run(tmp_path, seen)
    assert len(calls) == simulation.SUPERLINK_START_ATTEMPTS == 3
    assert sum(line == TOP for line in seen) == 1  # the last try's box, shown once
    assert seen[-len(MISSED) :] == MISSED
    assert str(info.value) == (
        "`flwr run` failed to start the run (exit code 1): Failed to start local SuperLink "
        "within 15s. See logs at /h/superlink.log."
    )
    assert info.value.run_id is None


def test_a_start_that_failed_otherwise_is_not_tried_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _stand_in(monkeypatch, [EXITED, STARTED])
    seen: list[str] = []
    with pytest.raises(FlowerRunError, match="exited with code 3"):
        _run(tmp_path, seen)
    assert len(calls) == 1
    assert seen == EXITED


def test_box_text_reads_the_last_box_and_nothing_without_one() -> None:
    output = "".join(["\x1b[31m", *EXITED, "\x1b[0m", "between\n", *MISSED])
    assert flwr_cli.box_text(output).startswith("Failed to start local SuperLink within 15s.")
    assert flwr_cli.box_text("no box here\n") == ""
