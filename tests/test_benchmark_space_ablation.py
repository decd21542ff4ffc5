"""``benchmarks/space_ablation.py --quick`` as a smoke test (issue 40): the same ``cnn_s`` path
built with each head, trained by FedAvg for two short rounds at alpha 0.1, both scored on
the global test set; the table's nets are the ones it says (MACs near 0.56 M)."""

from __future__ import annotations

import math

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_space_ablation_quick_trains_each_head_of_one_path():
    saved = run_quick("space_ablation")
    head = saved["headline"]
    assert head["rows"] == 2 and head["seeds"] == 1
    runs = {run["settings"]["head"]: run for run in saved["runs"]}
    assert set(runs) == {"flatten", "gap"}
    for run in runs.values():
        assert run["settings"]["net"] == "cnn_s" and run["settings"]["alpha"] == 0.1
        assert 0.0 <= run["accuracy"] <= 1.0
        assert run["finite"] and math.isfinite(run["final_train_loss"])
        assert run["final_train_loss"] < math.log(10)  # below an untrained net's loss
        assert run["macs"] == pytest.approx(0.56e6, rel=0.05)
    # the flatten head's classifier reads C x H x W features: more MACs than GAP's, same path
    assert runs["flatten"]["macs"] > runs["gap"]["macs"]
    assert head["cnn_s_flatten"] == pytest.approx(runs["flatten"]["accuracy"], abs=1e-3)
