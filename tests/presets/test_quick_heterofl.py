"""configs/quick-heterofl.toml shows HeteroFL's point: one model served at four widths,
each tier's model cheaper than the next one's and every one at 5x chance or better."""

from __future__ import annotations

import pytest

from tests.presets.common import MIN_ACCURACY, run_preset

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def preset(tmp_path_factory, data_cache):
    return run_preset("quick-heterofl", tmp_path_factory.mktemp("quick-heterofl"), data_cache)


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
