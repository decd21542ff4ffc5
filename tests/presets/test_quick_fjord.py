"""configs/quick-fjord.toml shows FjORD's point: one ordered-dropout model served at four
p_max, each tier's model cheaper than the next one's, every one at 5x chance or better, and
a wider tier no less accurate on the global test set (within noise: after 4 rounds the
outer channels, trained by 1/16 of the client-batches, were not yet, and it fell with
width: 0.80, 0.80, 0.78, 0.71)."""

from __future__ import annotations

import pytest

from tests.presets.common import MIN_ACCURACY, run_preset

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def preset(tmp_path_factory, data_cache):
    return run_preset("quick-fjord", tmp_path_factory.mktemp("quick-fjord"), data_cache)


def test_every_tier_gets_its_width_and_reaches_five_times_chance(preset) -> None:
    tiers = preset.document["tiers"]
    assert [t["tier"] for t in tiers] == [1, 2, 3, 4]  # 1-based, as FedorAS's
    assert [t["width"] for t in tiers] == [0.25, 0.5, 0.75, 1.0]
    macs = [t["macs"] for t in tiers]
    assert macs == sorted(macs) and len(set(macs)) == len(macs)
    for tier in tiers:
        assert tier["test_count"] > 0 and tier["partitions"], tier
        assert tier["test_accuracy"] >= MIN_ACCURACY, tier
        assert tier["global_test_accuracy"] >= MIN_ACCURACY, tier
    assert any("global test acc" in line for line in preset.summary)
    files = set(preset.document["files"])
    assert {"tier-1.pt", "tier-4.pt", "tiers_accuracy.png"} <= files, files


#: the global test set's noise: 450 digits, an accuracy near 0.95 has a standard error of 1 pp
NOISE = 0.02


def test_accuracy_does_not_fall_with_width(preset) -> None:
    accuracy = [t["global_test_accuracy"] for t in preset.document["tiers"]]
    for narrower, wider in zip(accuracy, accuracy[1:], strict=False):
        assert wider >= narrower - NOISE, accuracy
    assert accuracy[-1] >= accuracy[0] - NOISE, accuracy
