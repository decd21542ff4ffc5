"""Smoke test of ``benchmarks/fdnas_clusters.py --quick``: it finishes and reports."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


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


def test_the_grad_clip_knob_sets_the_key_only_when_given(tmp_path):
    """``--grad-clip``: the run config's clip (5) unless given; ``0`` reproduces the runs
    recorded before the clip existed (``.grad-clip-0.0`` files), with the paper's GAP head."""
    from fedorasflwr.config import parse_run_config
    from tests.test_benchmarks import load_benchmark

    bench = load_benchmark("fdnas_clusters")
    knobs = {**bench.DEFAULTS, "target_flops": 0.5, "max_flops": 1.0}
    default = bench.settings(False, tmp_path, knobs)
    assert "fdnas.grad-clip" not in default
    assert parse_run_config(bench.run_config(default)).method_settings.train.grad_clip == 5.0
    paper = bench.settings(False, tmp_path, {**knobs, "head": "gap", "grad_clip": 0.0})
    settings = parse_run_config(bench.run_config(paper))
    assert settings.method_settings.train.grad_clip == settings.method_settings.final.grad_clip == 0
    assert settings.space.head == "gap"
