"""Disk cache of measured cost tables: used across processes, never trusted blindly."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fedorasflwr.search_spaces import base, build_space
from fedorasflwr.search_spaces.cost_cache import cost_cache_dir


def _tables(space: base.SearchSpace) -> tuple:
    return space._costs, space.fixed_cost


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cost cache and no in-process memo (as in a fresh ClientApp process)."""
    monkeypatch.setenv("FEDORASFLWR_CACHE", str(tmp_path))
    monkeypatch.setattr(base, "_MEASURED_COSTS", {})
    return cost_cache_dir()


def _no_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object) -> int:
        raise AssertionError("costs were measured, not read from the cache")

    monkeypatch.setattr(base, "_count_flops", refuse)


def test_second_build_reads_the_cache_without_measuring(fresh, monkeypatch) -> None:
    measured = _tables(build_space("cnn_s", width=0.25))
    assert len(list(fresh.glob("*.json"))) == 1
    monkeypatch.setattr(base, "_MEASURED_COSTS", {})
    _no_measuring(monkeypatch)
    assert _tables(build_space("cnn_s", width=0.25)) == measured


def test_another_spec_is_another_entry(fresh) -> None:
    small = _tables(build_space("cnn_s", width=0.25))
    large = _tables(build_space("cnn_s", width=0.5))
    assert small != large
    assert len(list(fresh.glob("*.json"))) == 2


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda d: "{not json",
        lambda d: json.dumps({**d, "options": d["options"][:-1]}),
        lambda d: json.dumps({**d, "fixed": [d["fixed"][0], d["fixed"][1] + 1]}),
        lambda d: json.dumps(
            {**d, "options": [[[f, p + 1] for f, p in layer] for layer in d["options"]]}
        ),
        lambda d: json.dumps(
            {**d, "options": [[[-1, p] for f, p in layer] for layer in d["options"]]}
        ),
    ],
    ids=["garbage", "missing-layer", "fixed-params", "option-params", "negative-flops"],
)
def test_a_corrupt_file_is_measured_again_with_a_warning(fresh, monkeypatch, caplog, corrupt):
    measured = _tables(build_space("cnn_s", width=0.25))
    [path] = fresh.glob("*.json")
    path.write_text(corrupt(json.loads(path.read_text())))
    monkeypatch.setattr(base, "_MEASURED_COSTS", {})
    with caplog.at_level(logging.WARNING):
        again = _tables(build_space("cnn_s", width=0.25))
    assert again == measured
    assert str(path) in caplog.text and "measuring again" in caplog.text
    monkeypatch.setattr(base, "_MEASURED_COSTS", {})
    _no_measuring(monkeypatch)  # the rewritten file is good again
    assert _tables(build_space("cnn_s", width=0.25)) == measured
