"""``python -m fedorasflwr.compare``'s inputs besides the comparison file: an ``--out`` that
is a file, lies under one, or holds a file where a method's directory goes; a ``--timeout``
that is not a finite number of seconds > 0; an ``--app-dir`` that is missing or no Flower
app; more clients than the data can serve.  Each exits 2 at once with a message naming the
flag (or key), the value and what is allowed, and nothing runs: no method is started, no
directory is made."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedorasflwr.compare import cli, execute
from tests.runconfig import ROOT
from tests.test_compare import write_tiny

#: how long a refusal may take in process, seconds (it parses each method's run config)
QUICK = 10.0


@pytest.fixture
def nothing_runs(monkeypatch):
    """Fail the test if a method is started (in process or on the engine)."""
    started: list[str] = []

    def run_method(method, *args, **kwargs):
        started.append(method)
        raise AssertionError(f"{method} was started")

    def engine(*args, **kwargs):
        started.append("engine")
        raise AssertionError("a launcher process was started")

    monkeypatch.setattr(cli, "run_method", run_method)
    monkeypatch.setattr(execute, "_run_engine", engine)
    monkeypatch.setattr(execute, "_run_inprocess", engine)
    return started


def _file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not a directory")
    return path


#: case -> (what it makes under tmp_path and returns as --out, extra arguments, message)
CASES = {
    "out-is-a-file": (lambda t: _file(t / "out"), [], "--out '{out}' is a file, not a directory"),
    "out-under-a-file": (
        lambda t: _file(t / "file") / "out",
        [],
        "--out '{out}': '{tmp}/file' is a file, no directory can be made under it",
    ),
    "method-directory-is-a-file": (
        lambda t: _file(t / "out" / "heterofl").parent,
        [],
        "'{out}/heterofl' is a file where the comparison keeps a method's runs",
    ),
    "attempt-directory-is-a-file": (
        lambda t: _file(t / "out" / "fjord" / "run").parents[1],
        [],
        "'{out}/fjord/run' is a file where the comparison keeps a method's runs",
    ),
    "leaderboard-is-a-directory": (
        lambda t: (t / "out" / "leaderboard.md").mkdir(parents=True) or t / "out",
        [],
        "'{out}/leaderboard.md' is a directory where the leaderboard is written",
    ),
    "negative-timeout": (
        lambda t: t / "out",
        ["--timeout", "-5"],
        "--timeout = -5.0: allowed: seconds per method, a finite number > 0",
    ),
    "zero-timeout": (lambda t: t / "out", ["--timeout", "0"], "--timeout = 0.0: allowed"),
    "nan-timeout": (lambda t: t / "out", ["--timeout", "nan"], "--timeout = nan: allowed"),
    "infinite-timeout": (lambda t: t / "out", ["--timeout", "inf"], "--timeout = inf: allowed"),
    "missing-app-dir": (
        lambda t: t / "out",
        ["--app-dir", "{tmp}/no-app"],
        "--app-dir '{tmp}/no-app' does not exist; allowed: the directory of a Flower app",
    ),
    "app-dir-is-a-file": (
        lambda t: (_file(t / "app"), t / "out")[1],
        ["--app-dir", "{tmp}/app"],
        "--app-dir '{tmp}/app' is no directory",
    ),
    "too-many-nodes": (
        lambda t: t / "out",
        ["--nodes", "100000"],
        "method 'heterofl': num-partitions",
    ),
}


#: the tiny comparison on MNIST-5k's IID split (the file's own draws 64 rows per client, with
#: which any number of nodes is possible): so that too many nodes for it can be refused
IID = {
    'partitioner = "sampled"': 'partitioner = "iid"',
    "partition-size = 64": "partition-size = 0",
}


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("inprocess", [True, False], ids=["inprocess", "engine"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_input_exits_2_at_once_and_nothing_runs(
    tmp_path, capsys, nothing_runs, case, inprocess
):
    make, extra, message = CASES[case]
    config = write_tiny(tmp_path / "tiny.toml", tmp_path / "cache", **IID)
    out = make(tmp_path)
    before = _listing(tmp_path)
    fill = {"out": out.absolute(), "tmp": tmp_path}
    args = ["--run-config", str(config), "--out", str(out), "--app-dir", str(ROOT)]
    args += [a.format(**fill) for a in extra] + (["--inprocess"] if inprocess else [])
    began = time.perf_counter()
    code = cli.main(args)
    seconds = time.perf_counter() - began
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and message.format(**fill) in err, err
    assert seconds < QUICK
    assert nothing_runs == []
    assert _listing(tmp_path) == before  # no directory made, nothing written


def test_an_app_dir_without_an_app_is_refused_on_the_engine(tmp_path, capsys, nothing_runs):
    """The engine runs the app in ``--app-dir``: a directory without a Flower app's
    pyproject.toml is refused up front (in process, it means the parser's defaults)."""
    config = write_tiny(tmp_path / "tiny.toml", tmp_path / "cache", **IID)
    empty = tmp_path / "empty"
    empty.mkdir()
    args = ["--run-config", str(config), "--out", str(tmp_path / "out"), "--app-dir", str(empty)]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert f"--app-dir {str(empty)!r}: cannot read {empty / 'pyproject.toml'}" in err, err
    assert nothing_runs == [] and not (tmp_path / "out").exists()


def _command(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = write_tiny(tmp_path / "tiny.toml", tmp_path / "cache", **IID)
    command = [sys.executable, "-m", "fedorasflwr.compare", "--run-config", str(config), *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_command_refuses_an_out_that_is_a_file_without_a_traceback(tmp_path):
    out = _file(tmp_path / "results")
    done = _command(tmp_path, "--out", str(out), "--app-dir", str(ROOT))
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"error: --out {str(out)!r} is a file" in done.stderr
    assert "Traceback" not in done.stderr
    assert out.read_text() == "not a directory"


def test_outside_the_checkout_without_app_dir_the_command_refuses_at_once(tmp_path):
    """Run from a directory that holds no Flower app, ``--app-dir`` left at its default
    (``.``): refused before any launcher starts, not a minute later inside it."""
    began = time.perf_counter()
    done = _command(tmp_path, "--out", str(tmp_path / "out"))
    seconds = time.perf_counter() - began
    assert done.returncode == 2, done.stderr[-2000:]
    assert "error: --app-dir '.': cannot read pyproject.toml" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()
    assert seconds < 60  # the interpreter's start and imports; the launcher took over a minute
