"""The warm ClientApp executor (`fedorasflwr.launch.warm`): its checks, its command line
(``flower-superexec``'s), the Flower internals it looks up at start and fails on when they
moved (`fedorasflwr.launch.warm_compat`), the SuperExec auth it signs with Flower's own
interceptor, the module forgetting that makes each task import the app from its FAB, the
host's task slots (at most N tasks at once among the executors that share them), and
how `Deployment` starts it (the runs through it are in
tests/engines/test_secure_deployment.py and tests/engines/test_operator_executor.py)."""

from __future__ import annotations

import importlib
import inspect
import math
import os
import runpy
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from fedorasflwr.backoff import OBJECT_PULL_FIRST_WAIT, PROMPT_MARK
from fedorasflwr.launch import Deployment, warm_compat
from fedorasflwr.launch.deployment import (
    SUPEREXEC_POLL_ENV,
    SUPERLINK_POLL_INTERVAL,
    threads_per_node,
)
from fedorasflwr.launch.warm import (
    ACTIVE_HOLD,
    DEFAULT_POLL_INTERVAL,
    HELD_POLL_INTERVAL,
    IDLE_POLL_INTERVAL,
    TaskSlots,
    WarmExecutor,
    _alive,
    check_poll_interval,
    forget_package,
    main,
    prompt_task_pulls,
)
from fedorasflwr.launch.warm_compat import (
    REFUSED_OPTIONS,
    SUPPORTED_FLOWER,
    FlowerInternal,
    FlowerInternalsError,
    load_flower_internals,
    superexec_parser,
)

ROOT = Path(__file__).resolve().parents[1]
ADDRESS = ["--runtime-api-address", "127.0.0.1:1"]


@pytest.mark.parametrize("bad", [0, -0.5, 61, math.nan, math.inf, True, "0.1"])
def test_bad_poll_interval_names_the_key_and_the_range(bad: object) -> None:
    with pytest.raises(ValueError, match="poll-interval"):
        check_poll_interval(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="poll-interval"):
        WarmExecutor("127.0.0.1:1", poll_interval=bad)  # type: ignore[arg-type]


def test_an_idle_executor_polls_less_and_less_often_down_to_once_a_second() -> None:
    """Each poll that finds no task doubles the wait: up to HELD_POLL_INTERVAL (0.2 s) for
    ACTIVE_HOLD seconds after a task came or ended, then up to IDLE_POLL_INTERVAL (1 s,
    Flower's own SuperExec's interval); a longer configured interval is kept as it is."""
    now = [0.0]
    executor = WarmExecutor("127.0.0.1:1")
    backoff = executor.backoff
    assert (backoff.first, backoff.growth, backoff.held, backoff.longest, backoff.hold) == (
        0.1,
        2.0,
        HELD_POLL_INTERVAL,
        IDLE_POLL_INTERVAL,
        ACTIVE_HOLD,
    )
    backoff._clock = lambda: now[0]
    backoff.activity()
    held = [backoff.next_wait() for _ in range(4)]
    assert held == pytest.approx([0.1, 0.2, 0.2, 0.2])
    now[0] = ACTIVE_HOLD  # no task for the whole hold
    assert [backoff.next_wait() for _ in range(4)] == pytest.approx([0.4, 0.8, 1.0, 1.0])
    backoff.activity()
    assert backoff.next_wait() == 0.1
    slow = WarmExecutor("127.0.0.1:1", poll_interval=2.5)
    assert slow.backoff.next_wait() == slow.backoff.next_wait() == 2.5
    with pytest.deprecated_call():  # the old unheld sequence keeps its name a while
        assert executor.next_wait(0.4) == 0.8


def test_poll_interval_bounds_are_kept() -> None:
    assert check_poll_interval(60) == 60.0
    assert check_poll_interval(0.01) == 0.01


def test_transport_must_be_plain_or_tls_with_its_ca(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(ValueError, match="runtime-api-address"):
        WarmExecutor("  ")
    with pytest.raises(ValueError, match="root-certificates: not allowed"):
        WarmExecutor("127.0.0.1:1", insecure=True, root_certificates=ca)
    with pytest.raises(ValueError, match="root-certificates: required"):
        WarmExecutor("127.0.0.1:1", insecure=False)
    secure = WarmExecutor("127.0.0.1:1", insecure=False, root_certificates=ca)
    assert secure.certificates == ca.read_bytes() and secure.children == set()


def test_command_line_needs_a_transport_and_refuses_a_bad_interval(capsys) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["--runtime-api-address", "127.0.0.1:1"])
    assert ended.value.code == 2
    with pytest.raises(SystemExit) as ended:
        main(["--runtime-api-address", "127.0.0.1:1", "--insecure", "--poll-interval", "0"])
    assert ended.value.code == 2
    assert "poll-interval: 0.0 is not in (0, 60]" in capsys.readouterr().err


def test_forgotten_package_is_read_again_from_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what a forked task does before Flower loads the ClientApp from the FAB's directory
    for version, where in ((1, "old"), (2, "new")):
        package = tmp_path / where / "warmprobe"
        (package / "sub").mkdir(parents=True)
        (package / "__init__.py").write_text(f"VERSION = {version}\n")
        (package / "sub" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "old"))
    import warmprobe.sub  # noqa: F401

    assert sys.modules["warmprobe"].VERSION == 1
    monkeypatch.syspath_prepend(str(tmp_path / "new"))
    assert sorted(forget_package("warmprobe")) == ["warmprobe", "warmprobe.sub"]
    assert "warmprobe.sub" not in sys.modules
    import warmprobe

    assert warmprobe.VERSION == 2
    forget_package("warmprobe")


def test_flower_superexec_polls_faster_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SUPEREXEC_POLL_ENV, raising=False)
    assert Deployment(num_supernodes=1)._env(Path("/x"))[SUPEREXEC_POLL_ENV] == repr(
        DEFAULT_POLL_INTERVAL
    )
    # the SuperLink's SuperExec starts one ServerApp per run: it polls less often
    assert Deployment(num_supernodes=1)._env(Path("/x"), superlink=True)[
        SUPEREXEC_POLL_ENV
    ] == repr(SUPERLINK_POLL_INTERVAL)
    assert SUPERLINK_POLL_INTERVAL > DEFAULT_POLL_INTERVAL
    given = Deployment(num_supernodes=1, env={SUPEREXEC_POLL_ENV: "0.3"})
    assert given._env(Path("/x"))[SUPEREXEC_POLL_ENV] == "0.3"
    assert given._env(Path("/x"), superlink=True)[SUPEREXEC_POLL_ENV] == "0.3"
    assert Deployment(num_supernodes=1).warm_clientapps is True
    assert Deployment(num_supernodes=1, warm_clientapps=False).warm_clientapps is False


def test_launcher_is_warm_unless_asked_cold(capsys) -> None:
    from fedorasflwr.launch.cli import _parse_args

    assert _parse_args(["--deployment"]).cold_clientapps is False
    assert _parse_args(["--deployment", "--cold-clientapps"]).cold_clientapps is True
    with pytest.raises(SystemExit):
        _parse_args(["--cold-clientapps"])
    assert "--cold-clientapps is for --deployment" in capsys.readouterr().err


def test_a_killed_unreaped_parent_counts_as_gone() -> None:
    # the SuperNode a test kills stays a zombie until its Popen is polled; its executor
    # must still see it gone
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert _alive(child.pid)
        child.kill()
        deadline = time.monotonic() + 10
        while _alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child.pid)
        assert child.returncode is None  # not reaped yet: a zombie
    finally:
        child.wait()
    assert not _alive(child.pid)


def test_runs_as_a_module_without_a_second_copy_and_forgets_the_app_package() -> None:
    # `python -m` must find the module not yet imported by the package (else runpy warns
    # and runs a second copy), and the package each task forgets is the app's, never
    # `__main__`
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", "fedorasflwr.launch.warm", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "--poll-interval" in done.stdout
    # run as `python -m` runs it, under another name: the app package stays `fedorasflwr`
    ran = runpy.run_module("fedorasflwr.launch.warm", run_name="__not_main__")
    assert ran["APP_PACKAGE"] == "fedorasflwr"


def test_the_preload_leaves_no_first_call_import_to_a_task_and_starts_no_thread() -> None:
    """What a forked task would import on its first optimiser (``torch._dynamo``, 2 CPU-s
    per task: ``benchmarks/first_call.py``) is imported by the preload, which starts no
    thread, nor do the Flower internals the executor looks up: the fork stays safe."""
    from fedorasflwr.launch.warm import DEFAULT_PRELOAD

    code = (
        "import importlib, os, sys\n"
        "importlib.import_module('torch')\n"
        "threads = len(os.listdir('/proc/self/task'))\n"
        f"for m in {list(DEFAULT_PRELOAD)!r}: importlib.import_module(m)\n"
        "from fedorasflwr.launch.warm_compat import load_flower_internals\n"
        "load_flower_internals()\n"
        "assert len(os.listdir('/proc/self/task')) == threads, 'a preload started a thread'\n"
        "before = set(sys.modules)\n"
        "import torch\n"
        "net = torch.nn.Linear(3, 2)\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)\n"
        "net(torch.randn(4, 3)).sum().backward(); opt.step()\n"
        "new = sorted(m for m in set(sys.modules) - before if m.startswith('torch'))\n"
        "print(new)\n"
        "assert not new, new\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_first_call_benchmark_quick() -> None:
    from tests.test_benchmarks import run_quick

    saved = run_quick("first_call")
    assert saved["headline"]["extra_threads"] == 0
    rows = saved["rows"]
    assert "torch._dynamo" in rows["torch+dynamo"]["preload"]
    assert all(len(row["children"]) == saved["forks"] == 2 for row in rows.values())


# --- the operator's command: flower-superexec's arguments ---------------------------------


def test_every_flower_superexec_option_is_taken_or_refused_with_a_reason() -> None:
    from flwr.supercore.cli.flower_superexec import _parse_args

    theirs = {o for action in _parse_args()._actions for o in action.option_strings}
    ours = {o for action in superexec_parser("x")._actions for o in action.option_strings}
    assert theirs - ours == set()
    assert set(REFUSED_OPTIONS) <= theirs


def test_flower_superexec_command_parses_with_appio_alias_and_no_parent(tmp_path) -> None:
    # the command Flower's docs give for a SuperNode with --isolation process
    args = superexec_parser("x").parse_args(
        ["--insecure", "--plugin-type", "clientapp", "--appio-api-address", "127.0.0.1:9094"]
    )
    assert args.runtime_api_address == "127.0.0.1:9094" and args.insecure
    assert args.parent_pid is None and args.superexec_auth_secret_file is None
    secret = tmp_path / "secret"
    args = superexec_parser("x").parse_args(
        [*ADDRESS, "--root-certificates", "ca.crt", "--superexec-auth-secret-file", str(secret)]
    )
    assert args.root_certificates == Path("ca.crt") and not args.insecure
    assert args.superexec_auth_secret_file == str(secret)


@pytest.mark.parametrize(
    "extra",
    [
        ["--allow-runtime-dependency-installation"],
        ["--health-server-address", "127.0.0.1:5"],
        ["--executor", "kubernetes"],
        ["--executor-config", "x.yaml"],
        ["--plugin-type", "serverapp"],
    ],
)
def test_options_that_do_not_apply_exit_2_saying_why(extra: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as ended:
        main([*ADDRESS, "--insecure", *extra])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    if extra[0] in REFUSED_OPTIONS:
        assert f"{extra[0]}: {REFUSED_OPTIONS[extra[0]]}" in err
    else:
        assert "invalid choice: 'serverapp'" in err


def test_an_empty_or_missing_secret_file_is_refused(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    for path in (empty, tmp_path / "missing"):
        with pytest.raises(SystemExit) as ended:
            main([*ADDRESS, "--insecure", "--superexec-auth-secret-file", str(path)])
        assert ended.value.code == 2
        assert "superexec-auth-secret-file" in capsys.readouterr().err
    with pytest.raises(ValueError, match="superexec-auth-secret"):
        WarmExecutor("127.0.0.1:1", superexec_auth_secret=b"")


def test_console_script_runs_the_same_main() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, name = scripts["fedorasflwr-clientapp-executor"].split(":")
    assert getattr(importlib.import_module(module), name) is main


# --- Flower's internals: looked up at start, named when they moved ------------------------


def test_supported_flower_range_is_the_dependency_and_holds_the_pinned_one() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (flwr,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "flwr"]
    assert flwr.specifier == SpecifierSet(SUPPORTED_FLOWER)
    pins = (ROOT / "constraints.txt").read_text().splitlines()
    (pinned,) = [line.split("==")[1] for line in pins if line.startswith("flwr==")]
    assert pinned in SpecifierSet(SUPPORTED_FLOWER)


def test_installed_flower_has_every_internal_and_no_version_warning() -> None:
    found = load_flower_internals()
    assert set(found) == {i.attribute for i in warm_compat.FLOWER_INTERNALS}
    assert warm_compat.flower_version_warning() is None


def test_moved_internals_exit_1_naming_each_one_and_the_versions(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.delattr("flwr.supercore.tracing.flush_traces")
    monkeypatch.setitem(sys.modules, "flwr.supernode.runtime.run_clientapp", None)
    assert main([*ADDRESS, "--insecure"]) == 1
    err = capsys.readouterr().err
    assert "flwr.supercore.tracing.flush_traces (AttributeError" in err
    assert "flwr.supernode.runtime.run_clientapp.run_clientapp (ModuleNotFoundError" in err
    assert f"Flower {warm_compat.flower_version()}" in err
    assert f"flwr{SUPPORTED_FLOWER}" in err
    assert "serving" not in err
    with pytest.raises(FlowerInternalsError, match="run_clientapp"):
        WarmExecutor("127.0.0.1:1")


def test_a_renamed_keyword_or_field_counts_as_moved() -> None:
    moved = [
        FlowerInternal("flwr.supercore.tracing", "trace_span", ("traceparent", "carrier")),
        FlowerInternal("flwr.proto.runtime_pb2", "AcquireTaskRequest", ("task_types",)),
    ]
    with pytest.raises(FlowerInternalsError) as raised:
        load_flower_internals(moved)
    assert "trace_span (no longer takes carrier)" in str(raised.value)
    assert "AcquireTaskRequest (no longer takes task_types)" in str(raised.value)


def test_a_flower_outside_the_range_is_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warm_compat, "flower_version", lambda: "1.42.0")
    assert "Flower 1.42.0 is installed" in warm_compat.flower_version_warning()
    monkeypatch.setattr(warm_compat, "flower_version", lambda: "unknown")
    assert warm_compat.flower_version_warning() is not None


# --- SuperExec auth: Flower's own interceptor, as flower-superexec installs it ------------


def _acquire_headers(executor: WarmExecutor, status: int = 200) -> httpx.Headers:
    """The headers the executor's interceptor chain puts on one ``AcquireTask``."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest, AcquireTaskResponse
    from flwr.supercore.protobuf.client import ProtobufRequestContext
    from flwr.supercore.runtime.tracing import RuntimeTracingInterceptor

    message = AcquireTaskRequest(supported_task_types=["flwr-clientapp"])
    request = httpx.Request("POST", "http://127.0.0.1:1/flwr.proto.Runtime/AcquireTask")
    context = ProtobufRequestContext("/flwr.proto.Runtime/AcquireTask", message, request)

    def transport(_context: ProtobufRequestContext) -> httpx.Response:
        return httpx.Response(status, content=AcquireTaskResponse().SerializeToString())

    call = transport
    for interceptor in reversed(executor.interceptors(RuntimeTracingInterceptor())):
        call = (lambda i, nxt: lambda c: i.intercept(c, nxt))(interceptor, call)
    call(context)
    return request.headers


def test_a_secret_installs_flowers_superexec_auth_interceptor() -> None:
    from flwr.supercore.interceptors import (
        RuntimeVersionHttpInterceptor,
        SuperExecAuthHttpInterceptor,
    )
    from flwr.supercore.superexec.run_superexec import _SUPEREXEC_AUTH_METHODS

    plain = WarmExecutor("127.0.0.1:1").interceptors(object())
    assert not any(isinstance(i, SuperExecAuthHttpInterceptor) for i in plain)
    assert any(type(i) is RuntimeVersionHttpInterceptor for i in plain)
    signed = WarmExecutor("127.0.0.1:1", superexec_auth_secret=b"s3cret").interceptors(object())
    (auth,) = [i for i in signed if isinstance(i, SuperExecAuthHttpInterceptor)]
    assert type(auth) is SuperExecAuthHttpInterceptor  # Flower's class, not a copy
    assert auth._protected_methods == frozenset(_SUPEREXEC_AUTH_METHODS)


def test_acquire_task_is_signed_so_that_flowers_verifier_accepts_it() -> None:
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.auth.superexec import derive_auth_secret, verify_superexec_request
    from flwr.supercore.constant import (
        SUPEREXEC_AUTH_BODY_SHA256_HEADER,
        SUPEREXEC_AUTH_NONCE_HEADER,
        SUPEREXEC_AUTH_SIGNATURE_HEADER,
        SUPEREXEC_AUTH_TIMESTAMP_HEADER,
    )

    class Nonces:
        def reserve_nonce(self, namespace: str, nonce: str, expires_at: float) -> bool:
            return True

    headers = _acquire_headers(WarmExecutor("127.0.0.1:1", superexec_auth_secret=b"s3cret"))

    def verified(master: bytes) -> bool:
        return verify_superexec_request(
            request=AcquireTaskRequest(supported_task_types=["flwr-clientapp"]),
            method="/flwr.proto.Runtime/AcquireTask",
            auth_secret=derive_auth_secret(master),
            timestamp_raw=headers[SUPEREXEC_AUTH_TIMESTAMP_HEADER],
            nonce=headers[SUPEREXEC_AUTH_NONCE_HEADER],
            body_sha256_header=headers[SUPEREXEC_AUTH_BODY_SHA256_HEADER],
            signature=headers[SUPEREXEC_AUTH_SIGNATURE_HEADER],
            nonce_store=Nonces(),
        )

    assert verified(b"s3cret") and not verified(b"other")
    assert SUPEREXEC_AUTH_SIGNATURE_HEADER not in _acquire_headers(WarmExecutor("127.0.0.1:1"))


def test_a_refused_auth_is_remembered() -> None:
    executor = WarmExecutor("127.0.0.1:1", superexec_auth_secret=b"wrong")
    _acquire_headers(executor, status=200)
    assert not executor.auth_refused
    _acquire_headers(executor, status=401)
    assert executor.auth_refused


def test_each_task_is_forked_inside_flowers_dispatch_span(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from flwr.proto.task_pb2 import Task
    from flwr.supercore.superexec import run_superexec

    spans = []

    @contextmanager
    def span(name: str, *, traceparent: str = "", attributes: dict | None = None) -> Iterator:
        spans.append((name, traceparent, dict(attributes or {})))
        yield

    class Tracing:
        def take_task_traceparent(self, task_id: int) -> str:
            return f"carrier-{task_id}"

    executor = WarmExecutor("127.0.0.1:1")
    executor.flower = {**executor.flower, "trace_span": span}
    monkeypatch.setattr(executor, "_fork", lambda token: 4242)
    executor._dispatch("token", Task(task_id=7, run_id=9), Tracing())
    attributes = {"flwr.component": "superexec", "flwr.task_id": "7", "flwr.run_id": "9"}
    assert spans == [("task.dispatch", "carrier-7", attributes)]
    assert "[warm] task 7 of run 9: process 4242" in capsys.readouterr().out
    source = inspect.getsource(run_superexec)  # the span flower-superexec opens, as it opens it
    assert '"task.dispatch"' in source and '"flwr.component": "superexec"' in source


# --- the host's task slots (Deployment: no more ClientApps at once than the cores allow) ---


def test_task_slots_hold_at_most_their_count_and_are_given_back(tmp_path: Path) -> None:
    slots = TaskSlots(tmp_path / "slots", 2)
    first, second = slots.take(), slots.take()
    assert first is not None and second is not None
    assert slots.take() is None  # both held (each take opens the file anew: flock conflicts)
    assert TaskSlots(tmp_path / "slots", 2).take() is None  # another executor sees the same
    os.close(first)
    again = slots.take()
    assert again is not None and slots.take() is None
    for fd in (second, again):
        os.close(fd)
    assert sorted(p.name for p in (tmp_path / "slots").iterdir()) == ["slot-0", "slot-1"]


def test_a_forked_task_keeps_its_slot_until_it_exits(tmp_path: Path) -> None:
    slots = TaskSlots(tmp_path, 1)
    slot = slots.take()
    assert slot is not None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the task: holds the inherited slot until told to end
        os.read(read, 1)
        os._exit(0)
    os.close(slot)  # what the executor does after the fork
    try:
        assert slots.take() is None  # the child's copy of the open file keeps the lock
    finally:
        os.write(write, b"x")
        os.waitpid(pid, 0)
    freed = slots.take()
    assert freed is not None
    os.close(freed)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_slot_counts_are_refused(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValueError, match="task slots: .* expected an integer >= 1"):
        TaskSlots(tmp_path, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--task-slots", "-1"], "task-slots: -1; expected an integer >= 0 (0: no limit)"),
        (["--task-slots", "2"], "task-slots: needs --task-slots-dir"),
        (["--task-slots-dir", "/tmp/x"], "task-slots-dir: given without --task-slots"),
    ],
)
def test_task_slot_options_exit_2_saying_why(extra: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["--runtime-api-address", "127.0.0.1:1", "--insecure", *extra])
    assert ended.value.code == 2
    assert message in capsys.readouterr().err


class _Answer:
    def __init__(self, task: object | None) -> None:
        self.task, self.token = task, "token" if task is not None else ""

    def HasField(self, name: str) -> bool:  # noqa: N802 (protobuf's name)
        return name == "task" and self.task is not None


def test_no_task_is_asked_for_while_every_slot_is_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = WarmExecutor("127.0.0.1:1", slots=TaskSlots(tmp_path, 1))
    asked: list[object] = []
    answers = [_Answer(None), _Answer("task")]

    class Client:
        def AcquireTask(self, request: object) -> _Answer:  # noqa: N802 (Flower's name)
            asked.append(request)
            return answers[len(asked) - 1]

    dispatched: list[str] = []
    monkeypatch.setattr(executor, "_dispatch", lambda token, task, tracing: dispatched.append(task))
    held = executor.slots.take()  # another node's task runs
    assert executor._acquire(Client(), "request", None) is None  # not asked: no back-off
    assert asked == []  # the SuperNode keeps the task queued
    os.close(held)
    assert executor._acquire(Client(), "request", None) is False  # asked, none came
    assert executor._acquire(Client(), "request", None) is True and dispatched == ["task"]
    assert len(asked) == 2
    free = executor.slots.take()  # the parent gave its copy back each time (here no child)
    assert free is not None
    os.close(free)


def test_a_deployment_runs_no_more_clientapps_at_once_than_the_cores(tmp_path: Path) -> None:
    cores = os.cpu_count() or 1
    assert Deployment(num_supernodes=3).clientapp_slots == max(1, cores // threads_per_node(3))
    assert Deployment(num_supernodes=1).clientapp_slots == 1  # one node: all cores, one task
    assert Deployment(num_supernodes=3, clientapp_slots=0).clientapp_slots == 0  # no limit
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="clientapp_slots"):
            Deployment(num_supernodes=3, clientapp_slots=bad)  # type: ignore[arg-type]


def test_an_unusable_slot_directory_is_refused_at_start(tmp_path: Path, capsys) -> None:
    (tmp_path / "slot-0").mkdir()  # slot-0 cannot be opened as a file
    with pytest.raises(IsADirectoryError):
        TaskSlots(tmp_path, 1)
    with pytest.raises(SystemExit) as ended:
        main(
            ["--runtime-api-address", "127.0.0.1:1", "--insecure"]
            + ["--task-slots", "1", "--task-slots-dir", str(tmp_path)]
        )
    assert ended.value.code == 2
    assert "slot-0" in capsys.readouterr().err


def test_a_task_forked_by_acquire_holds_its_slot_until_it_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real path: ``_acquire`` takes the slot, asks for the task and forks; the child
    (its ``_run_task`` blocks on a pipe) holds the slot, the parent gave its copy back."""

    class Tracing:
        def take_task_traceparent(self, task_id: int) -> str:
            return ""

    @contextmanager
    def span(name: str, *, traceparent: str = "", attributes: dict | None = None) -> Iterator:
        yield

    class Client:
        def AcquireTask(self, request: object) -> _Answer:  # noqa: N802 (Flower's name)
            from flwr.proto.task_pb2 import Task

            return _Answer(Task(task_id=1, run_id=1))

    executor = WarmExecutor("127.0.0.1:1", slots=TaskSlots(tmp_path, 1))
    executor.flower = {**executor.flower, "trace_span": span}
    read, write = os.pipe()
    monkeypatch.setattr(executor, "_run_task", lambda token: len(os.read(read, 1)) - 1)
    assert executor._acquire(Client(), "request", Tracing())
    (child,) = executor.children
    try:
        assert executor.slots.take() is None  # held by the child
        assert not executor._acquire(Client(), "request", Tracing())  # so no second task
    finally:
        os.write(write, b"x")
        os.waitpid(child, 0)
        executor.children.clear()
    free = executor.slots.take()
    assert free is not None
    os.close(free)


@pytest.mark.parametrize(("slots", "warm"), [(None, True), (0, True), (2, False)])
def test_a_deployment_hands_its_slots_to_every_warm_executor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slots: int | None, warm: bool
) -> None:
    engine = Deployment(
        num_supernodes=3, insecure=True, clientapp_slots=slots, warm_clientapps=warm
    )
    engine.flwr_home, engine.port = tmp_path, 1
    started: list[list[str]] = []

    class Process:
        pid = 4242

    monkeypatch.setattr(
        engine, "_spawn", lambda command, name, home: started.append(command) or Process()
    )
    for index in range(3):
        engine.start_supernode(f"supernode-{index}", {})
    executors = [c for c in started if "fedorasflwr.launch.warm" in c]
    assert len(executors) == (3 if warm else 0)
    expected = engine.clientapp_slots
    for command in executors:
        if expected:
            at = command.index("--task-slots")
            assert command[at + 1 : at + 4] == [
                str(expected),
                "--task-slots-dir",
                str(tmp_path / "clientapp-slots"),
            ]
        else:
            assert "--task-slots" not in command


def test_a_task_retries_its_messages_missing_objects_after_a_twentieth_of_a_second(
    monkeypatch,
) -> None:
    """The SuperNode offers a task before it holds the message's objects: the task's
    ``run_clientapp`` pulls them with Flower's own function, retrying sooner."""
    from flwr.supernode.runtime import run_clientapp

    flower = load_flower_internals()
    original = flower["pull_and_inflate_object_from_tree"]
    monkeypatch.setattr(run_clientapp, "pull_and_inflate_object_from_tree", original)
    prompt_task_pulls(flower)
    pull = run_clientapp.pull_and_inflate_object_from_tree  # what pull_task_input calls
    assert pull.func is original and getattr(pull, PROMPT_MARK)
    assert pull.keywords["initial_backoff"] == OBJECT_PULL_FIRST_WAIT
