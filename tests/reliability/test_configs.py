"""Every bad run config of the catalogue is refused before any training, naming its key."""

from __future__ import annotations

from tests.reliability.catalog import bad_configs
from tests.reliability.trials import config_trial
from tests.runconfig import pyproject_run_config

DEFAULTS = pyproject_run_config()


def test_the_catalogue_covers_every_key():
    keys = {bad.key for bad in bad_configs(DEFAULTS)}
    assert keys >= set(DEFAULTS) - {"output-dir", "data.cache-dir"}
    assert len(bad_configs(DEFAULTS)) > 4 * len(DEFAULTS)


def test_every_bad_config_is_refused_before_training_naming_its_key(data_cache, tmp_path):
    rows = config_trial(data_cache, tmp_path)
    wrong = [r for r in rows if r["outcome"] != "refused" or not r["names-key"]]
    assert not wrong, wrong[:5]
