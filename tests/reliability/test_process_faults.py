"""Process faults of the launcher: a terminating signal stops everything it started.

``python -m fedorasflwr.launch`` stopped with SIGTERM (or SIGHUP) takes Ctrl-C's path:
`fedorasflwr.launch.stop_on_signals` raises `Stopped` (a ``KeyboardInterrupt``), every
Flower process started (``flwr run``, the SuperLink, the SuperExec, the simulation
process, Ray) is stopped, nothing trains or writes afterwards, and the message names the
run directory and the command that resumes it.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fedorasflwr.checkpoints import CHECKPOINT_FILE
from fedorasflwr.launch import (
    Stopped,
    cli,
    find_pids,
    flwr_cli,
    format_run_config,
    processes,
    stop_on_signals,
    stop_pids,
)
from fedorasflwr.launch.processes import held_signals
from fedorasflwr.progress import RESULTS_MESSAGE
from tests.runconfig import ROOT, tiny_fedoras

#: runs the launcher as a child subreaper (``prctl``, kept across ``exec``): processes
#: Flower detaches (the local SuperLink outlives ``flwr run``'s session) stay its
#: descendants, so the test sees every process the launcher started by its parent links
SUBREAPER_EXEC = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'fedorasflwr.launch', *sys.argv[1:]])\n"
)


def _descendants(pid: int) -> dict[int, str]:
    """Every living descendant of ``pid`` (by /proc parent links): PID -> start time."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            parent = processes._parent_pid(int(entry.name))
            children.setdefault(parent, []).append(int(entry.name))
    found: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        if processes._is_alive(child):
            found[child] = _start_time(child)
        todo += children.get(child, [])
    return found


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks (PID reuse shows as another value)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return ""


def _command_line(pid: int) -> str:
    try:
        return processes._cmdline(Path(f"/proc/{pid}"))
    except OSError:
        return ""


def _still_running(snapshot: dict[int, str]) -> list[int]:
    return [
        pid
        for pid, start in snapshot.items()
        if _start_time(pid) == start and processes._is_alive(pid)
    ]


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: relative path -> (size, mtime in ns)."""
    out = {}
    for path in root.rglob("*"):
        try:
            if path.is_file():
                stat = path.stat()
                out[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
        except OSError:  # removed while listed
            continue
    return out


@pytest.mark.slow
def test_sigterm_stops_every_process_the_launcher_started(tmp_path: Path, data_cache: Path) -> None:
    out = tmp_path / "out"
    home = out / "flwr-home"
    config = tiny_fedoras(
        data_cache,
        **{
            "fedoras.rounds": 4,
            "fedoras.clients-per-round": 2,
            "fedoras.min-replies": 1,
            "checkpoint-every": 1,  # a checkpoint.pt after the first round
            "output-dir": str(out),
        },
    )
    argv = ["--app-dir", str(ROOT), "--num-supernodes", "2"]
    argv += ["--flwr-home", str(home), "--run-config", format_run_config(config)]
    launcher = subprocess.Popen(
        [sys.executable, "-c", SUBREAPER_EXEC, *argv],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the test stops the whole tree if it fails
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(launcher.stdout), daemon=True)
    reader.start()
    try:
        checkpoint = None
        deadline = time.monotonic() + 600
        while checkpoint is None and launcher.poll() is None and time.monotonic() < deadline:
            found = list(out.glob("fedoras-*/checkpoint.pt"))
            checkpoint = found[0] if found else None
            time.sleep(0.2)
        assert checkpoint is not None, "".join(lines[-40:])
        started = _descendants(launcher.pid)
        names = " | ".join(_command_line(pid) for pid in started)
        # the SuperLink: Flower's, through the launcher's entry point (its heartbeat timeout)
        for started_by_flower in ("flwr run", "fedorasflwr.launch.superlink", "flower-superexec"):
            assert started_by_flower in names, names

        launcher.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = launcher.wait(timeout=120)
        took = time.monotonic() - sent
        stderr = launcher.stderr.read()
        reader.join(timeout=10)
        # every process it started is gone when it exits (all groups signalled at once and
        # waited on together), and none of Flower's is left under its home
        left = {pid: _command_line(pid) for pid in _still_running(started)}
        assert left == {}, stderr
        assert took < 10.0, f"the launcher exited {took:.1f} s after SIGTERM"
        assert find_pids(flwr_home=home) == []
        assert code == 128 + signal.SIGTERM, stderr
        # nothing trains or writes after the launcher's exit
        before = _files(out)
        time.sleep(3.0)
        assert _files(out) == before

        # the message names the run directory and the exact command that resumes it
        run_dir = checkpoint.parent
        assert "interrupted by SIGTERM" in stderr
        assert f"run directory: {run_dir}" in stderr
        command = stderr.strip().splitlines()[-1]
        words = shlex.split(command)
        assert words[:3] == ["cd", str(tmp_path), "&&"]
        assert words[3:6] == [sys.executable, "-m", "fedorasflwr.launch"]
        assert words[6:-2] == argv
        assert words[-2] == "--run-config"
        assert cli.read_run_config([words[-1]]) == {"resume-from": str(checkpoint)}
    finally:
        if launcher.poll() is None:
            stop_pids([launcher.pid], grace=5.0)
        stop_pids(find_pids(flwr_home=home), grace=5.0)


# --- the signal path, without an engine ----------------------------------------------------


def _signal_self(signum: signal.Signals) -> None:
    """``signum`` to this (main) thread: ``os.kill(os.getpid())`` may be delivered to any of
    the worker's threads (torch's, a gRPC channel's left by an earlier test), and the main
    thread's sleep can then run to its end before the handler does: the likely cause of
    these tests failing in a clean-clone CI run, not proven."""
    signal.pthread_kill(threading.main_thread().ident, signum)


def _wait_for_signal(seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)  # the handler raises in here
    raise AssertionError("the signal did not arrive")


@pytest.fixture
def default_signals():
    """SIGINT, SIGTERM and SIGHUP at their default handling for the test, then back: a
    suite started in the background (``cmd &`` ignores SIGINT) or under ``nohup`` (SIGHUP)
    inherits them ignored, and the launcher rightly leaves an ignored signal ignored
    (``test_a_signal_ignored_before_stays_ignored``), so these tests would see nothing."""
    names = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {signum: signal.getsignal(signum) for signum in names}
    for signum in names:
        if before[signum] is signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
@pytest.mark.usefixtures("default_signals")
def test_every_terminating_signal_raises_stopped_like_ctrl_c(signum: signal.Signals) -> None:
    previous = signal.getsignal(signum)
    with stop_on_signals():
        with pytest.raises(Stopped) as caught:
            _signal_self(signum)
            _wait_for_signal()
    assert isinstance(caught.value, KeyboardInterrupt)  # every Ctrl-C clean-up path runs
    assert caught.value.signum == signum and caught.value.name == signum.name
    assert signal.getsignal(signum) == previous


def test_a_signal_ignored_before_stays_ignored() -> None:
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with stop_on_signals():
            _signal_self(signal.SIGHUP)
            time.sleep(0.2)  # nothing raised: the run goes on after the terminal closed
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    except Stopped:
        pytest.fail("SIGHUP was ignored (nohup) before the launcher started: it must stay so")
    finally:
        signal.signal(signal.SIGHUP, previous)


@pytest.mark.usefixtures("default_signals")
def test_a_signal_while_processes_are_stopped_waits_for_the_step_to_end() -> None:
    steps: list[str] = []
    with stop_on_signals():
        with pytest.raises(Stopped):
            with held_signals():
                _signal_self(signal.SIGTERM)
                time.sleep(0.3)
                steps.append("stopped every process")
    assert steps == ["stopped every process"]


@pytest.mark.usefixtures("default_signals")
def test_later_signals_cannot_cut_the_clean_up_short(capfd: pytest.CaptureFixture[str]) -> None:
    with stop_on_signals():
        try:
            _signal_self(signal.SIGTERM)
            _wait_for_signal()
        except Stopped:
            _signal_self(signal.SIGINT)  # a second Ctrl-C while stopping
            _signal_self(signal.SIGTERM)
            time.sleep(0.3)  # nothing raised: the clean-up goes on
    assert "SIGINT: still stopping the Flower processes" in capfd.readouterr().err


#: ``flwr run`` as the tests stand it in: it ignores SIGTERM (as a busy process would, for the
#: whole grace) and has detached a child into a session of its own, as ``flwr run`` does
#: the local SuperLink; the child ignores SIGTERM too and inherits ``FLWR_HOME``
FLOWER_STAND_IN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'], start_new_session=True)\n"
    "print('ready', child.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_signal_stops_flwr_run_and_its_detached_children_in_one_grace(tmp_path: Path) -> None:
    home = tmp_path / "flwr-home"
    env = dict(os.environ) | {"FLWR_HOME": str(home)}
    started: list[int] = []
    signalled: list[float] = []

    def echo(line: str) -> None:  # the launcher's echo: signal it once the child runs
        if line.startswith("ready"):
            started.append(int(line.split()[1]))
            signalled.append(time.monotonic())
            _signal_self(signal.SIGTERM)

    command = [sys.executable, "-c", FLOWER_STAND_IN]
    with stop_on_signals():
        with pytest.raises(Stopped):
            flwr_cli._stream_command(command, env, timeout=60.0, echo=echo)
    stopped_after = time.monotonic() - signalled[0]
    # both groups got SIGTERM at once, one grace for both, then SIGKILL: none is left
    assert not processes._is_alive(started[0])
    assert find_pids(flwr_home=home) == []
    assert stopped_after < processes.STOP_GRACE + 1.5, stopped_after


# --- the interrupt message ------------------------------------------------------------------


def test_the_run_directory_is_read_from_the_server_app_line() -> None:
    seen: list[str] = []
    watch = cli._RunWatch(seen.append)
    line = (
        "\x1b[92mINFO \x1b[0m:      " + RESULTS_MESSAGE % ("fedoras", "/o u/fedoras-x-run7") + "\n"
    )
    watch("INFO :      [stage1] round 1/2: loss 2.3\n")
    assert watch.run_dir is None
    watch(line)
    assert watch.run_dir == Path("/o u/fedoras-x-run7")
    assert seen[-1] == line  # the line is still echoed


def test_the_interrupt_message_names_the_resume_command(tmp_path: Path) -> None:
    run_dir = tmp_path / "out" / "fedoras-20260101-000000-run5"
    argv = ["--run-config", "configs/quick-fedoras.toml", "--run-config", 'seed=3 x="a b"']
    values = {"seed": 3, "fedoras.resume-from": "/old/supernet.pt"}

    assert cli.CHECKPOINT_FILE == CHECKPOINT_FILE  # the name the Checkpointer writes
    nothing = cli.interrupt_message(Stopped(signal.SIGHUP), None, argv, values, tmp_path)
    assert "interrupted by SIGHUP" in nothing and "nothing to resume" in nothing
    run_dir.mkdir(parents=True)
    fresh = cli.interrupt_message(KeyboardInterrupt(), run_dir, argv, values, tmp_path)
    assert "interrupted by SIGINT" in fresh and "starts the run over" in fresh
    (run_dir / "checkpoint.pt").write_bytes(b"x")
    text = cli.interrupt_message(Stopped(signal.SIGTERM), run_dir, argv, values, tmp_path)
    assert f"run directory: {run_dir}" in text
    words = shlex.split(text.splitlines()[-1])
    assert words[:6] == ["cd", str(tmp_path), "&&", sys.executable, "-m", "fedorasflwr.launch"]
    assert words[6:-2] == argv and words[-2] == "--run-config"
    # the older fedoras.resume-from is emptied: it may not differ from resume-from
    assert cli.read_run_config([words[-1]]) == {
        "resume-from": str(run_dir / "checkpoint.pt"),
        "fedoras.resume-from": "",
    }
