"""The run-config presets in ``configs/``: every key known, every value valid, and the
launcher reads them as Flower's ``flwr run --run-config <file>`` does (fast, no Flower run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from flwr.common.config import parse_config_args

from fedorasflwr.config import METHODS, parse_run_config
from fedorasflwr.launch import cli
from tests.runconfig import ROOT, pyproject_run_config

CONFIGS = ROOT / "configs"
#: run-config presets (``compare-*.toml`` are comparisons: ``tests/test_compare.py`` reads them)
PRESETS = sorted(p for p in CONFIGS.glob("*.toml") if not p.name.startswith("compare-"))


def test_there_is_a_quick_preset_per_method() -> None:
    names = {path.name for path in PRESETS}
    assert {f"quick-{method}.toml" for method in METHODS} <= names


@pytest.mark.parametrize("path", PRESETS, ids=lambda path: path.name)
def test_preset_parses_as_flower_reads_it(path: Path) -> None:
    overrides = parse_config_args([str(path)])  # what `flwr run --run-config <file>` does
    assert overrides, f"{path.name} sets nothing"
    settings = parse_run_config(pyproject_run_config() | overrides)
    method = path.stem.split("-")[1]
    assert overrides["method"] == method
    assert settings.method == method
    assert cli.check_overrides(str(path)) is None


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda path: path.name)
def test_preset_comments_say_how_to_run_it(path: Path) -> None:
    assert f"--run-config configs/{path.name}" in path.read_text()


def test_paper_presets_cite_a_source_for_every_value() -> None:
    for path in CONFIGS.glob("paper-*.toml"):
        for line in path.read_text().splitlines():
            if "=" in line and not line.lstrip().startswith(("#", "[")):
                key = line.split("=", 1)[0].strip()
                assert "#" in line, f"{path.name}: {key} has no source comment"


def test_read_run_config_merges_a_file_and_overrides_in_order() -> None:
    path = str(CONFIGS / "quick-fedoras.toml")
    merged = cli.read_run_config([path, "fedoras.rounds=2 seed=3"])
    assert merged["fedoras.rounds"] == 2
    assert merged["seed"] == 3
    assert merged["space.width"] == parse_config_args([path])["space.width"]


def test_unknown_key_in_a_file_is_named_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "typo.toml"
    path.write_text('method = "fedoras"\n[fedoras]\nround = 3\n')
    problem = cli.check_overrides(str(path))
    assert problem is not None
    assert str(path) in problem
    assert "'fedoras.round' is unknown; did you mean 'fedoras.rounds'?" in problem


def test_missing_and_broken_files_are_refused_clearly(tmp_path: Path) -> None:
    missing = cli.check_overrides(str(tmp_path / "nope.toml"))
    assert missing is not None and "cannot read" in missing and "nope.toml" in missing
    broken = tmp_path / "broken.toml"
    broken.write_text("fedoras.rounds = = 3\n")
    problem = cli.check_overrides(str(broken))
    assert problem is not None and str(broken) in problem and "Invalid value" in problem


def test_a_list_value_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "list.toml"
    path.write_text("seed = [1, 2]\n")
    problem = cli.check_overrides(str(path))
    assert (
        problem is not None and str(path) in problem and "key seed needs to be of type" in problem
    )


def test_launcher_exits_2_on_a_bad_file_before_starting_flower(tmp_path: Path, capsys) -> None:
    path = tmp_path / "typo.toml"
    path.write_text("[fedoras]\nround = 3\n")
    assert cli.main(["--run-config", str(path), "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'fedoras.rounds'" in err
    assert not (tmp_path / "flwr-home").exists()


def test_default_flower_home_is_new_and_under_the_output_dir(tmp_path: Path) -> None:
    args = cli._parse_args([])
    first = cli._flwr_home(args, tmp_path)
    second = cli._flwr_home(args, tmp_path)
    assert first.is_dir() and second.is_dir()
    assert first.parent == second.parent == tmp_path / "flwr-home"
    assert first != second
    given = cli._flwr_home(cli._parse_args(["--flwr-home", str(tmp_path / "h")]), tmp_path)
    assert given == tmp_path / "h"


def test_how_to_see_names_the_home_and_run(tmp_path: Path) -> None:
    text = cli._how_to_see(tmp_path, 42)
    assert f"FLWR_HOME={tmp_path} flwr ls local" in text
    assert f"FLWR_HOME={tmp_path} flwr log 42 local --show" in text
    assert f'pkill -f "{tmp_path}/local-superlink/"' in text
