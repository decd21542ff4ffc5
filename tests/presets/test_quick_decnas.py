"""configs/quick-decnas.toml shows DecNAS's point: a frontier GM_0 .. GM_T that trades
accuracy for MACs the right way (every GM cheaper than the one before, GM_0 no worse than
GM_T by more than 0.05), every GM at 5x chance or better."""

from __future__ import annotations

import pytest

from tests.presets.common import MIN_ACCURACY, run_preset

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def preset(tmp_path_factory, data_cache):
    return run_preset("quick-decnas", tmp_path_factory.mktemp("quick-decnas"), data_cache)


def test_the_frontier_trades_accuracy_for_macs_the_right_way(preset) -> None:
    frontier = preset.document["frontier"]
    assert len(frontier) >= 3
    macs = [gm["macs"] for gm in frontier]
    assert macs == sorted(macs, reverse=True) and len(set(macs)) == len(macs)
    first, last = frontier[0], frontier[-1]
    assert first["test_accuracy"] >= last["test_accuracy"] - 0.05
    assert first["global_test_accuracy"] >= last["global_test_accuracy"] - 0.05


def test_every_gm_reaches_five_times_chance(preset) -> None:
    for gm in preset.document["frontier"]:
        assert gm["test_accuracy"] >= MIN_ACCURACY, gm
        assert gm["global_test_accuracy"] >= MIN_ACCURACY, gm
    tuned = preset.document["frontier"][-1]["tuned_test_accuracy"]
    assert tuned is not None and tuned >= MIN_ACCURACY
