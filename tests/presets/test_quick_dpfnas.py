"""configs/quick-dpfnas.toml shows DP-FNAS's point: a search whose every party's privacy
is accounted (a finite epsilon at the reported delta), and a derived net that reaches 5x
chance at that epsilon."""

from __future__ import annotations

import math

import pytest

from tests.presets.common import MIN_ACCURACY, run_preset

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def preset(tmp_path_factory, data_cache):
    return run_preset("quick-dpfnas", tmp_path_factory.mktemp("quick-dpfnas"), data_cache)


def test_the_derived_net_reaches_five_times_chance(preset) -> None:
    assert preset.document["test_accuracy"] >= MIN_ACCURACY, preset.document["test_accuracy"]
    assert preset.document["global_test_accuracy"] >= MIN_ACCURACY


def test_every_party_has_a_finite_epsilon_and_the_summary_says_it(preset) -> None:
    epsilons = [party["epsilon"] for party in preset.document["privacy"]]
    assert len(epsilons) == 20
    assert all(0 < eps < math.inf for eps in epsilons)
    text = "\n".join(preset.summary)
    assert "privacy spent" in text and f"{max(epsilons):.4g}" in text


def test_the_summary_says_the_normal_cell_is_not_searched(preset) -> None:
    # its one cell is a reduction cell (why its normal half matched FedNAS's)
    assert any(line.startswith("normal cell: none in this 1-cell net") for line in preset.summary)
