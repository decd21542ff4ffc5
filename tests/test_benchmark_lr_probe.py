"""``benchmarks/lr_probe.py --quick`` (issue 40 item 4): one HeteroFL round on MNIST-5k at
the presets' lr 0.05, with the server's lr probe off and on, on the ConvNet's plain flatten
head (the scaled head, HeteroFL's default, keeps 0.05: nothing to lower). The probe starts from the
configured rate, keeps a smaller one for the ConvNet, and the run with it ends above the one
without it; the headline's keys, by hand."""

from __future__ import annotations

import math

import pytest

from tests.test_benchmarks import load_benchmark, run_quick


@pytest.mark.slow
def test_lr_probe_quick_lowers_the_rate_and_the_run_learns_more():
    saved = run_quick("lr_probe")
    rows = {row["probe"]: row for row in saved["rows"]}
    off, on = rows[False], rows[True]
    assert off["lr"] == 0.05 and off["tried"] == []  # lr-probe = false: no probe ran
    assert on["tried"][0]["lr"] == 0.05 and on["lr"] == on["tried"][-1]["lr"] < 0.05
    bound = 2 * math.log(10)  # twice an untrained net's loss on 10 classes
    assert on["tried"][-1]["max_loss"] <= bound
    assert all(t["max_loss"] > bound for t in on["tried"][:-1])
    assert len(on["tiers"]) == len(off["tiers"]) == 4
    # one round at the probed rate learns more than at 0.05 (0.37 against 0.15 when measured)
    assert on["mean"] > off["mean"] + 0.1
    assert on["near_chance"] <= off["near_chance"]


def test_headline_keys_by_hand():
    bench = load_benchmark("lr_probe")
    rows = [
        {"dataset": "d", "method": "m", "probe": False, "lr": 0.05, "mean": 0.2, "near_chance": 3},
        {"dataset": "d", "method": "m", "probe": True, "lr": 0.0125, "mean": 0.8, "near_chance": 0},
    ]
    assert bench.headline(rows) == {
        "d_m_probe_off": 0.2,
        "d_m_near_chance_off": 3,
        "d_m_probe_on": 0.8,
        "d_m_near_chance_on": 0,
        "d_m_lr": 0.0125,
    }


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--methods", "heterofl,decnas"], "allowed: heterofl, fjord, fedoras"),
        (["--methods", ""], "allowed: heterofl, fjord, fedoras"),
        (["--reduction", "maxpool-conv1x1"], "add fedoras to --methods"),
    ],
)
def test_bad_methods_or_a_reduction_without_fedoras_are_refused_before_any_run(argv, named):
    bench = load_benchmark("lr_probe")
    with pytest.raises(SystemExit, match=named):
        bench.main(argv)


def test_headline_over_seeds_by_hand():
    """Two seeds: the mean of the seeds' tier means, the near-chance tiers summed, the
    smallest rate the probe kept."""
    bench = load_benchmark("lr_probe")
    row = {"dataset": "d", "method": "m"}
    rows = [
        {**row, "seed": 0, "probe": False, "lr": 0.1, "mean": 0.2, "near_chance": 4},
        {**row, "seed": 0, "probe": True, "lr": 0.0125, "mean": 0.4, "near_chance": 0},
        {**row, "seed": 1, "probe": False, "lr": 0.1, "mean": 0.1, "near_chance": 3},
        {**row, "seed": 1, "probe": True, "lr": 0.025, "mean": 0.3, "near_chance": 1},
    ]
    assert bench.headline(rows) == {
        "d_m_probe_off": 0.15,
        "d_m_near_chance_off": 7,
        "d_m_probe_on": 0.35,
        "d_m_near_chance_on": 1,
        "d_m_lr": 0.0125,
    }
