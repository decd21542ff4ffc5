"""The warm executor's apps kept between tasks: each FAB installed once, its ClientApp
imported once.

Flower's ``run_clientapp`` installs the task's FAB on every message (``install_from_fab``
extracts the whole archive to a temporary directory and checks every file's hash before it
finds the app installed already) and imports the app in a fresh process; on a warm
executor's forked task the two took 0.07-0.12 s and 0.15-0.17 s of the 0.33-0.37 s from
fork to handler (``python benchmarks/engines.py --quick``, ``task_phases``).

`KeptApps` lets a task skip both when an earlier task of the same executor did them for
the same FAB (the same full SHA-256 of its bytes):

- in a task (`KeptApps.enter_task`, after the fork): ``install_from_fab`` returns the
  directory Flower installed that FAB in before, if it is still there, without extracting
  it again (Flower itself trusts an installed directory whose name holds the FAB's hash:
  ``validate_and_install`` returns it unchanged); any other FAB is installed by Flower as
  before. If the executor holds another FAB's app imported, the task forgets it (its
  package and its directory on ``sys.path``) before Flower loads the app, so the app
  always comes from the task's own FAB. Once Flower loaded the ClientApp, the task reports
  the FAB's hash and directory to the executor through a pipe.
- in the executor (`KeptApps.learn`, once the task ended with status 0): the FAB is
  remembered, and its ClientApp module (``[tool.flwr.app.components] clientapp`` of the
  installed ``pyproject.toml``) imported from its directory, as Flower's loader imports it
  (the directory first on ``sys.path``), so the next task of that FAB forks with the app
  imported: Flower's loader finds the module in ``sys.modules`` and takes the ``ClientApp``
  from it. The executor's own copy of the app package (where the executor is the app's, as
  ``fedorasflwr``'s is) is forgotten first. The import runs no app code beyond what a
  fresh process's import runs, and each task gets the state right after import (fork). An
  import that fails is given up, and tasks import the app themselves again. One that starts
  a thread is given up too, and no app is kept after it; the thread itself cannot be undone
  and keeps running in the executor that later tasks fork from, so the executor logs that it
  should be restarted with ``--fresh-app-imports``.

The app's import-time code so runs in the executor, which later tasks of every run are forked
from: a node whose runs come from parties that must not affect each other's tasks runs the
executor with ``--fresh-app-imports`` (docs/deployment.md, "What changes against Flower's
SuperExec").
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import sys
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["KeptApp", "KeptApps", "clientapp_module", "installed_by_flower"]


def clientapp_module(app_dir: Path) -> str:
    """The ClientApp's module of an installed app: the module part of ``clientapp`` in its
    ``pyproject.toml``'s ``[tool.flwr.app.components]`` (Flower's ``module:attribute``)."""
    with open(app_dir / "pyproject.toml", "rb") as file:
        config = tomllib.load(file)
    reference = config["tool"]["flwr"]["app"]["components"]["clientapp"]
    module, _, attribute = str(reference).partition(":")
    if not module or not attribute:
        raise ValueError(f"{app_dir}: clientapp {reference!r} is not module:attribute")
    return module


@dataclass(frozen=True)
class KeptApp:
    """A FAB's app imported in the executor: the FAB's SHA-256, its installed directory and
    the ClientApp module's top-level package."""

    sha256: str
    directory: Path
    package: str

    def forget(self) -> None:
        """Drop the package's modules and the directory (as Flower put it on ``sys.path``)."""
        forget_package(self.package)
        while str(self.directory) in sys.path:
            sys.path.remove(str(self.directory))


class KeptApps:
    """What an executor keeps between its tasks (see the module docstring).

    Parameters
    ----------
    forget_first : str
        A package to forget in the executor before the first app is imported, and in a task
        when none is: the executor's own copy of the app (``fedorasflwr``).
    log : callable
        Takes one line for the executor's log.
    """

    def __init__(self, forget_first: str, log: Any = print) -> None:
        self.forget_first = forget_first
        self.log = log
        #: FAB SHA-256 -> the directory a task of this executor installed it in
        self.installed: dict[str, Path] = {}
        #: the app imported here, which every task forks with
        self.app: KeptApp | None = None
        #: False once an import failed or started a thread: tasks import the app themselves
        self.enabled = True
        #: (in a task) what it did: ``fab_reused`` / ``app_kept``, for the task timing
        self.task: dict[str, bool] = {}

    # -- in the executor ------------------------------------------------------------------

    def learn(self, report: bytes) -> None:
        """Take a task's report (`report_line`): remember the FAB and import its app."""
        try:
            fields = json.loads(report)
            sha256, directory = str(fields["sha256"]), Path(fields["directory"])
        except (ValueError, KeyError, TypeError):
            self.log(f"[warm] a task's report is malformed, ignored: {report[:200]!r}")
            return
        if not installed_by_flower(sha256, directory):
            # the task runs app code, which could write to the pipe: only a directory where
            # Flower installs that FAB is taken (no worse than Flower, which trusts it)
            self.log(
                f"[warm] a task reported {directory} for a FAB {sha256[:8]!r}: not where "
                "Flower installs it, ignored"
            )
            return
        self.installed[sha256] = directory
        if self.enabled and (self.app is None or self.app.sha256 != sha256):
            self.preload(sha256, directory)

    def preload(self, sha256: str, directory: Path) -> bool:
        """Import the ClientApp module of the FAB ``sha256`` installed in ``directory`` into
        this process; whether it now holds it. Any app held before is forgotten."""
        if self.app is not None:
            self.app.forget()
            self.app = None
        try:
            module = clientapp_module(directory)
        except (OSError, ValueError, KeyError, tomllib.TOMLDecodeError) as error:
            self.log(f"[warm] not keeping the app of {directory}: {error}")
            return False
        app = KeptApp(sha256, directory, module.split(".", 1)[0])
        forget_package(self.forget_first)
        forget_package(app.package)
        threads = _threads()
        sys.path.insert(0, str(directory))
        try:
            importlib.import_module(module)
        except Exception as error:  # noqa: BLE001 (the task will import it and report why)
            app.forget()
            self.log(
                f"[warm] importing {module} from {directory} failed ({error!r}): "
                "each task imports the app itself"
            )
            return False
        if _threads() != threads:
            app.forget()
            self.enabled = False
            self.log(
                f"[warm] importing {module} started a thread: forking beside it is "
                "unsafe, so no app is kept from now on; the thread still runs here, so "
                "restart this executor with --fresh-app-imports"
            )
            return False
        self.app = app
        self.log(f"[warm] app {module} of FAB {sha256[:8]} imported for the next tasks")
        return True

    # -- in a task ------------------------------------------------------------------------

    def enter_task(self, flower: dict[str, Any], report_fd: int | None) -> None:
        """In a forked task, before ``run_clientapp``: forget the executor's copy of the
        app unless it holds a FAB's app; wrap ``run_clientapp``'s ``install_from_fab`` (an
        installed FAB of the same hash is not extracted again; another FAB's app held here
        is forgotten) and its loader (report the FAB to ``report_fd`` once loaded)."""
        if self.app is None:
            forget_package(self.forget_first)
        module = importlib.import_module(flower["run_clientapp"].__module__)
        install = module.install_from_fab
        get_loader = module.get_load_client_app_fn
        seen: dict[str, Any] = {}

        def install_from_fab(fab_file: Any, install_dir: Any = None, skip_prompt: bool = False):
            sha256 = hashlib.sha256(fab_file).hexdigest() if isinstance(fab_file, bytes) else ""
            if self.app is not None and self.app.sha256 != sha256:
                self.app.forget()
                self.app = None
            known = self.installed.get(sha256) if install_dir is None else None
            self.task["fab_reused"] = known is not None and known.is_dir()
            if self.task["fab_reused"]:
                directory = known
            else:
                directory = install(fab_file, install_dir=install_dir, skip_prompt=skip_prompt)
            self.task["app_kept"] = self.app is not None
            seen.update(sha256=sha256, directory=str(directory))
            return directory

        def get_load_client_app_fn(*args: Any, **kwargs: Any) -> Any:
            load = get_loader(*args, **kwargs)

            def loaded(*fab: Any) -> Any:
                client_app = load(*fab)
                if report_fd is not None and seen.get("sha256"):
                    os.write(report_fd, report_line(seen["sha256"], seen["directory"]))
                return client_app

            return loaded

        module.install_from_fab = install_from_fab
        module.get_load_client_app_fn = get_load_client_app_fn


def installed_by_flower(sha256: str, directory: Path) -> bool:
    """Whether ``directory`` is where Flower's ``install_from_fab`` puts a FAB whose SHA-256
    is ``sha256``: directly in ``$FLWR_HOME/apps``, its name ending in the hash's first
    digits (``flwr/cli/install.py``, ``validate_and_install``)."""
    from flwr.common.constant import APP_DIR, FAB_HASH_TRUNCATION
    from flwr.supercore.utils import get_flwr_home

    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        return False
    apps = (get_flwr_home() / APP_DIR).resolve()
    return directory.resolve().parent == apps and directory.name.endswith(
        "." + sha256[:FAB_HASH_TRUNCATION]
    )


def _threads() -> int:
    """This process's threads: the kernel's count (native ones too, e.g. an OpenMP pool),
    or Python's where ``/proc`` is missing."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def report_line(sha256: str, directory: str) -> bytes:
    """A task's report to its executor: the FAB it loaded its app from (one JSON line)."""
    return (json.dumps({"sha256": sha256, "directory": directory}) + "\n").encode()


def forget_package(package: str) -> list[str]:
    """Drop ``package`` and its submodules from ``sys.modules`` (the next import reads
    them again, from wherever ``sys.path`` then points); returns the names dropped."""
    names = [n for n in sys.modules if n == package or n.startswith(package + ".")]
    for name in names:
        del sys.modules[name]
    return names
