"""Processes: free loopback ports, finding PIDs through /proc, stopping process groups,
and turning terminating signals into the clean-up path of Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

__all__ = [
    "LOOPBACK",
    "STOP_GRACE",
    "TERMINATING_SIGNALS",
    "Stopped",
    "find_pids",
    "free_port",
    "held_signals",
    "stop_on_signals",
    "stop_pids",
]

LOOPBACK = "127.0.0.1"


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
    if cmdline_contains is not None and not cmdline_contains.strip():
        raise ValueError("find_pids: an empty command-line pattern would match every process")
    if flwr_home is not None and not flwr_home.is_absolute():
        raise ValueError(f"find_pids: FLWR_HOME must be an absolute path, got {str(flwr_home)!r}")
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


#: seconds the launcher's processes get between SIGTERM and SIGKILL: what they must write
#: is written atomically as they go (checkpoints, result.json), so they need no more, and
#: the launcher exits within about this long of a signal, under load too
STOP_GRACE = 3.0
#: seconds between two looks for processes started while the others are being stopped
_RESCAN_INTERVAL = 0.25


def stop_pids(
    pids: Iterable[int], *, grace: float = STOP_GRACE, flwr_home: Path | None = None
) -> None:
    """Stop processes all at once: SIGTERM every one (its whole group when it leads one),
    wait on them and their groups together for at most `grace` seconds, then SIGKILL
    what is left, a group's members included when its leader is already gone.

    Parameters
    ----------
    pids : Iterable[int]
        Processes to stop.
    grace : float, default `STOP_GRACE`
        Seconds, counted once for all of them, between SIGTERM and SIGKILL.
    flwr_home : Path, optional
        Also every process started with this ``FLWR_HOME`` (or one below it) or logging
        under its ``local-superlink/`` (`find_pids`), looked for again while waiting, so
        that a child spawned meanwhile is stopped with the rest. Must be absolute.
    """
    find = _flower_finder(flwr_home)
    given = list(pids)
    signalled: set[int] = set()
    groups: set[int] = set()  # groups led by a process signalled: they outlive their leader

    def sweep(signum: signal.Signals, *, fresh_only: bool = False) -> None:
        targets = {pid for pid in given if _is_alive(pid)} | set(find())
        targets = targets - signalled if fresh_only else targets | set(running())
        for pid in sorted(targets):
            if _leads_group(pid):
                groups.add(pid)
            _signal(pid, signum)
        if signum == signal.SIGKILL:
            for group in groups:
                _signal_group(group, signum)
        signalled.update(targets)

    def running() -> list[int]:
        return sorted({pid for pid in signalled if _is_alive(pid)} | set(_members(groups)))

    with held_signals():  # a SIGTERM now must not leave half of them running
        sweep(signal.SIGTERM)
        deadline = time.monotonic() + grace
        rescan = time.monotonic() + _RESCAN_INTERVAL
        while running() and time.monotonic() < deadline:
            time.sleep(0.1)
            if time.monotonic() >= rescan:  # a late child: SIGTERM, into the same wait
                sweep(signal.SIGTERM, fresh_only=True)
                rescan = time.monotonic() + _RESCAN_INTERVAL
        for _ in range(5):  # SIGKILL whatever is left, children spawned meanwhile too
            sweep(signal.SIGKILL)
            # a zombie counts as gone: it runs nothing and holds no port, and an orphan's
            # is reaped by init when init gets to it (up to 2 s here, in a microVM)
            _wait_gone(running, timeout=1.0)
            if not running() and not find():
                break


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid and pid != os.getpgrp()
    except ProcessLookupError:
        return False


def _signal_group(group: int, signum: signal.Signals) -> None:
    """Signal every process of `group`, its leader gone or not (never our own group)."""
    if group == os.getpgrp():
        return
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _members(groups: set[int]) -> list[int]:
    """The running processes whose process group is one of `groups`."""
    if not groups:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) in groups and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def _flower_finder(flwr_home: Path | None) -> Callable[[], list[int]]:
    """What `stop_pids` looks for besides its PIDs: Flower's processes under `flwr_home`.

    `flwr_home` must be absolute: a relative or empty one would turn the pattern into
    ``local-superlink/``, which matches every local SuperLink on the machine."""
    if flwr_home is None:
        return list
    if not flwr_home.is_absolute() or flwr_home == Path("/"):
        raise ValueError(f"refusing to stop processes under FLWR_HOME {str(flwr_home)!r}")
    log_dir = str(flwr_home / "local-superlink") + os.sep
    return lambda: find_pids(cmdline_contains=log_dir, flwr_home=flwr_home)


def _wait_gone(running: Callable[[], list[int]], timeout: float) -> None:
    """Wait until `running` names no process (zombies count as gone), at most `timeout` s."""
    deadline = time.monotonic() + timeout
    while running() and time.monotonic() < deadline:
        time.sleep(0.02)


def _stop_flower_processes(flwr_home: Path, *, grace: float = STOP_GRACE) -> None:
    """Stop everything Flower started under `flwr_home`, children spawned late included
    (`stop_pids` with `flwr_home`)."""
    stop_pids([], grace=grace, flwr_home=flwr_home)


# ------------------------------------------------------------------ terminating signals

#: the signals that end a launcher: Ctrl-C, ``kill`` / a scheduler / systemd, a closed
#: terminal or SSH session
TERMINATING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """A terminating signal arrived: raised in the main thread like Ctrl-C's
    ``KeyboardInterrupt`` (a subclass of it), so every ``finally`` and ``except
    KeyboardInterrupt`` that stops Flower processes runs for SIGTERM and SIGHUP too.

    Attributes
    ----------
    signum : int
        The signal's number; a launcher exits with ``128 + signum`` (the shell's
        convention: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP).
    """

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        self.name = signal.Signals(signum).name
        super().__init__(self.name)


class _SignalState:
    """What `stop_on_signals` knows: a signal held back by `held_signals`, and whether
    the clean-up has begun (later signals are then ignored)."""

    def __init__(self) -> None:
        self.holding = 0
        self.pending: int | None = None
        self.stopping = False


_STATE = _SignalState()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _STATE.stopping:
        name = signal.Signals(signum).name
        os.write(2, f"\n{name}: still stopping the Flower processes, please wait\n".encode())
        return
    if _STATE.holding:
        _STATE.pending = _STATE.pending or signum  # raised when the clean-up step ends
        return
    _STATE.stopping = True
    raise Stopped(signum)


@contextmanager
def stop_on_signals(signals: Iterable[signal.Signals] = TERMINATING_SIGNALS) -> Iterator[None]:
    """Within: the first of ``signals`` raises `Stopped` in the main thread; later ones
    are ignored (with a line on stderr), so a second Ctrl-C or a repeated SIGTERM cannot
    cut the clean-up short and leave processes running. One that arrives while a process
    is being stopped (`held_signals`) is raised when that step ends. The previous
    handlers come back on exit. A signal ignored on entry stays ignored (``nohup`` ignores
    SIGHUP; a shell's background job, SIGINT). Call it from the main thread (Python runs
    signal handlers there only).

    Without it, Python's default for SIGTERM and SIGHUP ends the process at once, no
    ``finally`` run: the detached SuperLink, its SuperExec, the simulation process and
    Ray kept training and writing files.
    """
    previous = {
        signum: signal.signal(signum, _on_signal)
        for signum in signals
        if signal.getsignal(signum) is not signal.SIG_IGN  # nohup's SIGHUP stays ignored
    }
    _STATE.pending, _STATE.stopping = None, False
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
        _STATE.pending, _STATE.stopping = None, False


@contextmanager
def held_signals() -> Iterator[None]:
    """Within (e.g. while processes are being stopped): a terminating signal caught by
    `stop_on_signals` is kept and raised as `Stopped` at the end, not in the middle."""
    _STATE.holding += 1
    try:
        yield
    finally:
        _STATE.holding -= 1
        if not _STATE.holding and _STATE.pending is not None and not _STATE.stopping:
            signum, _STATE.pending, _STATE.stopping = _STATE.pending, None, True
            raise Stopped(signum)
