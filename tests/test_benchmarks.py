"""Benchmarks' ``--quick`` versions run in CI as smoke tests: they finish and report."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_quick(name: str) -> dict:
    """Run ``benchmarks/<name>.py --quick``: it must exit 0 and end with a headline line
    whose every value is the one it saved in ``results/<name>.quick.json``; returns that."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("headline: ")]
    assert lines, done.stdout[-2000:]
    printed = dict(item.split("=", 1) for item in lines[-1].split()[1:])
    saved = json.loads((ROOT / f"benchmarks/results/{name}.quick.json").read_text())
    assert printed.pop("quick") == "True" and saved["quick"] is True
    assert printed.keys() == saved["headline"].keys()
    for key, value in saved["headline"].items():
        if isinstance(value, float):
            assert float(printed[key]) == pytest.approx(value, abs=1e-3, nan_ok=True), key
        else:
            assert printed[key] == str(value), key
    return saved


@pytest.mark.slow
def test_stage1_overhead_quick_reports_a_ratio():
    saved = run_quick("stage1_overhead")
    assert saved["engine_over_direct"] == saved["headline"]["engine_over_direct"] > 0
    assert len(saved["engine_round_seconds"]) == len(saved["direct_round_seconds"]) == 3


@pytest.mark.slow
def test_fdnas_clusters_quick_reports_every_comparison():
    saved = run_quick("fdnas_clusters")
    assert saved["headline"]["clusters"] == 3
    names = [row["net"] for row in saved["rows"]]
    assert names[:2] == ["FDNAS", "fixed MobileNetV2-like"]
    assert sum(name.startswith("naive-CFDNAS") for name in names) == 3
    assert names[-1].startswith("centralised DNAS")
    # by default no derived net may exceed the fixed net's FLOPs ("at no more FLOPs")
    fixed = saved["rows"][1]["flops"]
    assert saved["settings"]["fdnas.max-flops"] < 1.0
    assert all(row["flops"] <= fixed for row in saved["rows"] if row["net"] != names[1])


@pytest.mark.slow
def test_dpfnas_privacy_quick_reports_every_row():
    saved = run_quick("dpfnas_privacy")
    modes = [(row["mode"], row["parties"]) for row in saved["rows"]]
    assert modes[:3] == [("single", 1), ("fnas", 2), ("dpfnas", 2)]
    noisy = [row for row in saved["rows"] if row["mode"] == "dpfnas"]
    assert all(float(row["epsilon"]) > 0 for row in noisy)
    # more noise, less privacy loss
    by_variance = sorted(noisy, key=lambda row: row["noise_variance"])
    assert float(by_variance[0]["epsilon"]) > float(by_variance[-1]["epsilon"])


@pytest.mark.slow
def test_fedoras_memory_quick_reports_single_below_mixed():
    saved = run_quick("fedoras_memory")
    assert {row["space"] for row in saved["rows"]} == {"cnn_s", "cnn_l"}
    for row in saved["rows"]:
        # every option of every layer runs in the mixed step: well below half for one path
        assert 0 < row["sampled_over_mixed_activation"] < 0.5
        assert 0 < row["sampled_over_mixed_rss_peak_delta"] < 0.5


@pytest.mark.slow
def test_decnas_cost_quick_reports_every_variant():
    saved = run_quick("decnas_cost")
    variants = [row["variant"] for row in saved["rows"]]
    assert variants == [
        "DecNAS",
        "naive",
        "no-groups",
        "no-drop",
        "no-dynamic-rounds",
        "centralised NetAdapt",
    ]
    # the naive design uploads every candidate from every client: never cheaper
    assert all(row["uplink-bytes"] <= saved["rows"][1]["uplink-bytes"] for row in saved["rows"])
    assert saved["width-multiplier"]


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
    }
    for (name, _alpha), case in cases.items():
        tiers = case["tiers"]
        for model in case["models"]:
            tier = tiers[model["tier"] - 1]
            assert tier["low"] <= model["flops"] <= tier["high"]
        inits = {m["init"] for m in case["models"]}
        assert inits == ({"supernet", "random"} if name == "opa" else {"supernet"})
        if name == "opa":  # rand-init trains the same architectures
            arch = {(m["tier"], m["init"]): m["arch"] for m in case["models"]}
            assert all(arch[(t, "random")] == arch[(t, "supernet")] for t, _ in arch)
    down = {name: cases[(name, 0.1)]["stage1-bytes-down-per-message"] for name, _ in cases}
    assert down["budget-1/4"] < down["opa"] < down["budget-1"]


def load_benchmark(name: str):
    """Import ``benchmarks/<name>.py`` (it imports its sibling ``common``)."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module(name)


def test_fedoras_tiers_runs_the_main_cases_at_every_seed_and_merges_earlier_files(tmp_path):
    tiers = load_benchmark("fedoras_tiers")
    keys = [tiers.case_key(c) for c in tiers.cases([0, 1, 2], [])]
    assert len(keys) == len(set(keys)) == 3 * 2 + 3
    assert {k for k in keys if k[0] != "opa"} == {
        ("fedavg", 0.1, 0),
        ("budget-1", 0.1, 0),
        ("budget-1/4", 0.1, 0),
    }
    assert [tiers.case_key(c) for c in tiers.cases([1, 2], ["opa"])] == [
        ("opa", 0.1, 1),
        ("opa", 1.0, 1),
        ("opa", 0.1, 2),
        ("opa", 1.0, 2),
    ]
    assert tiers.results_name([0], []) == "fedoras_tiers"
    assert tiers.results_name([1, 2], ["opa"]) == "fedoras_tiers.seeds-1-2.opa"
    assert tiers.results_name([0], ["budget-1/4"]) == "fedoras_tiers.seeds-0.budget-1_4"
    # per tier, the mean of the seeds that have a gain: (2 - 4) / 2, 3, (1 + 2 + 6) / 3
    assert tiers.gain_over_seeds([[2.0, None, 1.0], [-4.0, 3.0, 2.0], [None, None, 6.0]]) == [
        -1.0,
        3.0,
        3.0,
    ]
    settings = tiers.settings(quick=True)
    old = {"name": "opa", "alpha": 0.1, "models": []}  # no "seed": written before --seeds
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps({"clients": 8, "settings": settings, "cases": [old]}))
    # such a file ran the pyproject's seed, 0
    assert tiers.merged_cases([path], settings, 8)[("opa", 0.1, 0)]["seed"] == 0
    with pytest.raises(SystemExit, match="clients=8"):
        tiers.merged_cases([path], settings, 40)
    with pytest.raises(SystemExit, match="--merge"):
        tiers.merged_cases([path], {**settings, "fedoras.rounds": 3}, 8)
