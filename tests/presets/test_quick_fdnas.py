"""configs/quick-fdnas.toml shows FDNAS's point: the search moves the architecture
parameters away from uniform, and the derived net, FedAvg-trained, reaches 5x chance."""

from __future__ import annotations

import pytest

from tests.presets.common import MIN_ACCURACY, entropy_ratio, plots, run_preset

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def preset(tmp_path_factory, data_cache):
    return run_preset("quick-fdnas", tmp_path_factory.mktemp("quick-fdnas"), data_cache)


def test_the_alphas_leave_uniform(preset) -> None:
    options = len(preset.document["space"]["choices"][0]["options"])
    last = preset.document["search_history"][-1]
    assert entropy_ratio(last["alpha_entropy"], options) < 0.9


def test_the_derived_net_reaches_five_times_chance(preset) -> None:
    (net,) = preset.document["nets"]
    assert net["averaged_accuracy"] >= MIN_ACCURACY, net["averaged_accuracy"]
    assert net["global_test_accuracy"] >= MIN_ACCURACY, net["global_test_accuracy"]
    space = preset.document["space"]
    assert space["min_flops"] <= net["flops"] <= space["max_flops"]


def test_what_a_person_sees(preset) -> None:
    text = "\n".join(preset.summary)
    assert "MMACs/sample" in text and "global test acc" in text
    assert {"alpha_entropy.png", "nets_operations.png"} <= plots(preset.run_dir)
