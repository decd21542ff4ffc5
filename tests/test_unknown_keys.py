"""Unknown run-config keys are refused, by the parser and by the launcher before any Flower
process starts, naming the key and the closest known one."""

from __future__ import annotations

import os
import subprocess
import sys
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
