"""``benchmarks/lr_stability.py`` (issue 40 item 4): the presets' lr 0.05 with momentum 0.9
throws the ConvNet far off in its first steps on the synthetic shapes folder and leaves it at
chance, where a 16x smaller lr trains it; and the headline's rule, hand-computed."""

from __future__ import annotations

import math

import pytest
import torch

from tests.test_benchmarks import load_benchmark, run_quick


@pytest.mark.slow
def test_lr_stability_quick_shows_the_collapse_and_the_stable_lr():
    saved = run_quick("lr_stability")
    runs = {run["lr"]: run for run in saved["runs"]}
    assert set(runs) == {0.05, 0.003125}
    high, low = runs[0.05], runs[0.003125]
    untrained = math.log(6)
    assert high["untrained_loss"] == pytest.approx(untrained)
    # the first updates at 0.05 throw the loss far above an untrained net's ...
    assert high["max48"] > 4 * untrained and high["first3"] > 2 * untrained
    # ... and the net ends predicting one class: the loss of a constant guess, at chance
    assert high["collapsed"] and high["train_loss"] == pytest.approx(untrained, abs=0.05)
    assert low["max48"] < 2 * untrained and low["train_loss"] < untrained - 0.1
    assert not low["collapsed"] and low["accuracy"] > 1.5 / 6
    assert saved["headline"]["shapes-150-seed-0_convnet_largest_stable_lr"] == 0.003125


def test_largest_stable_lr_per_dataset_and_net():
    stability = load_benchmark("lr_stability")
    runs = [
        {"dataset": "d", "net": "n", "lr": 0.1, "collapsed": True},
        {"dataset": "d", "net": "n", "lr": 0.05, "collapsed": False},
        {"dataset": "d", "net": "n", "lr": 0.01, "collapsed": False},
        {"dataset": "d", "net": "m", "lr": 0.1, "collapsed": True},
    ]
    assert stability.largest_stable(runs) == {
        "d_n_largest_stable_lr": 0.05,
        "d_m_largest_stable_lr": None,
    }


def test_the_warmup_rises_linearly_to_the_rate_and_a_collapsed_seed_marks_its_rate():
    stability = load_benchmark("lr_stability")
    assert [stability.warmed_lr(0.05, k, 4) for k in range(6)] == pytest.approx(
        [0.0125, 0.025, 0.0375, 0.05, 0.05, 0.05]
    )
    assert stability.warmed_lr(0.05, 0, 0) == 0.05
    runs = [
        {"dataset": "d", "net": "n", "lr": 0.1, "seed": 0, "collapsed": False},
        {"dataset": "d", "net": "n", "lr": 0.1, "seed": 1, "collapsed": True},
        {"dataset": "d", "net": "n", "lr": 0.05, "seed": 0, "collapsed": False},
        {"dataset": "d", "net": "n", "lr": 0.05, "seed": 1, "collapsed": False},
    ]
    assert stability.largest_stable(runs) == {"d_n_largest_stable_lr": 0.05}


def test_a_scaled_net_reads_its_map_divided_by_the_root_of_its_positions():
    stability = load_benchmark("lr_stability")
    image = {"num_classes": 6, "in_channels": 3, "input_height": 32, "input_width": 32}
    torch.manual_seed(0)
    plain = stability.build("convnet", image)
    torch.manual_seed(0)
    scaled = stability.build("convnet-scaled", image)
    x = torch.randn(2, 3, 32, 32)
    plain.eval()
    scaled.eval()
    last_map = x
    for block in plain.blocks:
        last_map = block(last_map)
    assert last_map.shape[1:] == (128, 4, 4)
    # sqrt(4 x 4) = 4
    torch.testing.assert_close(scaled(x), plain.classifier(torch.flatten(last_map, 1) / 4))
