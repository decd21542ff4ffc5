"""The warm ClientApp executor (`fedorasflwr.launch.warm`): its checks, the module
forgetting that makes each task import the app from its FAB, and how `Deployment`
starts it (the run through it is in tests/engines/test_secure_deployment.py)."""

from __future__ import annotations

import math
import runpy
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedorasflwr.launch import Deployment
from fedorasflwr.launch.deployment import SUPEREXEC_POLL_ENV
from fedorasflwr.launch.warm import (
    DEFAULT_POLL_INTERVAL,
    WarmExecutor,
    _alive,
    check_poll_interval,
    forget_package,
    main,
)


@pytest.mark.parametrize("bad", [0, -0.5, 61, math.nan, math.inf, True, "0.1"])
def test_bad_poll_interval_names_the_key_and_the_range(bad: object) -> None:
    with pytest.raises(ValueError, match="poll-interval"):
        check_poll_interval(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="poll-interval"):
        WarmExecutor("127.0.0.1:1", poll_interval=bad)  # type: ignore[arg-type]


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
    given = Deployment(num_supernodes=1, env={SUPEREXEC_POLL_ENV: "0.5"})
    assert given._env(Path("/x"))[SUPEREXEC_POLL_ENV] == "0.5"
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
    thread: the fork stays safe."""
    from fedorasflwr.launch.warm import DEFAULT_PRELOAD

    code = (
        "import importlib, os, sys\n"
        "importlib.import_module('torch')\n"
        "threads = len(os.listdir('/proc/self/task'))\n"
        f"for m in {list(DEFAULT_PRELOAD)!r}: importlib.import_module(m)\n"
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
