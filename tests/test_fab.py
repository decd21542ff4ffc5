"""`fedorasflwr.launch.fab`: the copy of an app directory that ``flwr run`` is given."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedorasflwr.launch.fab import packable_app, packable_files


def _tree(root: Path, gitignore: str) -> None:
    files = {
        "pyproject.toml": "[project]\n",
        ".gitignore": gitignore,
        "app/task.py": "x = 1\n",
        "app/data.bin": "not a FAB file type\n",
        ".venv/lib/site.py": "",  # Flower's publish rules drop .venv/** whole
        "app/__pycache__/task.py": "",  # ... and **/__pycache__/**
        "outputs/run/result.json": "{}",  # the .gitignore below drops outputs/
        "outputs/keep.md": "kept only if the .gitignore re-includes it",
        "notes/readme.md": "",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    os.symlink(root / "app" / "task.py", root / "app" / "link.py")  # Flower skips links


def test_only_files_flowers_filters_could_keep_are_listed(tmp_path):
    _tree(tmp_path, "outputs/\n")
    assert packable_files(tmp_path) == [
        ".gitignore",
        "app/task.py",
        "notes/readme.md",
        "pyproject.toml",
    ]


def test_a_gitignore_that_re_includes_a_file_keeps_its_directory_walked(tmp_path):
    # pathspec (Flower's matcher) lets "!outputs/keep.md" win over "outputs/": so must we
    _tree(tmp_path, "outputs/\n!outputs/keep.md\n")
    listed = packable_files(tmp_path)
    assert "outputs/keep.md" in listed and "outputs/run/result.json" in listed


def test_the_copy_holds_the_listed_files_and_is_removed_afterwards(tmp_path):
    _tree(tmp_path, "outputs/\n")
    with packable_app(tmp_path) as copy:
        assert copy.name == tmp_path.name and copy != tmp_path
        found = sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file())
        assert found == packable_files(tmp_path)
        assert (copy / "app" / "task.py").read_text() == "x = 1\n"
    assert not copy.exists()


def test_the_copy_is_removed_when_the_run_fails(tmp_path):
    _tree(tmp_path, "")
    with pytest.raises(RuntimeError), packable_app(tmp_path) as copy:
        raise RuntimeError("flwr run failed")
    assert not copy.exists()


def test_a_directory_without_pyproject_is_given_as_it_is(tmp_path):
    # not an app: `flwr run` refuses it, and its message names the directory the user gave
    (tmp_path / "task.py").write_text("")
    with packable_app(tmp_path) as given:
        assert given == tmp_path.resolve()
    assert (tmp_path / "task.py").exists()
