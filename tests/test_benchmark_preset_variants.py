"""benchmarks/preset_variants.py: a quick preset under variants of its run config, each
final model's accuracies read back from the run's own result.json."""

from __future__ import annotations

from fedorasflwr.config import parse_run_config
from tests.test_benchmarks import load_benchmark, run_quick


def test_a_variant_is_the_preset_with_its_keys_and_seed():
    bench = load_benchmark("preset_variants")
    config = bench.preset_config("quick-cfdnas", bench.VARIANTS["flatten-clip-5"], 3, False)
    settings = parse_run_config(config)
    assert settings.seed == 3 and settings.space.head == "flatten"
    assert settings.method_settings.train.grad_clip == 5.0  # every FDNAS stage's
    assert settings.method_settings.final.grad_clip == 5.0
    assert settings.method_settings.train.lr == 0.1  # the preset's own keys kept
    gap = parse_run_config(bench.preset_config("quick-cfdnas", bench.VARIANTS["gap"], 0, True))
    assert gap.space.head == "gap" and gap.method_settings.train.grad_clip == 0.0
    assert gap.method_settings.train.rounds == gap.method_settings.final.rounds == 1


def test_models_reads_nets_or_the_single_model():
    bench = load_benchmark("preset_variants")
    nets = {
        "method": "cfdnas",
        "nets": [
            {"name": "fdnas", "averaged_accuracy": 0.6, "global_test_accuracy": 0.5},
            {"name": "cluster-0", "averaged_accuracy": 0.9, "global_test_accuracy": 0.3},
        ],
    }
    assert bench.models(nets) == [
        {"model": "fdnas", "test": 0.6, "global": 0.5},
        {"model": "cluster-0", "test": 0.9, "global": 0.3},
    ]
    single = {"method": "fednas", "test_accuracy": 0.8, "global_test_accuracy": 0.7}
    assert bench.models(single) == [{"model": "fednas", "test": 0.8, "global": 0.7}]


def test_preset_variants_quick_runs_two_variants_of_quick_cfdnas():
    saved = run_quick("preset_variants")
    assert saved["preset"] == "quick-cfdnas"
    assert list(saved["variants"]) == ["gap", "flatten"]
    rows = saved["rows"]
    assert {r["variant"] for r in rows} == {"gap", "flatten"}
    for variant in ("gap", "flatten"):
        mine = [r for r in rows if r["variant"] == variant]
        assert mine[0]["model"] == "fdnas" and len(mine) >= 3  # the global net, >= 2 clusters
        assert all(0.0 <= r["test"] <= 1.0 and 0.0 <= r["global"] <= 1.0 for r in mine)
