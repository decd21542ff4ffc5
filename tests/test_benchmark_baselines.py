"""Smoke test of ``benchmarks/baselines.py --quick``: FedorAS, HeteroFL and FjORD on one
split, the baselines' tiers and MACs matched to FedorAS's, their compute to its."""

from __future__ import annotations

import json

import pytest

from tests.test_benchmarks import ROOT, load_benchmark, run_quick


@pytest.mark.slow
def test_baselines_quick_matches_tiers_macs_and_compute():
    saved = run_quick("baselines")
    assert not (ROOT / "benchmarks/results/baselines.quick.partial.json").exists()
    (case,) = saved["cases"]
    assert (case["seed"], case["alpha"]) == (0, 0.1)
    tiers = case["tiers"]
    for method in ("heterofl", "fjord"):
        served = case[method]["tiers"]
        assert [t["tier"] for t in served] == [t["index"] for t in tiers]
        for entry, tier in zip(served, tiers, strict=True):
            assert entry["macs"] <= tier["high-macs"]  # the tier's budget, in MACs
            # the same clients in the same tier as FedorAS's
            expected = sorted(
                int(p) for p, t in case["tier-of-partition"].items() if t == tier["index"]
            )
            assert entry["partitions"] == expected
            assert 0.0 <= entry["global_test_accuracy"] <= 1.0
        assert case[method]["rounds"] >= 1 and case[method]["client-flops"] > 0
    widths = case["widths"]
    assert widths == sorted(widths) and all(w * 64 == int(w * 64) for w in widths)
    headline = saved["headline"]
    for key in ("fedoras_minus_fjord_pp", "fedoras_minus_heterofl_pp", "t1_fedoras_minus_fjord_pp"):
        assert key in headline
    assert headline["seeds"] == "0"

    # --baseline-rounds: the baselines alone on that case's tiers and clients, FedorAS copied
    quick = str(ROOT / "benchmarks/results/baselines.quick.json")
    again = run_quick(
        "baselines", "--baseline-rounds", "3", "--cases-from", quick, saved_as="baselines.rounds-3"
    )
    (redone,) = again["cases"]
    assert again["settings"] == {**saved["settings"], "baseline-rounds": 3}
    for key in ("tiers", "widths", "tier-of-partition", "fedoras"):
        assert redone[key] == case[key], key
    for method in ("heterofl", "fjord"):
        assert redone[method]["rounds"] == 3
        served = redone[method]["tiers"]
        assert [t["partitions"] for t in served] == [t["partitions"] for t in case[method]["tiers"]]
        if case[method]["rounds"] < 3:  # more rounds of the same clients: more client FLOPs
            assert redone[method]["client-flops"] > case[method]["client-flops"]

    # --finetune-rounds: FedorAS alone, Stage 3 longer, on the same case; baselines copied
    longer = run_quick(
        "baselines",
        "--finetune-rounds",
        "3",
        "--cases-from",
        quick,
        saved_as="baselines.finetune-rounds-3",
    )
    (tuned,) = longer["cases"]
    assert longer["settings"] == {**saved["settings"], "fedoras.finetune-rounds": 3}
    for key in ("tiers", "widths", "tier-of-partition", "heterofl", "fjord"):
        assert tuned[key] == case[key], key
    # same seed, same Stage 1 and search: the same nets, fine-tuned for 3 rounds, not 1
    before = {m["tier"]: m for m in case["fedoras"]["models"]}
    for model in tuned["fedoras"]["models"]:
        assert model["arch"] == before[model["tier"]]["arch"]
        assert len(model["history"]) == 3 and len(before[model["tier"]]["history"]) == 1
    copied = tuned["fedoras"]["copied-from-case"]
    assert copied["client-flops"] == case["fedoras"]["client-flops"]
    assert tuned["fedoras"]["client-flops"] > case["fedoras"]["client-flops"]

    # --rand-init: the same searched nets, also trained from scratch for FjORD's rounds
    control = run_quick(
        "baselines", "--rand-init", "--cases-from", quick, saved_as="baselines.rand-init"
    )
    (scratch,) = control["cases"]
    assert control["settings"] == {
        **saved["settings"],
        "fedoras.compare-rand-init": True,
        "fedoras.rand-init-clients-per-round": saved["settings"]["fjord.clients-per-round"],
        "fedoras.rand-init-rounds": "fjord",
    }
    for key in ("tiers", "widths", "tier-of-partition", "heterofl", "fjord"):
        assert scratch[key] == case[key], key
    # the supernet-init nets as the case had them, to the digit: the control changes nothing
    assert scratch["fedoras"]["models"] == case["fedoras"]["models"]
    random = scratch["fedoras"]["rand-init"]
    assert [m["arch"] for m in random] == [m["arch"] for m in case["fedoras"]["models"]]
    assert all(len(m["history"]) == case["fjord"]["rounds"] for m in random)
    assert all(0.0 <= m["global-test-accuracy"] <= 1.0 for m in random)
    for key in (
        "randinit_minus_fjord_pp",
        "fedoras_minus_randinit_pp",
        "t1_randinit_minus_fjord_pp",
    ):
        assert key in control["headline"]


def test_stage1_epochs_ablation_keeps_stage1_steps_and_rejects_a_non_divisor(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import baselines

    full = baselines.settings(False)
    ablation = baselines.settings(False, 10)
    assert (full["fedoras.rounds"], full["fedoras.local-epochs"]) == (150, 2)
    assert full == baselines.settings(False, baselines.STAGE1_EPOCHS)
    assert (ablation["fedoras.rounds"], ablation["fedoras.local-epochs"]) == (30, 10)
    # the quick run keeps fedoras_tiers.py's one round of one epoch
    quick = baselines.settings(True)
    assert (quick["fedoras.rounds"], quick["fedoras.local-epochs"]) == (1, 1)
    # a result file's name says a Stage 1 other than its run's default
    assert baselines.stage1_suffix(False, None) == baselines.stage1_suffix(False, 2) == ""
    assert baselines.stage1_suffix(False, 10) == ".stage1-epochs-10"
    assert baselines.stage1_suffix(True, None) == ""
    assert baselines.stage1_suffix(True, 1) == ".stage1-epochs-1"
    # only Stage 1 moves: fine-tuning and the baselines' recipe stay as they were
    assert {
        k: v for k, v in ablation.items() if k not in ("fedoras.rounds", "fedoras.local-epochs")
    } == {k: v for k, v in full.items() if k not in ("fedoras.rounds", "fedoras.local-epochs")}
    with pytest.raises(SystemExit, match="--stage1-epochs 7: must be a positive divisor of 300"):
        baselines.settings(False, 7)


def test_merge_refuses_a_file_of_the_other_head(tmp_path):
    """A result file names the space's head; one from before the option (no ``space.head``)
    was measured with the GAP head and is not merged into a flatten-head run."""
    baselines = load_benchmark("baselines")
    measured = baselines.settings(quick=True)
    assert measured["space.head"] == "flatten"
    case = {"seed": 0, "alpha": 0.1}
    same = tmp_path / "same.json"
    same.write_text(json.dumps({"clients": 8, "settings": measured, "cases": [case]}))
    assert baselines.merged([same], measured, 8) == {(0, 0.1): case}
    old = {key: value for key, value in measured.items() if key != "space.head"}
    before = tmp_path / "before.json"
    before.write_text(json.dumps({"clients": 8, "settings": old, "cases": [case]}))
    with pytest.raises(SystemExit, match="other settings"):
        baselines.merged([before], measured, 8)
    assert baselines.merged([before], {**measured, "space.head": "gap"}, 8) == {(0, 0.1): case}


def test_merge_reads_a_file_without_the_reduction_or_stage1_probe_as_before_them(tmp_path):
    """A file from before ``space.reduction``, ``fedoras.lr-probe`` and Stage 1's lr 0.05 was
    measured with the paper's reduction and Stage 1 at lr 0.1 as given: it merges into such
    a run, not into one at today's defaults (max pooling first, lr 0.05) or another."""
    baselines = load_benchmark("baselines")
    today = baselines.settings(quick=True)
    assert today["space.reduction"] == "maxpool-conv1x1"
    assert today["fedoras.lr"] == 0.05
    assert today["fedoras.lr-probe"] is False
    measured = {**today, "space.reduction": "conv1x1-avgpool", "fedoras.lr": 0.1}
    case = {"seed": 1, "alpha": 1.0}
    keys = ("space.reduction", "fedoras.lr-probe", "fedoras.lr")
    old = {k: v for k, v in measured.items() if k not in keys}
    before = tmp_path / "before.json"
    before.write_text(json.dumps({"clients": 8, "settings": old, "cases": [case]}))
    assert baselines.merged([before], measured, 8) == {(1, 1.0): case}
    for other in (today, {**measured, "fedoras.lr-probe": True}):
        with pytest.raises(SystemExit, match="other settings"):
            baselines.merged([before], other, 8)


def test_stage1_rounds_only_with_finetune_rounds():
    baselines = load_benchmark("baselines")
    with pytest.raises(SystemExit, match="--rand-init: not with --baseline-rounds"):
        baselines.main(["--rand-init", "--finetune-rounds", "90"])
    with pytest.raises(SystemExit, match="--stage1-rounds: only with --finetune-rounds"):
        baselines.main(["--stage1-rounds", "100"])
    with pytest.raises(SystemExit, match="--stage1-rounds 0: must be at least 1"):
        baselines.main(["--stage1-rounds", "0", "--finetune-rounds", "90"])
