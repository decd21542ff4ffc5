"""Smoke test of ``benchmarks/fedoras_tiers.py --quick``: it finishes and reports."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import ROOT, run_quick


@pytest.mark.slow
def test_fedoras_tiers_quick_reports_every_comparison():
    saved = run_quick("fedoras_tiers")
    cases = {(case["name"], case["alpha"]): case for case in saved["cases"]}
    assert set(cases) == {
        ("opa", 0.1),
        ("opa", 1.0),
        ("fedavg", 0.1),
        ("budget-1", 0.1),
        ("budget-1/4", 0.1),
        ("tier-unaware", 0.1),
    }
    for (name, _alpha), case in cases.items():
        tiers = case["tiers"]
        for model in case["models"]:
            tier = tiers[model["tier"] - 1]
            assert tier["low"] <= model["flops"] <= tier["high"]
        inits = {m["init"] for m in case["models"]}
        with_rand_init = name in ("opa", "tier-unaware")
        assert inits == ({"supernet", "random"} if with_rand_init else {"supernet"})
        if with_rand_init:  # rand-init trains the same architectures
            arch = {(m["tier"], m["init"]): m["arch"] for m in case["models"]}
            assert all(arch[(t, "random")] == arch[(t, "supernet")] for t, _ in arch)
    # the tier-unaware baseline: every client in the top tier, every model tested on all
    unaware = cases[("tier-unaware", 0.1)]
    assert {m["test"]["clients"] for m in unaware["models"]} == {8}  # both inits
    assert [m["test"]["clients"] for m in cases[("opa", 0.1)]["models"][::2]] != [8, 8]
    down = {name: cases[(name, 0.1)]["stage1-bytes-down-per-message"] for name, _ in cases}
    assert down["budget-1/4"] < down["opa"] < down["budget-1"]
    assert not (ROOT / "benchmarks/results/fedoras_tiers.quick.partial.json").exists()


def test_a_stopped_run_keeps_its_finished_cases_for_merge(tmp_path, monkeypatch) -> None:
    """Each finished case is saved as it ends, in a file that ``--merge`` takes."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import fedoras_tiers

    todo = fedoras_tiers.cases([0, 1], ["opa"])
    measured = fedoras_tiers.settings(False)
    path = tmp_path / "x.partial.json"
    save = fedoras_tiers.partial_saver(path, todo, measured, 40)
    save(2, {"models": [], "tiers": [], "seconds": 1.0})  # finished out of order
    save(0, {"models": [], "tiers": [], "seconds": 2.0})
    done = fedoras_tiers.merged_cases([path], measured, 40)
    assert set(done) == {fedoras_tiers.case_key(todo[2]), fedoras_tiers.case_key(todo[0])}
    assert done[fedoras_tiers.case_key(todo[2])]["seconds"] == 1.0
    with pytest.raises(SystemExit, match="clients=40"):
        fedoras_tiers.merged_cases([path], measured, 8)
