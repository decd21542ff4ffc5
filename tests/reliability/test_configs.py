"""Every bad run config of the catalogue is refused before any training, naming its key."""

from __future__ import annotations

import pytest

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.server_app import RUNNERS
from tests.reliability.catalog import SEMANTIC, bad_configs
from tests.reliability.conftest import NoTrainingGrid, TrainingStartedError
from tests.runconfig import pyproject_run_config

DEFAULTS = pyproject_run_config()
CATALOGUE = bad_configs(DEFAULTS)


def refusal(config, out_dir) -> str:
    """The message of the ``ValueError`` that refuses ``config`` before any training;
    fails the test if the config is accepted, trains, or errors uncleanly."""
    try:
        settings = parse_run_config(config)
        grid = NoTrainingGrid(client_app, config, 6)
        RUNNERS[settings.method](grid, settings, out_dir)
    except ValueError as exc:
        return str(exc)
    except TrainingStartedError as exc:
        pytest.fail(f"not refused: training started ({exc})")
    pytest.fail("not refused: the run finished")


def test_the_catalogue_covers_every_key():
    keys = {bad.key for bad in CATALOGUE}
    assert keys >= set(DEFAULTS) - {"output-dir", "data.cache-dir"}
    assert len(CATALOGUE) > 4 * len(DEFAULTS)


def test_every_type_and_range_mutation_is_refused_by_the_parser_naming_the_key():
    unrefused = []
    for bad in CATALOGUE:
        if bad in SEMANTIC:
            continue
        try:
            parse_run_config({**DEFAULTS, **bad.overrides})
        except ValueError as exc:
            if f"'{bad.key}'" not in str(exc):
                unrefused.append((bad.label, f"message does not name the key: {exc}"))
        else:
            unrefused.append((bad.label, "accepted"))
    assert not unrefused, unrefused


@pytest.mark.parametrize("bad", SEMANTIC, ids=lambda b: b.label)
def test_cross_key_mistakes_are_refused_before_training(bad, data_cache, tmp_path):
    config = {**DEFAULTS, "data.cache-dir": str(data_cache), **bad.overrides}
    assert bad.key in refusal(config, tmp_path)
