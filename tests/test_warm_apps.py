"""What the warm executor keeps between tasks (`fedorasflwr.launch.warm_apps`): a FAB
installed once, its ClientApp imported once, and never another FAB's app in a task.

Flower's own ``run_clientapp`` steps are replaced here (monkeypatch restores them): the
install records its calls, so a test sees whether a task extracted the FAB again. The
runs through a real deployment are in tests/engines/test_operator_executor.py."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from fedorasflwr.launch.warm_apps import KeptApps, clientapp_module, report_line
from fedorasflwr.launch.warm_compat import load_flower_internals

PYPROJECT = '[tool.flwr.app.components]\nclientapp = "{ref}"\nserverapp = "x:y"\n'


def make_app(root: Path, package: str, body: str = "app = 'the app'\n", version: int = 1) -> Path:
    """An installed app's directory: ``pyproject.toml`` naming ``<package>.client:app``."""
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text(f"VERSION = {version}\n")
    (root / package / "client.py").write_text(body)
    (root / "pyproject.toml").write_text(PYPROJECT.format(ref=f"{package}.client:app"))
    return root


def fab_dir(sha256: str) -> Path:
    """Where Flower installs a FAB of this hash under ``$FLWR_HOME`` (the fixture's)."""
    return Path(os.environ["FLWR_HOME"]) / "apps" / f"flwr.keptprobe.1.0.0.{sha256[:8]}"


@pytest.fixture
def kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> KeptApps:
    """A `KeptApps` logging into ``kept.lines``; ``sys.path`` and ``sys.modules`` restored;
    ``$FLWR_HOME`` in ``tmp_path``."""
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    names = set(sys.modules)
    apps = KeptApps("keptprobe_self")
    apps.lines = []  # type: ignore[attr-defined]
    apps.log = apps.lines.append  # type: ignore[attr-defined]
    yield apps
    for name in set(sys.modules) - names:
        del sys.modules[name]


def test_the_clientapp_module_is_the_pyprojects(tmp_path: Path) -> None:
    app = make_app(tmp_path, "keptprobe")
    assert clientapp_module(app) == "keptprobe.client"
    (tmp_path / "pyproject.toml").write_text(PYPROJECT.format(ref="keptprobe.client"))
    with pytest.raises(ValueError, match="not module:attribute"):
        clientapp_module(app)


def test_a_reported_fab_is_remembered_and_its_app_imported_from_its_directory(
    kept: KeptApps, tmp_path: Path
) -> None:
    first = make_app(fab_dir("a" * 64), "keptprobe", version=1)
    kept.learn(report_line("a" * 64, str(first)))
    assert kept.installed == {"a" * 64: first}
    assert kept.app is not None and kept.app.package == "keptprobe"
    assert sys.modules["keptprobe"].VERSION == 1
    assert sys.modules["keptprobe.client"].__file__ == str(first / "keptprobe" / "client.py")
    assert sys.path[0] == str(first)
    assert any("imported for the next tasks" in line for line in kept.lines)

    # the same FAB again: nothing imported anew
    module = sys.modules["keptprobe.client"]
    kept.learn(report_line("a" * 64, str(first)))
    assert sys.modules["keptprobe.client"] is module

    # another FAB of the same package: the first is forgotten, path and modules
    second = make_app(fab_dir("b" * 64), "keptprobe", version=2)
    kept.learn(report_line("b" * 64, str(second)))
    assert sys.modules["keptprobe"].VERSION == 2
    assert str(first) not in sys.path and sys.path[0] == str(second)
    assert set(kept.installed) == {"a" * 64, "b" * 64}


def test_the_executors_own_copy_of_the_app_is_forgotten_before_the_fabs_is_imported(
    kept: KeptApps, tmp_path: Path
) -> None:
    mine = make_app(tmp_path / "mine", "keptprobe_self")
    sys.path.insert(0, str(mine))
    import keptprobe_self.client  # noqa: F401 (the executor's copy)

    sys.path.remove(str(mine))
    fab = make_app(tmp_path / "fab", "keptprobe_self", version=7)
    assert kept.preload("c" * 64, fab)
    assert sys.modules["keptprobe_self"].VERSION == 7


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("raise RuntimeError('broken app')\n", "failed"),
        (
            "import threading, time\n"
            "threading.Thread(target=time.sleep, args=(1,), daemon=True).start()\napp = 1\n",
            "started a thread",
        ),
    ],
)
def test_an_app_that_fails_or_starts_a_thread_is_not_kept(
    kept: KeptApps, tmp_path: Path, body: str, said: str
) -> None:
    app = make_app(tmp_path, "keptprobe_bad", body)
    assert not kept.preload("d" * 64, app)
    assert kept.app is None
    assert "keptprobe_bad" not in sys.modules and str(app) not in sys.path
    assert any(said in line for line in kept.lines), kept.lines
    # a thread makes forking beside the import unsafe: no app is kept from then on
    assert kept.enabled is (said == "failed")


def test_a_report_of_a_directory_flower_would_not_install_that_fab_in_is_ignored(
    kept: KeptApps, tmp_path: Path
) -> None:
    """A task runs app code, which can write to its report pipe: only the directory where
    Flower installs the reported FAB is taken."""
    elsewhere = make_app(tmp_path / "elsewhere", "keptprobe")
    wrong_hash = make_app(fab_dir("c" * 64), "keptprobe")
    for sha, directory in (("a" * 64, elsewhere), ("a" * 64, wrong_hash), ("A" * 64, elsewhere)):
        kept.learn(report_line(sha, str(directory)))
    assert kept.installed == {} and kept.app is None
    assert len([line for line in kept.lines if "not where Flower installs it" in line]) == 3
    assert "keptprobe" not in sys.modules


def test_a_malformed_report_is_logged_and_changes_nothing(kept: KeptApps) -> None:
    for report in (b"not json", b'{"sha256": "a"}', b"[1, 2]"):
        kept.learn(report)
    assert kept.installed == {} and kept.app is None
    assert len([line for line in kept.lines if "malformed" in line]) == 3


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Flower's ``run_clientapp`` module with a recording install and loader (restored
    after the test); ``installs`` lists the FABs actually extracted."""
    from flwr.supernode.runtime import run_clientapp

    recorded: dict = {"installs": [], "module": run_clientapp}

    def install(fab_file: bytes, install_dir: object = None, skip_prompt: bool = False) -> Path:
        recorded["installs"].append(fab_file)
        return recorded["directory"]

    def get_loader(default_app_ref: str, app_path: object, multi_app: bool):
        return lambda fab_id, fab_version, fab_hash: f"client app of {fab_hash}"

    monkeypatch.setattr(run_clientapp, "install_from_fab", install)
    monkeypatch.setattr(run_clientapp, "get_load_client_app_fn", get_loader)
    return recorded


def test_a_task_extracts_a_fab_only_once_and_reports_what_it_loaded(
    kept: KeptApps, steps: dict, tmp_path: Path
) -> None:
    flower = load_flower_internals()
    module = steps["module"]
    fab, other = b"the fab's bytes", b"another fab"
    sha = hashlib.sha256(fab).hexdigest()
    steps["directory"] = make_app(fab_dir(sha), "keptprobe")
    read, write = os.pipe()
    try:
        kept.enter_task(flower, write)
        # a FAB this executor has not seen: Flower installs it
        assert module.install_from_fab(fab, skip_prompt=True) == steps["directory"]
        assert steps["installs"] == [fab] and kept.task == {"fab_reused": False, "app_kept": False}
        loader = module.get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
        assert loader("x/y", "1.0", sha) == f"client app of {sha}"
        os.close(write)
        write = -1
        report = os.read(read, 4096)
    finally:
        os.close(read)
        if write != -1:
            os.close(write)
    assert json.loads(report) == {"sha256": sha, "directory": str(steps["directory"])}

    # the executor learns it: the next task of that FAB skips the install, keeps the app
    kept.learn(report)
    assert kept.app is not None and "keptprobe.client" in sys.modules
    kept.enter_task(flower, None)
    assert module.install_from_fab(fab, skip_prompt=True) == steps["directory"]
    assert steps["installs"] == [fab]  # not extracted again
    assert kept.task == {"fab_reused": True, "app_kept": True}
    assert "keptprobe.client" in sys.modules

    # a task of another FAB: installed by Flower, and the kept app is forgotten first
    kept.enter_task(flower, None)
    module.install_from_fab(other, skip_prompt=True)
    assert steps["installs"] == [fab, other]
    assert kept.task == {"fab_reused": False, "app_kept": False}
    assert "keptprobe.client" not in sys.modules
    assert str(steps["directory"]) not in sys.path


def test_an_installed_directory_that_is_gone_is_installed_again(
    kept: KeptApps, steps: dict, tmp_path: Path
) -> None:
    fab = b"fab"
    steps["directory"] = tmp_path / "gone"
    kept.installed[hashlib.sha256(fab).hexdigest()] = tmp_path / "gone"
    kept.enter_task(load_flower_internals(), None)
    steps["module"].install_from_fab(fab, skip_prompt=True)
    assert steps["installs"] == [fab] and kept.task["fab_reused"] is False


def test_a_task_whose_own_child_holds_the_report_pipe_does_not_stall_the_executor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The task reports and exits, but a process it forked lives on with the pipe's write
    end: the executor still reaps the task and takes the report at once."""
    from fedorasflwr.launch.warm import WarmExecutor

    executor = WarmExecutor("127.0.0.1:1")
    learned: list[bytes] = []
    monkeypatch.setattr(executor.apps, "learn", learned.append)
    release_read, release_write = os.pipe()

    def task(token: str) -> int:
        os.write(executor._report_fd, report_line("e" * 64, "/somewhere"))
        if os.fork() == 0:  # the task's own child: keeps the report pipe until released
            os.read(release_read, 1)
            os._exit(0)
        return 0

    monkeypatch.setattr(executor, "_run_task", task)
    (pid,) = [executor._fork("token")]
    try:
        deadline = 600  # polls of 0.05 s: the task itself ends at once
        while pid in executor.children and deadline:
            reaper = threading.Thread(target=executor._reap, daemon=True)
            reaper.start()
            reaper.join(timeout=30)
            assert not reaper.is_alive(), "reaping blocked on the report pipe"
            deadline -= 1
            time.sleep(0.05)
        assert pid not in executor.children
        assert learned == [report_line("e" * 64, "/somewhere")]
    finally:
        os.write(release_write, b"x")
        os.close(release_write)
        os.close(release_read)


def test_without_a_kept_app_a_task_forgets_the_executors_copy(
    kept: KeptApps, steps: dict, tmp_path: Path
) -> None:
    mine = make_app(tmp_path / "mine", "keptprobe_self")
    sys.path.insert(0, str(mine))
    import keptprobe_self  # noqa: F401

    kept.enter_task(load_flower_internals(), None)
    assert "keptprobe_self" not in sys.modules
