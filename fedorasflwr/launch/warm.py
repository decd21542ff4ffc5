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
``--isolation process``: it imports torch and Flower's ClientApp runtime once, then
polls the Runtime API (``AcquireTask``, ClientApp tasks only) and forks a child per
task that runs Flower's own ``run_clientapp`` with the task's token, exactly what
``flwr-clientapp`` runs.  The child forgets the app package (``fedorasflwr``) before it
starts, so the app is imported from the FAB the task names, as in a fresh process; the
FAB is installed and the message pulled by the child, as before.  The fork happens
before torch has run anything in this process, so no OpenMP or CUDA state is shared.

    python -m fedorasflwr.launch.warm --runtime-api-address 127.0.0.1:9094 --insecure \
        --parent-pid <supernode pid>
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

__all__ = ["DEFAULT_POLL_INTERVAL", "DEFAULT_PRELOAD", "WarmExecutor", "check_poll_interval"]

#: Seconds between two ``AcquireTask`` polls (Flower's ``flower-superexec``: 1.0).
DEFAULT_POLL_INTERVAL = 0.1
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


def check_poll_interval(value: float) -> float:
    """The poll interval in seconds: a finite number in (0, 60]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"poll-interval: expected seconds as a number, got {value!r}")
    if not math.isfinite(value) or not 0 < value <= 60:
        raise ValueError(f"poll-interval: {value!r} is not in (0, 60] seconds")
    return float(value)


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
    parent_pid : int, optional
        Exit when this process (the SuperNode) is gone.
    poll_interval : float, default 0.1
        Seconds between two polls for a task.
    preload : Sequence[str]
        Modules imported once, before the first fork.
    """

    def __init__(
        self,
        runtime_api_address: str,
        *,
        insecure: bool = True,
        root_certificates: Path | None = None,
        parent_pid: int | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        preload: Sequence[str] = DEFAULT_PRELOAD,
    ) -> None:
        if not runtime_api_address.strip():
            raise ValueError("runtime-api-address: empty; expected host:port")
        if insecure and root_certificates is not None:
            raise ValueError("root-certificates: not allowed with insecure (plain HTTP)")
        if not insecure and root_certificates is None:
            raise ValueError("root-certificates: required unless insecure")
        self.runtime_api_address = runtime_api_address
        self.insecure = insecure
        self.certificates = None if root_certificates is None else root_certificates.read_bytes()
        self.parent_pid = parent_pid
        self.poll_interval = check_poll_interval(poll_interval)
        self.preload = tuple(preload)
        self.children: set[int] = set()
        self.served = 0
        self._stopping = False

    def serve(self, max_tasks: int | None = None) -> int:
        """Poll for tasks and fork one child each until stopped (SIGTERM / SIGINT, the
        parent gone) or ``max_tasks`` children have finished; returns how many were forked."""
        from flwr.proto.runtime_pb2 import AcquireTaskRequest
        from flwr.supercore.constant import TaskType
        from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
        from flwr.supercore.retry import make_simple_http_retry_invoker
        from flwr.supercore.runtime import RuntimeHttpClient

        for module in self.preload:
            importlib.import_module(module)
        if self.parent_pid is not None:
            # Flower's client retries a lost Runtime API for ever: this ends the executor
            threading.Thread(target=self._exit_with_parent, daemon=True).start()
        previous = {s: signal.signal(s, self._stop) for s in (signal.SIGTERM, signal.SIGINT)}
        client = RuntimeHttpClient.from_server_address(
            server_address=self.runtime_api_address,
            insecure=self.insecure,
            root_certificates=self.certificates,
            interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
            retry_invoker=make_simple_http_retry_invoker(),
        )
        request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP.value])
        try:
            while not self._stopping:
                self._reap()
                if max_tasks is not None and self.served >= max_tasks and not self.children:
                    break
                if self.parent_pid is not None and not _alive(self.parent_pid):
                    break
                if max_tasks is None or self.served < max_tasks:
                    answer = client.AcquireTask(request)
                    if answer.HasField("task") and answer.token:
                        self._fork(answer.token)
                        continue  # another task may be waiting already
                time.sleep(self.poll_interval)
        finally:
            client.close()
            self._stop_children()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return self.served

    def _fork(self, token: str) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                code = self._run_task(token)
            except BaseException:  # noqa: BLE001 (the child must end here, whatever it raised)
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.children.add(pid)
        self.served += 1

    def _run_task(self, token: str) -> int:
        """In the child: Flower's ``run_clientapp`` for one token; its exit code."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        forget_package(APP_PACKAGE)
        from flwr.supernode.runtime.run_clientapp import run_clientapp

        try:
            run_clientapp(
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

    def _reap(self) -> None:
        for pid in list(self.children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                self.children.discard(pid)
                code = os.waitstatus_to_exitcode(status)
                if code != 0:
                    print(f"[warm] ClientApp task process {pid} exited with {code}", flush=True)

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


def forget_package(package: str) -> list[str]:
    """Drop ``package`` and its submodules from ``sys.modules`` (the next import reads
    them again, from wherever ``sys.path`` then points); returns the names dropped."""
    names = [n for n in sys.modules if n == package or n.startswith(package + ".")]
    for name in names:
        del sys.modules[name]
    return names


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime-api-address", required=True, help="the SuperNode's host:port")
    tls = parser.add_mutually_exclusive_group(required=True)
    tls.add_argument("--insecure", action="store_true", help="plain HTTP to the Runtime API")
    tls.add_argument("--root-certificates", type=Path, help="CA certificate of its TLS")
    parser.add_argument("--parent-pid", type=int, help="exit when this process is gone")
    parser.add_argument(
        "--poll-interval", type=float, default=DEFAULT_POLL_INTERVAL, help="seconds"
    )
    parser.add_argument(
        "--preload",
        default=",".join(DEFAULT_PRELOAD),
        help="comma-separated modules imported once before the first task",
    )
    args = parser.parse_args(argv)
    try:
        executor = WarmExecutor(
            args.runtime_api_address,
            insecure=args.insecure,
            root_certificates=args.root_certificates,
            parent_pid=args.parent_pid,
            poll_interval=args.poll_interval,
            preload=[m for m in args.preload.split(",") if m.strip()],
        )
    except ValueError as error:
        parser.error(str(error))
    print(f"[warm] serving ClientApp tasks of {args.runtime_api_address}", flush=True)
    executor.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
