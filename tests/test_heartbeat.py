"""A failed run tells the truth (issue 32): the launcher's SuperLink task heartbeat timeout
(`fedorasflwr.launch.heartbeat`), the message of a failed run (`cli.failure_message`) and
the run status that decides it (`flwr_cli._flwr_run`). Fast: Flower's own task stores, no
Flower run (a failed run through the launcher: ``tests/engines/test_failed_run.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
from flwr.server.superlink.linkstate.sql_linkstate import SqlLinkState
from flwr.supercore.constant import TaskType
from flwr.supercore.corestate import in_memory_corestate, sql_corestate
from flwr.supercore.date import now
from flwr.supercore.object_store.in_memory_object_store import InMemoryObjectStore
from flwr.superlink.federation.noop_federation_manager import NoOpFederationManager

from fedorasflwr.launch import FlowerRunError, cli, flwr_cli, heartbeat
from fedorasflwr.launch.heartbeat import (
    HEARTBEAT_FAILURE,
    HEARTBEAT_TIMEOUT_ENV,
    check_heartbeat_timeout,
    set_task_heartbeat_timeout,
    superlink_wrapper,
)

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------- the SuperLink's timeout


@pytest.fixture
def restored_patience(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Flower's task-store constants back as they were after the test."""
    for module in (in_memory_corestate, sql_corestate):
        monkeypatch.setattr(module, "HEARTBEAT_PATIENCE", module.HEARTBEAT_PATIENCE)
    yield


def _stores() -> list[tuple[object, object]]:
    """The SuperLink's two run stores (in memory; SQL, as the local SuperLink's
    ``--database``) with the module whose clock and constants they read."""
    manager = NoOpFederationManager(simulation=True)
    sql = SqlLinkState(str(Path(tempfile.mkdtemp()) / "state.db"), manager, InMemoryObjectStore())
    sql.initialize()
    memory = InMemoryLinkState(NoOpFederationManager(simulation=True), InMemoryObjectStore())
    return [(memory, in_memory_corestate), (sql, sql_corestate)]


def _status_after_silence(store, module, seconds: float, monkeypatch) -> tuple[str, str, str]:
    """A run whose ServerApp task started, then sent nothing for ``seconds``: its status
    as ``flwr ls`` reads it once the SuperLink checks the task's heartbeat."""
    run_id = store.create_run(None, None, None, {}, "default", None, None, TaskType.SERVER_APP)
    (task,) = store.get_tasks(run_ids=[run_id])
    assert store.claim_task(task.task_id) and store.activate_task(task.task_id)
    later = now() + timedelta(seconds=seconds)
    with monkeypatch.context() as clock:
        clock.setattr(module, "now", lambda: later)
        store.acknowledge_task_heartbeat(task.task_id)  # checks every task's expiry first
    status = store.get_run_status({run_id})[run_id]
    return status.status, status.sub_status, status.details


def test_flower_fails_a_silent_serverapp_after_60_s(restored_patience, monkeypatch) -> None:
    for store, module in _stores():
        status = _status_after_silence(store, module, 45, monkeypatch)
        assert status == ("running", "", "")
        status = _status_after_silence(store, module, 65, monkeypatch)
        assert status == ("finished", "failed", HEARTBEAT_FAILURE)


def test_a_set_timeout_keeps_a_silent_serverapp_running_until_it_passes(
    restored_patience, monkeypatch
) -> None:
    set_task_heartbeat_timeout(300)
    for store, module in _stores():
        assert _status_after_silence(store, module, 90, monkeypatch) == ("running", "", "")
        assert _status_after_silence(store, module, 290, monkeypatch) == ("running", "", "")
        status = _status_after_silence(store, module, 310, monkeypatch)
        assert status == ("finished", "failed", HEARTBEAT_FAILURE)


@pytest.mark.parametrize("value", [10, 59.9, "x", float("nan"), None])
def test_timeouts_below_flowers_or_not_numbers_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match=r"heartbeat timeout .*allowed: >= 60"):
        check_heartbeat_timeout(value)
    assert check_heartbeat_timeout("600") == 600.0


def _run_wrapper(tmp_path: Path, timeout: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = superlink_wrapper(tmp_path / "bin") / "flower-superlink"
    env = os.environ | {HEARTBEAT_TIMEOUT_ENV: timeout, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [str(script), *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_flower_superlink_script_reads_the_timeout(tmp_path: Path) -> None:
    # the script `flwr run` finds first on its PATH: this module with the timeout set
    refused = _run_wrapper(tmp_path, "30", "--help")
    assert refused.returncode != 0
    assert f"{HEARTBEAT_TIMEOUT_ENV}: heartbeat timeout '30'" in refused.stderr
    done = _run_wrapper(tmp_path, "300", "--help")
    assert done.returncode == 0, done.stderr
    assert "--simulation" in done.stdout  # flower-superlink's own options


def test_launcher_option_env_and_default(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.delenv(HEARTBEAT_TIMEOUT_ENV, raising=False)
    assert cli._parse_args([]).heartbeat_timeout == heartbeat.DEFAULT_HEARTBEAT_TIMEOUT
    monkeypatch.setenv(HEARTBEAT_TIMEOUT_ENV, "900")
    assert cli._parse_args([]).heartbeat_timeout == 900.0
    assert cli._parse_args(["--heartbeat-timeout", "120"]).heartbeat_timeout == 120.0
    with pytest.raises(SystemExit):
        cli._parse_args(["--heartbeat-timeout", "20"])
    assert "--heartbeat-timeout: heartbeat timeout 20.0 s is below" in capsys.readouterr().err


# ------------------------------------------------------------- what a failure says


def _failed_run(monkeypatch: pytest.MonkeyPatch, details: str) -> FlowerRunError:
    """`_flwr_run` on a run ``flwr run --stream`` streamed and exited 0 for, that Flower
    then lists as ``finished:failed`` with ``details``."""
    log = "Successfully started run 4242\nfedorasflwr: results go to /x\n"
    monkeypatch.setattr(flwr_cli, "_stream_command", lambda *a: (0, log, 1.0))
    monkeypatch.setattr(flwr_cli, "_run_status", lambda *a: ("finished:failed", details))
    with pytest.raises(FlowerRunError) as caught:
        flwr_cli._flwr_run(["flwr", "run"], "local", {}, None, False, heartbeat_timeout=300.0)
    return caught.value


def test_exit_code_0_of_flwr_run_is_not_success(monkeypatch: pytest.MonkeyPatch) -> None:
    error = _failed_run(monkeypatch, "ValueError: fedoras.lr must be > 0, got -1.0")
    assert (error.run_id, error.status) == (4242, "finished:failed")
    assert str(error).endswith(
        "run 4242 ended as 'finished:failed': ValueError: fedoras.lr must be > 0, got -1.0"
    )
    assert "--heartbeat-timeout" not in str(error)


def test_a_heartbeat_failure_says_why_and_the_remedy(monkeypatch: pytest.MonkeyPatch) -> None:
    error = _failed_run(monkeypatch, HEARTBEAT_FAILURE)
    assert error.details == HEARTBEAT_FAILURE
    assert "heard nothing from the ServerApp's process for 300 s" in str(error)
    assert "--heartbeat-timeout 600" in str(error)


def test_failure_message_names_the_run_and_removes_an_empty_run_directory(
    tmp_path: Path,
) -> None:
    error = FlowerRunError("boom", run_id=4242, status="finished:failed", details="x")
    run_dir = tmp_path / "out" / "cfdnas-4242"
    run_dir.mkdir(parents=True)
    home = tmp_path / "flwr-home"
    message = cli.failure_message(error, run_dir, home, [], {}, tmp_path)
    assert "run 4242: finished:failed; exit code 1" in message
    assert f"run directory {run_dir}: empty (nothing was written), removed" in message
    assert not run_dir.exists()
    assert f"FLWR_HOME={home} flwr log 4242 local --show" in message
    assert "<run-id>" not in message


def test_failure_message_keeps_a_run_directory_with_its_resume_command(tmp_path: Path) -> None:
    error = FlowerRunError("boom", run_id=7, status="finished:failed")
    run_dir = tmp_path / "fedoras-7"
    run_dir.mkdir()
    (run_dir / "result.json").write_text("{}")
    (run_dir / "checkpoint.pt").write_bytes(b"")
    message = cli.failure_message(error, run_dir, None, ["--num-supernodes", "4"], {}, tmp_path)
    assert f"run directory {run_dir}: kept (checkpoint.pt, result.json)" in message
    assert f'resume-from="{run_dir / "checkpoint.pt"}"' in message
    assert message.splitlines()[-1].startswith(f"cd {tmp_path} && {sys.executable} -m")
    assert run_dir.is_dir()


def test_failure_message_of_a_run_that_never_started(tmp_path: Path) -> None:
    message = cli.failure_message(FlowerRunError("no start"), None, tmp_path, [], {}, tmp_path)
    assert "the run (it did not start)" in message
    assert "flwr log" not in message and "<run-id>" not in message
