"""Benchmarks' ``--quick`` versions run in CI as smoke tests: they finish and report."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_quick(name: str) -> subprocess.CompletedProcess[str]:
    """Run ``benchmarks/<name>.py --quick``; it must exit 0."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_stage1_overhead_quick_reports_a_ratio():
    done = run_quick("stage1_overhead")
    headline = re.search(r"^headline: engine_over_direct=([0-9.]+) ", done.stdout, re.M)
    assert headline, done.stdout[-2000:]
    saved = json.loads((ROOT / "benchmarks/results/stage1_overhead.quick.json").read_text())
    assert saved["engine_over_direct"] == pytest.approx(float(headline.group(1)), abs=0.01)
    assert len(saved["engine_round_seconds"]) == len(saved["direct_round_seconds"]) == 3


@pytest.mark.slow
def test_fdnas_clusters_quick_reports_every_comparison():
    done = run_quick("fdnas_clusters")
    headline = re.search(r"^headline: fdnas_acc=([0-9.]+) .* clusters=3 ", done.stdout, re.M)
    assert headline, done.stdout[-2000:]
    saved = json.loads((ROOT / "benchmarks/results/fdnas_clusters.quick.json").read_text())
    assert saved["headline"]["fdnas_acc"] == pytest.approx(float(headline.group(1)), abs=1e-3)
    names = [row["net"] for row in saved["rows"]]
    assert names[:2] == ["FDNAS", "fixed MobileNetV2-like"]
    assert sum(name.startswith("naive-CFDNAS") for name in names) == 3
    assert names[-1].startswith("centralised DNAS")


@pytest.mark.slow
def test_dpfnas_privacy_quick_reports_every_row():
    done = run_quick("dpfnas_privacy")
    headline = re.search(
        r"^headline: single_acc=([0-9.]+) .*worst_gap_pp=(-?[0-9.]+)", done.stdout, re.M
    )
    assert headline, done.stdout[-2000:]
    saved = json.loads((ROOT / "benchmarks/results/dpfnas_privacy.quick.json").read_text())
    assert saved["headline"]["single_acc"] == pytest.approx(float(headline.group(1)), abs=1e-3)
    modes = [(row["mode"], row["parties"]) for row in saved["rows"]]
    assert modes[:3] == [("single", 1), ("fnas", 2), ("dpfnas", 2)]
    noisy = [row for row in saved["rows"] if row["mode"] == "dpfnas"]
    assert all(float(row["epsilon"]) > 0 for row in noisy)
    # more noise, less privacy loss
    by_variance = sorted(noisy, key=lambda row: row["noise_variance"])
    assert float(by_variance[0]["epsilon"]) > float(by_variance[-1]["epsilon"])


@pytest.mark.slow
def test_fedoras_memory_quick_reports_single_below_mixed():
    done = run_quick("fedoras_memory")
    headline = re.search(r"^headline: single_over_mixed_activation=([0-9.]+) ", done.stdout, re.M)
    assert headline, done.stdout[-2000:]
    saved = json.loads((ROOT / "benchmarks/results/fedoras_memory.quick.json").read_text())
    ratio = saved["headline"]["single_over_mixed_activation"]
    assert ratio == pytest.approx(float(headline.group(1)), abs=1e-3)
    assert {row["space"] for row in saved["rows"]} == {"cnn_s", "cnn_l"}
    for row in saved["rows"]:
        # every option of every layer runs in the mixed step: well below half for one path
        assert 0 < row["sampled_over_mixed_activation"] < 0.5
        assert 0 < row["sampled_over_mixed_rss_peak_delta"] < 0.5


@pytest.mark.slow
def test_decnas_cost_quick_reports_every_variant():
    done = run_quick("decnas_cost")
    headline = re.search(r"^headline: uplink_vs_naive=([0-9.]+) ", done.stdout, re.M)
    assert headline, done.stdout[-2000:]
    saved = json.loads((ROOT / "benchmarks/results/decnas_cost.quick.json").read_text())
    assert saved["headline"]["uplink_vs_naive"] == pytest.approx(float(headline.group(1)), abs=1e-3)
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
    done = run_quick("fedoras_tiers")
    headline = re.search(r"^headline: min_gain_pp_alpha0.1=(-?[0-9.]+) ", done.stdout, re.M)
    assert headline, done.stdout[-2000:]
    saved = json.loads((ROOT / "benchmarks/results/fedoras_tiers.quick.json").read_text())
    assert saved["headline"]["min_gain_pp_alpha0.1"] == pytest.approx(
        float(headline.group(1)), abs=1e-3
    )
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
