"""What ``flwr run`` packs into the FAB: a copy of the app directory without what it skips.

Flower 1.41's ``flwr run <app>`` walks every file under ``<app>`` (``os.walk`` and a
``Path.resolve()`` per file) and only then drops what its filters exclude: its publish
rules (``*.py``, ``*.toml``, ``*.md``, ... but not ``.venv/**`` or ``__pycache__``), the
app's ``.gitignore`` and the ``fab-include`` / ``fab-exclude`` of its ``pyproject.toml``.
With the virtual environment inside the project, as the README makes it, that is some
50,000 files and several CPU seconds before every run (``benchmarks/fab.py`` measures it).

`packable_app` gives ``flwr run`` a temporary copy holding only the files those filters
could keep: it does not descend into a directory that Flower's publish excludes or the
app's ``.gitignore`` ignore as a whole (the latter only if the ``.gitignore`` re-includes
nothing, i.e. has no ``!`` line), and copies only files matching Flower's publish includes.
Flower's own filters then run on the copy, so the FAB holds the same files with the same
bytes (``benchmarks/fab.py`` builds both for this project and fails if they differ; its
smoke run is in the suite). Symbolic links are not copied: Flower skips them too. A
directory without a ``pyproject.toml`` is not copied at all: ``flwr run`` gets it as given
and its error names it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flwr.cli.utils import build_pathspec, load_gitignore_patterns
from flwr.supercore.constant import APP_PUBLISH_EXCLUDE_PATTERNS, APP_PUBLISH_INCLUDE_PATTERNS

__all__ = ["packable_app", "packable_files"]


def packable_files(app_dir: Path) -> list[str]:
    """The files under ``app_dir`` (relative POSIX paths, sorted) that Flower's FAB filters
    could keep, found without entering the directories they drop whole."""
    root = Path(app_dir).resolve()
    ignored = load_gitignore_patterns(root / ".gitignore")
    with warnings.catch_warnings():  # Flower's matcher: pathspec deprecates its pattern name
        warnings.filterwarnings("ignore", "GitWildMatchPattern", DeprecationWarning)
        include = build_pathspec(APP_PUBLISH_INCLUDE_PATTERNS)
        skipped = [build_pathspec(APP_PUBLISH_EXCLUDE_PATTERNS)]
        if not any(line.startswith("!") for line in ignored):
            skipped.append(build_pathspec(ignored))
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath).relative_to(root)
        prefix = "" if here == Path(".") else f"{here.as_posix()}/"
        dirnames[:] = [
            d for d in dirnames if not any(s.match_file(f"{prefix}{d}/") for s in skipped)
        ]
        for name in filenames:
            path = f"{prefix}{name}"
            if include.match_file(path) and not os.path.islink(root / path):
                found.append(path)
    return sorted(found)


@contextmanager
def packable_app(app_dir: Path) -> Iterator[Path]:
    """A temporary copy of ``app_dir`` holding its `packable_files`, removed on exit; give it
    to ``flwr run`` in place of ``app_dir``."""
    root = Path(app_dir).resolve()
    if not (root / "pyproject.toml").is_file():  # not an app: Flower's error names the dir
        yield root
        return
    with tempfile.TemporaryDirectory(prefix="fedorasflwr-app-") as tmp:
        copy = Path(tmp) / root.name
        for path in packable_files(root):
            (copy / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / path, copy / path)
        yield copy
