"""Unknown run-config keys are refused, by the parser and by the launcher before any Flower
process starts, naming the key and the closest known one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedorasflwr.config import check_known_keys, known_keys, parse_run_config
from fedorasflwr.launch import cli
from tests.runconfig import pyproject_run_config

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("fedoras.round", "fedoras.rounds"),
        ("data.alfa", "data.alpha"),
        ("dpfnas.insecure-reproducible-nose", "dpfnas.insecure-reproducible-noise"),
        ("fdnas.alpha_lr", "fdnas.alpha-lr"),
        ("sed", "seed"),
    ],
)
def test_unknown_key_is_refused_with_the_closest_known_key(key, suggestion):
    config = {**pyproject_run_config(), key: 1}
    with pytest.raises(ValueError) as info:
        parse_run_config(config)
    assert str(info.value) == f"run config key {key!r} is unknown; did you mean {suggestion!r}?"


def test_unknown_key_without_a_close_match_is_still_refused():
    with pytest.raises(ValueError, match=r"'learning-rate' is unknown; the known keys are"):
        parse_run_config({"learning-rate": 0.1})
    # a key in the wrong table (or none): every key with that last part is offered
    with pytest.raises(ValueError, match=r"'lr' is unknown; did you mean one of .*'fedoras\.lr'"):
        parse_run_config({"lr": 0.1})


def test_every_unknown_key_is_named():
    with pytest.raises(ValueError) as info:
        check_known_keys(["fedoras.round", "seed", "data.alfa"])
    lines = str(info.value).splitlines()
    assert len(lines) == 2
    assert "'data.alfa'" in lines[0] and "'fedoras.round'" in lines[1]


def test_known_keys_are_the_shipped_defaults():
    """The known keys are derived from the parser; the pyproject defaults (what Flower
    accepts under ``flwr run``) must be exactly those, so the two cannot drift apart.
    ``data.seed`` is the one parser key not shipped: it defaults to ``seed``."""
    shipped = set(pyproject_run_config())
    assert shipped <= known_keys()
    assert known_keys() - shipped == {"data.seed"}
    check_known_keys(shipped)  # no error
    assert parse_run_config(pyproject_run_config()).method == "fedoras"


def test_launcher_refuses_before_starting_flower(monkeypatch, capsys):
    def no_flower(*args, **kwargs):
        raise AssertionError("a Flower process was started")

    monkeypatch.setattr(cli, "run_simulation", no_flower)
    monkeypatch.setattr(cli, "Deployment", no_flower)
    for extra in ([], ["--deployment"]):
        code = cli.main(["--run-config", "fedoras.round=3 data.alpha=0.1", *extra])
        assert code == 2
        err = capsys.readouterr().err
        assert "run config key 'fedoras.round' is unknown; did you mean 'fedoras.rounds'?" in err
    assert cli.main(["--run-config", "fedoras.rounds=three"]) == 2  # not a TOML value
    assert "invalid format" in capsys.readouterr().err
    assert cli.check_overrides('fedoras.rounds=3 data.dataset="mnist5k"') is None
    assert cli.check_overrides("") is None


def test_launcher_command_line_exits_non_zero(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedorasflwr.launch",
            "--flwr-home",
            str(tmp_path / "flwr-home"),
            "--run-config",
            "method='dpfnas' dpfnas.iteration=2",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert result.returncode == 2
    assert (
        "run config key 'dpfnas.iteration' is unknown; did you mean 'dpfnas.iterations'?"
        in result.stderr
    )
    assert not (tmp_path / "flwr-home").exists()  # no SuperLink ever got a home


# --- bad values: the ServerApp's whole check, run by the launcher up front -----------------


def _no_flower(monkeypatch):
    def no_flower(*args, **kwargs):
        raise AssertionError("a Flower process was started")

    monkeypatch.setattr(cli, "run_simulation", no_flower)
    monkeypatch.setattr(cli, "Deployment", no_flower)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ("fedoras.lr=-1.0", "run config 'fedoras.lr' = -1.0: allowed: > 0"),
        ("fdnas.rounds=0", "'fdnas.rounds' = 0"),  # another method's table is checked too
        ('data.dataset="mnist6k"', "'data.dataset' = 'mnist6k'"),
        ("seed=-3", "'seed' = -3"),
    ],
)
def test_launcher_refuses_a_bad_value_before_starting_flower(
    monkeypatch, capsys, overrides, expected
):
    _no_flower(monkeypatch)
    for extra in ([], ["--deployment"]):
        assert cli.main(["--run-config", overrides, *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --run-config: ") and expected in err, err


def test_launcher_checks_the_data_against_the_node_count(monkeypatch, capsys):
    _no_flower(monkeypatch)
    assert cli.main(["--num-supernodes", "2000"]) == 2  # one partition per SuperNode
    assert "num-partitions = 2000 is too many" in capsys.readouterr().err


def test_launcher_refuses_a_directory_that_is_not_an_app(monkeypatch, capsys, tmp_path):
    _no_flower(monkeypatch)
    assert cli.main(["--app-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --app-dir {str(tmp_path)!r}: cannot read") and "pyproject" in err


def test_another_app_keeps_its_own_checks(tmp_path):
    """An app other than this project's (e.g. one of examples/) parses its own run config."""
    (tmp_path / "pyproject.toml").write_text(
        '[tool.flwr.app.components]\nserverapp = "other.server:app"\n'
        "[tool.flwr.app.config]\nlr = -1.0\n"
    )
    assert cli.check_run_values(tmp_path, {"seed": 1}, 2) == {"seed": 1}


def test_launcher_refuses_a_one_class_folder_and_resolves_a_relative_one(
    monkeypatch, capsys, tmp_path
):
    from PIL import Image

    for name in ("cat", "dog"):
        (tmp_path / "im" / name).mkdir(parents=True)
        Image.new("L", (4, 4)).save(tmp_path / "im" / name / "0.png")
    monkeypatch.chdir(tmp_path)
    values = cli.check_run_values(REPO, {"data.dataset": "folder:im"}, 2)
    assert values == {"data.dataset": f"folder:{tmp_path / 'im'}"}  # what the engine gets
    _no_flower(monkeypatch)
    (tmp_path / "im" / "dog" / "0.png").unlink()
    (tmp_path / "im" / "dog").rmdir()
    argv = ["--app-dir", str(REPO), "--run-config", 'data.dataset="folder:im"']
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"'folder:{tmp_path / 'im'}' is invalid: 1 class directory" in err
    assert "['cat']" in err


def test_a_bad_value_exits_2_at_once_from_the_command_line(tmp_path):
    home = tmp_path / "flwr-home"
    command = [sys.executable, "-m", "fedorasflwr.launch", "--flwr-home", str(home)]
    command += ["--output-dir", str(tmp_path / "out"), "--run-config", "fedoras.lr=-1.0"]
    started = time.monotonic()
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    took = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    assert "run config 'fedoras.lr' = -1.0: allowed: > 0" in result.stderr
    assert "FAILED" not in result.stderr and result.stderr.count("\n") == 1  # one line
    assert not home.exists()  # no SuperLink ever got a home
    assert took < 60, took  # the interpreter, torch's import and the parse; no engine


# --- another Flower app (a library user's): its own keys, no output-dir of ours ------------

LIBRARY_APP = """
[tool.flwr.app]
publisher = "someone"

[tool.flwr.app.components]
serverapp = "signals.server_app:app"
clientapp = "signals.client_app:app"

[tool.flwr.app.config]
seed = 0
noise = 0.5
width = 16

[tool.flwr.app.config.decnas]
target = 0.3
"""


def _library_app(tmp_path: Path, extra: str = "") -> Path:
    app = tmp_path / "signals-app"
    app.mkdir()
    (app / "pyproject.toml").write_text(LIBRARY_APP.replace("width = 16", f"width = 16{extra}"))
    return app


def _capture_flower(monkeypatch) -> list[dict]:
    calls: list[dict] = []

    def fake_run_simulation(app_dir, **kwargs):
        calls.append({"app_dir": app_dir, **kwargs})
        raise KeyboardInterrupt  # stop there: the launcher's own stop path, exit 130

    monkeypatch.setattr(cli, "run_simulation", fake_run_simulation)
    return calls


def test_launcher_takes_a_library_apps_own_keys_and_no_output_dir(tmp_path, monkeypatch):
    """Issue 43: an app without ``output-dir`` gets none (Flower refuses a key the app does
    not have: "Invalid run configuration"), and its own keys are accepted."""
    app = _library_app(tmp_path)
    calls = _capture_flower(monkeypatch)
    overrides = "noise=0.2 width=8 decnas.target=0.5"
    code = cli.main(
        ["--app-dir", str(app), "--output-dir", str(tmp_path / "out")] + ["--run-config", overrides]
    )
    assert code == 130 and len(calls) == 1
    from flwr.common.config import parse_config_args

    sent = parse_config_args([calls[0]["run_config"]])
    assert sent == {"noise": 0.2, "width": 8, "decnas.target": 0.5}  # no "output-dir"
    assert calls[0]["flwr_home"].parent == (tmp_path / "out" / "flwr-home")
    assert cli.check_overrides("noise=0.1", app) is None


def test_launcher_gives_output_dir_to_a_library_app_that_has_the_key(tmp_path, monkeypatch):
    app = _library_app(tmp_path, extra='\noutput-dir = "outputs"')
    calls = _capture_flower(monkeypatch)
    assert cli.main(["--app-dir", str(app), "--output-dir", str(tmp_path / "o")]) == 130
    from flwr.common.config import parse_config_args

    sent = parse_config_args([calls[0]["run_config"]])
    assert sent == {"output-dir": str((tmp_path / "o").resolve())}


def test_launcher_refuses_a_key_the_library_app_does_not_have(tmp_path, monkeypatch, capsys):
    app = _library_app(tmp_path)
    _no_flower(monkeypatch)
    # a typo of the app's own key; then one of this package's keys the app has not got
    assert cli.main(["--app-dir", str(app), "--run-config", "nose=0.2"]) == 2
    err = capsys.readouterr().err
    assert "run config key 'nose' is unknown; did you mean 'noise'?" in err
    assert cli.main(["--app-dir", str(app), "--run-config", "fedoras.rounds=2"]) == 2
    assert "'fedoras.rounds' is unknown" in capsys.readouterr().err
    problem = cli.check_overrides("decnas.targt=0.5", app)
    assert problem == "run config key 'decnas.targt' is unknown; did you mean 'decnas.target'?"
