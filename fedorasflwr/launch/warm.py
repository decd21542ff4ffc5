"""A warm ClientApp executor: one long-lived process per SuperNode that forks a task.

Flower 1.41 runs every ClientApp message in a fresh ``flwr-clientapp`` process: the
SuperNode's SuperExec (``flower-superexec``, ``flwr/supercore/superexec/run_superexec.py``)
polls the SuperNode's Runtime API for a task every second and its ``SubprocessExecutor``
(``executor/subprocess_executor.py``) starts ``flwr-clientapp``, which serves exactly one
task and exits (``flwr/supernode/runtime/run_clientapp.py``).  Each message so pays a
Python start, ``import torch`` and Flower's runtime imports before its handler runs.
Flower's warm executor pools (``executor/warm_executor_pool.py``) do not cover
ClientApps: they exist only for the Kubernetes executor and for AgentApp, Model and
Connector tasks.

This module stands in for ``flower-superexec`` next to a SuperNode started with
``--isolation process``, with ``flower-superexec``'s arguments: it imports torch and
Flower's ClientApp runtime once, then polls the Runtime API (``AcquireTask``, ClientApp
tasks only) through the interceptors ``flower-superexec`` installs (Flower's SuperExec
auth among them) and forks a child per task that runs Flower's own ``run_clientapp``
with the task's token, exactly what ``flwr-clientapp`` runs.  The child forgets the app
package (``fedorasflwr``) before it starts, so the app is imported from the FAB the task
names, as in a fresh process; the FAB is installed and the message pulled by the child,
as before.  The fork happens before torch has run anything in this process, so no OpenMP
or CUDA state is shared.  The Flower internals it uses are looked up at start
(`fedorasflwr.launch.warm_compat`): it exits naming them if a Flower release moved them.
Executors of SuperNodes that share a host may share `TaskSlots` (``--task-slots``): then
no more tasks run at once on the host than its cores can train without contention.

    fedorasflwr-clientapp-executor --runtime-api-address 127.0.0.1:9094 --insecure

(or ``python -m fedorasflwr.launch.warm ...``; docs/deployment.md, "Warm ClientApps on
your own SuperNodes").
"""

from __future__ import annotations

import fcntl
import importlib
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

from ..backoff import HeldBackoff, prompt_object_pulls
from .warm_apps import KeptApps, forget_package
from .warm_compat import (
    FlowerInternalsError,
    flower_version,
    flower_version_warning,
    load_flower_internals,
    refused_option,
    superexec_parser,
)

__all__ = [
    "ACTIVE_HOLD",
    "DEFAULT_POLL_INTERVAL",
    "DEFAULT_PRELOAD",
    "HELD_POLL_INTERVAL",
    "IDLE_POLL_INTERVAL",
    "TaskSlots",
    "WarmExecutor",
    "check_poll_interval",
    "forget_package",
    "main",
]

#: Seconds between two ``AcquireTask`` polls (Flower's ``flower-superexec``: 1.0), right after
#: a task; each poll that finds none doubles the wait, up to `HELD_POLL_INTERVAL` for
#: `ACTIVE_HOLD` seconds after a task came or ended, then up to `IDLE_POLL_INTERVAL`.
DEFAULT_POLL_INTERVAL = 0.1
#: The longest wait within `ACTIVE_HOLD` seconds of a task (or ``poll_interval`` if longer):
#: the next round's message usually comes within a round, and a wait grown to 1 s started
#: it 0.5 s late on average
HELD_POLL_INTERVAL = 0.2
#: Seconds after a task came or ended during which waits stay at most `HELD_POLL_INTERVAL`
ACTIVE_HOLD = 30.0
#: The longest wait between two polls of an idle executor (Flower's ``flower-superexec``
#: polls every 1.0 s): every poll costs CPU here and in the SuperNode that answers it, and a
#: deployment is idle most of its life (``python benchmarks/idle_cpu.py``).
IDLE_POLL_INTERVAL = 1.0
#: What the server imports once: torch and Flower's ClientApp runtime (the heavy part of
#: a ClientApp's start), not the app, which each task imports from its FAB; and
#: ``torch._dynamo``, which ``torch.optim.Optimizer.__init__`` imports the first time it runs
#: in a process: 1.7-2.1 CPU-s in every forked task when the parent has not imported it,
#: 0.005 s when it has (``python benchmarks/first_call.py``). It starts no thread, so the
#: fork stays safe (``tests/test_warm_executor.py``).
DEFAULT_PRELOAD = ("torch", "torch._dynamo", "flwr.supernode.runtime.run_clientapp")
#: The app's top-level package, forgotten in each child (see the module docstring); from
#: ``__package__``, which ``python -m`` keeps (``__name__`` is then ``__main__``).
APP_PACKAGE = (__package__ or "fedorasflwr").split(".", 1)[0]
#: Seconds a task may take to end on SIGTERM once the SuperNode is gone, then SIGKILL.
ORPHAN_GRACE = 2.0
#: What a SuperNode answers an ``AcquireTask`` whose SuperExec auth it refuses.
HTTP_UNAUTHORIZED = 401
#: When set, every task appends one JSON line of epoch stamps to this file: the fork and
#: the phases of Flower's ``run_clientapp`` (``benchmarks/engines.py`` reads it); unset,
#: nothing is wrapped.
TASK_TIMING_LOG_ENV = "FEDORASFLWR_TASK_TIMING_LOG"
#: Set to ``fresh``: the executor keeps no app between tasks, each task installs the FAB
#: and imports the app as a fresh ``flwr-clientapp`` does (``--fresh-app-imports``; the
#: engines benchmark's ``deployment-fresh-imports``)
WARM_APPS_ENV = "FEDORASFLWR_WARM_APPS"
#: ``run_clientapp``'s module-level steps the task timing wraps, in the order they run.
TIMED_STEPS = ("pull_task_input", "install_from_fab", "get_load_client_app_fn", "push_message")


def check_poll_interval(value: float) -> float:
    """The poll interval in seconds: a finite number in (0, 60]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"poll-interval: expected seconds as a number, got {value!r}")
    if not math.isfinite(value) or not 0 < value <= 60:
        raise ValueError(f"poll-interval: {value!r} is not in (0, 60] seconds")
    return float(value)


class _Stopped(BaseException):
    """SIGTERM or SIGINT while waiting for the Runtime API or between two polls (a
    BaseException: Flower's retries, which catch exceptions, must let it through)."""


class _RefusalWatch:
    """A Runtime API interceptor that remembers whether the SuperNode refused SuperExec
    auth (HTTP 401): Flower's retries then interrupt this process, as they do
    ``flower-superexec``, and the executor says why it stopped."""

    def __init__(self) -> None:
        self.refused = False

    def intercept(self, context: Any, call_next: Any) -> Any:
        response = call_next(context)
        if response.status_code == HTTP_UNAUTHORIZED:
            self.refused = True
        return response


class TaskSlots:
    """At most ``count`` ClientApp tasks at once among every executor that shares
    ``directory`` (the executors of one host's SuperNodes): a task runs holding an
    exclusive ``flock`` on one of the files ``slot-0`` .. ``slot-<count-1>``.

    The executor takes a slot before it asks its SuperNode for a task and gives it back
    if none came; with a task, the forked child inherits the locked file and holds the slot
    until it exits (the lock belongs to the open file, which the parent then closes). A
    task left waiting stays queued at its SuperNode, as Ray queues a simulated ClientApp
    until one of its CPUs is free. A process that dies releases its slot with its files.

    Parameters
    ----------
    directory : Path
        Created if missing; the same for every executor the limit spans.
    count : int
        Tasks at once, at least 1.
    """

    def __init__(self, directory: Path, count: int) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"task slots: {count!r}; expected an integer >= 1")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.count = count
        for index in range(count):  # an unusable directory fails here, not at the first task
            os.close(self._open(index))

    def _open(self, index: int) -> int:
        return os.open(self.directory / f"slot-{index}", os.O_RDWR | os.O_CREAT, 0o600)

    def take(self) -> int | None:
        """A file descriptor holding a free slot's lock (``os.close`` it to give the
        slot back), or ``None`` if all ``count`` are held."""
        for index in range(self.count):
            fd = self._open(index)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            except OSError:
                os.close(fd)
                raise
            return fd
        return None


class WarmExecutor:
    """Serve a SuperNode's ClientApp tasks from one warm process, one fork per task.

    Parameters
    ----------
    runtime_api_address : str
        The SuperNode's Runtime API (``host:port``, its ``--host`` / ``--port``).
    insecure : bool, default True
        Plain HTTP to the Runtime API; else TLS with ``root_certificates``.
    root_certificates : Path, optional
        CA certificate of the Runtime API's TLS (the SuperNode's ``--ssl-ca-certfile``).
    superexec_auth_secret : bytes, optional
        The SuperNode's SuperExec auth secret (``--superexec-auth-secret-file``): each
        ``AcquireTask`` is signed with it by Flower's ``SuperExecAuthHttpInterceptor``, as
        ``flower-superexec`` signs it. Default: not signed.
    parent_pid : int, optional
        Exit when this process (the SuperNode) is gone; default: run until SIGTERM /
        SIGINT.
    poll_interval : float, default 0.1
        Seconds between two polls for a task right after one came or ended; each poll that
        finds none doubles the wait, up to `HELD_POLL_INTERVAL` for `ACTIVE_HOLD` seconds,
        then up to `IDLE_POLL_INTERVAL` (each at least ``poll_interval``;
        `fedorasflwr.backoff.HeldBackoff`, in ``backoff``).
    preload : Sequence[str]
        Modules imported once, before the first fork.
    slots : TaskSlots, optional
        Run a task only while holding one of these slots (shared with the host's other
        executors); default: no limit.
    keep_apps : bool, default True
        Install each FAB once and keep its ClientApp imported between tasks
        (`fedorasflwr.launch.warm_apps`); False: every task installs the FAB and imports
        the app, as a fresh ``flwr-clientapp`` does.

    Raises
    ------
    FlowerInternalsError
        If the installed Flower lacks an internal the executor needs
        (`fedorasflwr.launch.warm_compat`).
    """

    def __init__(
        self,
        runtime_api_address: str,
        *,
        insecure: bool = True,
        root_certificates: Path | None = None,
        superexec_auth_secret: bytes | None = None,
        parent_pid: int | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        slots: TaskSlots | None = None,
        keep_apps: bool = True,
    ) -> None:
        if not runtime_api_address.strip():
            raise ValueError("runtime-api-address: empty; expected host:port")
        if insecure and root_certificates is not None:
            raise ValueError("root-certificates: not allowed with insecure (plain HTTP)")
        if not insecure and root_certificates is None:
            raise ValueError("root-certificates: required unless insecure")
        if superexec_auth_secret is not None and not superexec_auth_secret:
            raise ValueError("superexec-auth-secret: empty; expected the SuperNode's secret")
        self.runtime_api_address = runtime_api_address
        self.insecure = insecure
        self.certificates = None if root_certificates is None else root_certificates.read_bytes()
        self.superexec_auth_secret = superexec_auth_secret
        self.parent_pid = parent_pid
        self.poll_interval = check_poll_interval(poll_interval)
        self.backoff = HeldBackoff(
            self.poll_interval,
            2.0,
            max(HELD_POLL_INTERVAL, self.poll_interval),
            max(IDLE_POLL_INTERVAL, self.poll_interval),
            ACTIVE_HOLD,
        )
        self.preload = tuple(preload)
        self.slots = slots
        self.flower = load_flower_internals()
        self.apps = KeptApps(APP_PACKAGE, log=lambda line: print(line, flush=True))
        self.apps.enabled = keep_apps
        self.children: set[int] = set()
        self._reports: dict[int, int] = {}  # child pid -> read end of its report pipe
        self._report_fd: int | None = None  # (in a task) the write end of its own
        self._marks: dict[str, Any] = {}  # (in a task) its timing (`time_task_steps`)
        self.served = 0
        self.refusals = _RefusalWatch()
        self._stopping = False
        self._waiting = False

    @property
    def auth_refused(self) -> bool:
        """Whether the SuperNode refused this executor's SuperExec auth (it then stopped)."""
        return self.refusals.refused

    def interceptors(self, tracing: object) -> list[object]:
        """The Runtime API client's interceptors: ``flower-superexec``'s (``tracing``,
        Flower's version check, Flower's SuperExec auth when a secret is given), then
        the refusal watch."""
        flower = self.flower
        chain = [tracing, flower["RuntimeVersionHttpInterceptor"](component_name="SuperExec")]
        if self.superexec_auth_secret:
            chain.append(
                flower["SuperExecAuthHttpInterceptor"](
                    master_secret=self.superexec_auth_secret,
                    protected_methods=flower["_SUPEREXEC_AUTH_METHODS"],
                )
            )
        return [*chain, self.refusals]

    def serve(self, max_tasks: int | None = None) -> int:
        """Poll for tasks and fork one child each until stopped (SIGTERM / SIGINT, the
        parent gone, the SuperExec auth refused) or ``max_tasks`` children have finished;
        returns how many were forked."""
        flower = self.flower
        for module in self.preload:
            importlib.import_module(module)
        if self.parent_pid is not None:
            # Flower's client retries a lost Runtime API for ever: this ends the executor
            threading.Thread(target=self._exit_with_parent, daemon=True).start()
        tracing = flower["RuntimeTracingInterceptor"]()
        client = flower["RuntimeHttpClient.from_server_address"](
            server_address=self.runtime_api_address,
            insecure=self.insecure,
            root_certificates=self.certificates,
            interceptors=self.interceptors(tracing),
            retry_invoker=flower["make_simple_http_retry_invoker"](),
        )
        request = flower["AcquireTaskRequest"](
            supported_task_types=[flower["TaskType.CLIENT_APP"].value]
        )
        previous = {s: signal.signal(s, self._stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            while not self._stopping:
                if self._reap():  # what flower-superexec's `executor.reconcile()` is for
                    self.backoff.activity()  # a task ended: the next may come soon
                if max_tasks is not None and self.served >= max_tasks and not self.children:
                    break
                if self.parent_pid is not None and not _alive(self.parent_pid):
                    break
                if max_tasks is None or self.served < max_tasks:
                    polled = self._acquire(client, request, tracing)
                    if polled is True:
                        self.backoff.activity()
                        continue  # another task may be waiting already
                    if polled is None:  # every slot busy: one may free any moment
                        self.backoff.activity()
                self._interruptible(time.sleep, self.backoff.next_wait())
        except _Stopped:
            pass
        finally:
            flower["flush_traces"]()
            client.close()
            self._stop_children()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return self.served

    def next_wait(self, wait: float) -> float:
        """Deprecated (0.4): ``serve`` holds its waits short after a task (``backoff``).
        The wait after a poll that found no task, without the hold: twice ``wait``, at
        most `IDLE_POLL_INTERVAL` (or ``poll_interval``, where that is longer)."""
        warnings.warn(
            "WarmExecutor.next_wait is deprecated: serve() waits as WarmExecutor.backoff "
            "(fedorasflwr.backoff.HeldBackoff) says",
            DeprecationWarning,
            stacklevel=2,
        )
        return min(2 * wait, max(IDLE_POLL_INTERVAL, self.poll_interval))

    def _acquire(self, client: Any, request: Any, tracing: Any) -> bool | None:
        """Ask the SuperNode for a task and fork its child; whether one came (None: every
        slot was busy, the SuperNode not asked). With `slots`, only while holding a free
        slot, which the child keeps (the parent's copy of the locked file is closed either
        way)."""
        slot = None if self.slots is None else self.slots.take()
        if self.slots is not None and slot is None:
            return None  # every slot busy: the task waits at the SuperNode
        try:
            answer = self._interruptible(client.AcquireTask, request)
            if answer.HasField("task") and answer.token:
                self._dispatch(answer.token, answer.task, tracing)
                return True
            return False
        finally:
            if slot is not None:
                os.close(slot)

    def _dispatch(self, token: str, task: Any, tracing: Any) -> None:
        """Fork the task's child inside Flower's ``task.dispatch`` span, as
        ``flower-superexec`` launches its process inside it."""
        attributes = {
            "flwr.component": "superexec",
            "flwr.task_id": str(task.task_id),
            "flwr.run_id": str(task.run_id),
        }
        traceparent = tracing.take_task_traceparent(task.task_id)
        with self.flower["trace_span"](
            "task.dispatch", traceparent=traceparent, attributes=attributes
        ):
            pid = self._fork(token)
        print(f"[warm] task {task.task_id} of run {task.run_id}: process {pid}", flush=True)

    def _interruptible(self, call: Any, *args: Any) -> Any:
        """``call(*args)``, ended by `_Stopped` if SIGTERM / SIGINT comes meanwhile (a
        Runtime API lost or refusing is retried for minutes)."""
        self._waiting = True
        try:
            if self._stopping:
                raise _Stopped
            return call(*args)
        finally:
            self._waiting = False

    def _fork(self, token: str) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        read, write = os.pipe() if self.apps.enabled else (None, None)
        forked = time.time()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            self._marks = {"forked": forked, "child": time.time()}
            try:
                if read is not None:
                    os.close(read)
                self._report_fd = write
                code = self._run_task(token)
            except BaseException:  # noqa: BLE001 (the child must end here, whatever it raised)
                traceback.print_exc()
            finally:
                if os.environ.get(TASK_TIMING_LOG_ENV):
                    write_task_timing({**self._marks, **self.apps.task})
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        if write is not None:
            os.close(write)
            os.set_blocking(read, False)  # a process the task started may hold the write end
            self._reports[pid] = read
        self.children.add(pid)
        self.served += 1
        return pid

    def _run_task(self, token: str) -> int:
        """In the child: Flower's ``run_clientapp`` for one token; its exit code."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        self.apps.enter_task(self.flower, self._report_fd)
        prompt_task_pulls(self.flower)
        time_task_steps(self.flower, self._marks)
        try:
            self.flower["run_clientapp"](
                runtime_api_address=self.runtime_api_address,
                token=token,
                insecure=self.insecure,
                certificates=self.certificates,
                parent_pid=os.getppid(),
                runtime_dependency_install=False,
            )
        except SystemExit as ended:  # run_clientapp ends with flwr_exit
            return ended.code if isinstance(ended.code, int) else int(ended.code is not None)
        return 0

    def _reap(self) -> int:
        """Collect the children that ended; how many did."""
        ended = 0
        for pid in list(self.children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                ended += 1
                self.children.discard(pid)
                code = os.waitstatus_to_exitcode(status)
                report = self._read_report(pid)
                if code != 0:
                    print(f"[warm] ClientApp task process {pid} exited with {code}", flush=True)
                elif report:
                    self.apps.learn(report)
        return ended

    def _read_report(self, pid: int) -> bytes:
        """What the ended task ``pid`` reported (`fedorasflwr.launch.warm_apps`); empty if
        nothing. Never blocks: the task wrote it before it ended, and a process the task
        started that still holds the pipe's write end must not stall the executor."""
        fd = self._reports.pop(pid, None)
        if fd is None:
            return b""
        chunks = []
        try:
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        except BlockingIOError:
            pass  # no end of file yet: something the task started holds the write end
        finally:
            os.close(fd)
        return b"".join(chunks)

    def _exit_with_parent(self) -> None:
        """(A thread) once the parent is gone: end the running tasks (they cannot reach
        it any more; Flower's client would retry for minutes), then exit."""
        assert self.parent_pid is not None
        while _alive(self.parent_pid):
            time.sleep(0.2)
        print(f"[warm] parent {self.parent_pid} is gone: stopping", flush=True)
        running = list(self.children)
        for pid in running:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + ORPHAN_GRACE
        while any(_alive(pid) for pid in running) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in running:
            _signal(pid, signal.SIGKILL)
        os._exit(0)

    def _stop(self, _signum: int, _frame: FrameType | None) -> None:
        self._stopping = True
        if self._waiting:
            raise _Stopped

    def _stop_children(self, grace: float = 10.0) -> None:
        for pid in self.children:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.children and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.05)
        for pid in self.children:
            _signal(pid, signal.SIGKILL)
        for pid in list(self.children):
            os.waitpid(pid, 0)
            self.children.discard(pid)


def prompt_task_pulls(flower: dict[str, Any]) -> None:
    """Have ``run_clientapp`` (of ``flower``, `load_flower_internals`'s) pull its message's
    objects retrying a missing one after 0.05 s instead of Flower's 1 s: the SuperNode
    offers the task before it holds them (`fedorasflwr.backoff.prompt_object_pulls`). In a
    task's process (the executor's own is left as it is)."""
    module = importlib.import_module(flower["run_clientapp"].__module__)
    module.pull_and_inflate_object_from_tree = prompt_object_pulls(
        flower["pull_and_inflate_object_from_tree"]
    )


def time_task_steps(flower: dict[str, Any], marks: dict[str, Any]) -> None:
    """With ``$FEDORASFLWR_TASK_TIMING_LOG`` set, in a task's process: wrap the steps of
    ``run_clientapp`` named in `TIMED_STEPS` (``get_load_client_app_fn``: the loader it
    returns) so that each stamps its start and end (``time.time()``) into ``marks``;
    unset, nothing is wrapped. A step Flower no longer has is left out (the timing is a
    measurement, not a dependency)."""
    if not os.environ.get(TASK_TIMING_LOG_ENV):
        return
    module = importlib.import_module(flower["run_clientapp"].__module__)

    def stamped(name: str, step: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            marks[f"{name}-start"] = time.time()
            try:
                return step(*args, **kwargs)
            finally:
                marks[f"{name}-end"] = time.time()

        return run

    def stamped_loader(get_loader: Any) -> Any:
        return lambda *args, **kwargs: stamped("load_client_app", get_loader(*args, **kwargs))

    for name in TIMED_STEPS:
        step = getattr(module, name, None)
        if step is not None:
            wrap = stamped_loader if name == "get_load_client_app_fn" else partial(stamped, name)
            setattr(module, name, wrap(step))


def write_task_timing(marks: dict[str, Any]) -> None:
    """Append ``marks`` (`time_task_steps`'s, with what `KeptApps` did: ``fab_reused``,
    ``app_kept``) with this process's pid and the end as one JSON line to
    ``$FEDORASFLWR_TASK_TIMING_LOG``."""
    record = {"pid": os.getpid(), **marks, "end": time.time()}
    with open(os.environ[TASK_TIMING_LOG_ENV], "a", encoding="utf-8") as sink:
        sink.write(json.dumps(record) + "\n")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (killed, not yet reaped by its parent) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return True  # no /proc: os.kill's answer
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run the executor (``fedorasflwr-clientapp-executor``); its exit status: 0 once
    stopped by SIGTERM / SIGINT or its parent's end, 1 if the installed Flower lacks an
    internal it needs or the SuperNode refused its SuperExec auth, 2 for bad arguments."""
    parser = superexec_parser("fedorasflwr-clientapp-executor")
    parser.add_argument(
        "--poll-interval", type=float, default=DEFAULT_POLL_INTERVAL, help="seconds"
    )
    parser.add_argument(
        "--preload",
        default=",".join(DEFAULT_PRELOAD),
        help="comma-separated modules imported once before the first task",
    )
    parser.add_argument(
        "--fresh-app-imports",
        action="store_true",
        default=os.environ.get(WARM_APPS_ENV) == "fresh",
        help="every task installs the FAB and imports the app itself (default: once per FAB, "
        f"kept between tasks; also ${WARM_APPS_ENV}=fresh)",
    )
    parser.add_argument(
        "--task-slots",
        type=int,
        default=0,
        help="at most this many ClientApp tasks at once among the executors that share "
        "--task-slots-dir (0: no limit)",
    )
    parser.add_argument(
        "--task-slots-dir", type=Path, default=None, help="the slots' directory (with --task-slots)"
    )
    args = parser.parse_args(argv)
    if refused := refused_option(args):
        parser.error(refused)
    if args.task_slots < 0:
        parser.error(f"task-slots: {args.task_slots}; expected an integer >= 0 (0: no limit)")
    if args.task_slots and args.task_slots_dir is None:
        parser.error("task-slots: needs --task-slots-dir (a directory the host's executors share)")
    if args.task_slots_dir is not None and not args.task_slots:
        parser.error("task-slots-dir: given without --task-slots (a count >= 1)")
    try:
        flower = load_flower_internals()
    except FlowerInternalsError as error:
        print(f"[warm] {error}", file=sys.stderr, flush=True)
        return 1
    if warning := flower_version_warning():
        print(f"[warm] warning: {warning}", file=sys.stderr, flush=True)
    secret = None
    if args.superexec_auth_secret_file is not None:
        try:
            secret = flower["load_superexec_auth_secret"](
                secret_file=args.superexec_auth_secret_file
            )
        except ValueError as error:
            parser.error(f"superexec-auth-secret-file: {error}")
    try:
        executor = WarmExecutor(
            args.runtime_api_address,
            insecure=args.insecure,
            root_certificates=args.root_certificates,
            superexec_auth_secret=secret,
            parent_pid=args.parent_pid,
            poll_interval=args.poll_interval,
            preload=[m for m in args.preload.split(",") if m.strip()],
            slots=TaskSlots(args.task_slots_dir, args.task_slots) if args.task_slots else None,
            keep_apps=not args.fresh_app_imports,
        )
    except (ValueError, OSError) as error:
        parser.error(str(error))
    auth = "signed" if secret else "unsigned"
    limit = "; each task imports its app" if args.fresh_app_imports else ""
    if args.task_slots:
        limit += f"; {args.task_slots} task(s) at once in {args.task_slots_dir}"
    print(
        f"[warm] serving ClientApp tasks of {args.runtime_api_address} "
        f"(Flower {flower_version()}, {auth} AcquireTask{limit})",
        flush=True,
    )
    served = executor.serve()
    if executor.auth_refused:
        print(
            f"[warm] the SuperNode at {args.runtime_api_address} refused this executor's "
            "SuperExec auth (HTTP 401): pass --superexec-auth-secret-file with the file "
            "the SuperNode was started with",
            file=sys.stderr,
            flush=True,
        )
        return 1
    print(f"[warm] stopped after {served} task(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
