"""Smoke test of ``benchmarks/engines.py --quick`` (tiny config, 2 nodes, all three engines)."""

from __future__ import annotations

import os
import statistics

import pytest

from tests.test_benchmarks import load_benchmark, run_quick


@pytest.mark.slow
def test_engines_quick_reports_every_engine_and_the_breakdown():
    saved = run_quick("engines")
    tiny = saved["results"]["tiny"]
    for engine in ("inprocess", "simulation", "deployment"):
        assert len(tiny[engine]["round_seconds"]) == 2
        assert tiny[engine]["median_round_after_first"] > 0
        assert tiny[engine]["breakdown"]["training"] > 0
    deployment = tiny["deployment"]
    headline = saved["headline"]
    assert saved["clients"] == 2
    assert deployment["threads"] == [max(1, (os.cpu_count() or 1) // 2)]
    assert deployment["breakdown"]["fixed_start_to_handler"] > 0
    # one profile query and one Stage-1 message per node and round, each its own process
    assert deployment["messages"] == 2 + 2 * 2
    assert len({record["pid"] for record in deployment["timings"]}) == deployment["messages"]
    # forked by the nodes' warm executors (one per node), never an flwr-clientapp
    assert len({record["ppid"] for record in deployment["timings"]}) == 2
    # the per-message fixed cost: process start to handler of the array-free messages
    # (the profile query), in the headline
    bare = [r for r in deployment["timings"] if r["arrays"] == 0]
    assert {r["message-type"] for r in bare} == {"query.profile"} and len(bare) == 2
    fixed = deployment["breakdown"]["per_message_fixed"]
    assert fixed == pytest.approx(
        statistics.median(r["handler-entry"] - r["process-start"] for r in bare), abs=1e-3
    )
    assert fixed > 0  # (not below the all-message median: on a loaded host either may lead)
    assert headline["tiny_per_message_fixed_s"] == fixed
    assert headline["tiny_deployment_over_simulation"] == tiny["deployment_over_simulation"] > 0
    assert headline["tiny_fixed_over_torch_import"] > 0
    # what the simulation engine adds to a Stage-1 round (the former stage1_overhead.py)
    sim, inprocess = (tiny[e]["median_round_after_first"] for e in ("simulation", "inprocess"))
    assert headline["tiny_simulation_over_inprocess"] == tiny["simulation_over_inprocess"]
    assert tiny["simulation_over_inprocess"] == pytest.approx(sim / inprocess, abs=1e-3)


def _record(kind: str, arrays: int, start: float, entry: float) -> dict:
    return {
        "message-type": kind,
        "arrays": arrays,
        "process-start": start,
        "module-loaded": start + 0.25,
        "handler-entry": entry,
        "data-loaded": entry + 0.5,
        "reply-built": entry + 2.5,
        "serialize-seconds": 0.01,
    }


@pytest.mark.parametrize("engine", ["deployment", "deployment-cold"])
def test_per_message_fixed_cost_is_start_to_handler_of_messages_without_arrays(engine):
    engines = load_benchmark("engines")
    records = [
        _record("query.profile", 0, 100.0, 100.5),  # 0.5 s
        _record("query.profile", 0, 200.0, 200.75),  # 0.75 s
        _record("query.profile", 0, 300.0, 302.0),  # 2.0 s
        _record("train.fedoras_supernet", 240, 400.0, 406.0),  # 6 s, most of it the pull
        _record("train.fedoras_supernet", 240, 500.0, 504.0),  # 4 s
    ]
    phases = engines.breakdown(records, engine)
    assert phases["per_message_fixed"] == 0.75  # median of 0.5, 0.75, 2.0
    assert phases["fixed_start_to_handler"] == 5.0  # the Stage-1 messages: median of 6, 4
    assert phases["start_to_app_imported"] == 0.25
    assert phases["training"] == 2.0 and phases["data_load"] == 0.5
    # in one process per engine (simulation, in-process) there is no process start to count
    assert "per_message_fixed" not in engines.breakdown(records, "simulation")


def test_engines_cpu_books_a_busy_child_and_names_the_roles():
    """``engines_cpu.py``'s sampler (the engines are not started here: its full run is in
    benchmarks/README.md): a child that burns CPU is booked with about what it used, under
    its command line, even after it exited, and the roles come from the command lines."""
    import subprocess
    import sys

    cpu = load_benchmark("engines_cpu")
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    with cpu.CpuSampler(period=0.05) as sampler:
        child = subprocess.Popen([sys.executable, "-c", burn])
        child.wait(timeout=60)
    used, cmdline = sampler.last[child.pid]
    assert used - sampler.start.get(child.pid, 0.0) >= 0.4
    assert "process_time" in cmdline  # the command line seen alive, not the zombie's ""
    assert sampler.by_role(set())["other"] >= 0.4
    assert sampler.by_role({child.pid})["clientapp (training message)"] >= 0.4
    assert cpu.role_of("/v/bin/python /v/bin/flower-supernode --insecure", 1, set()) == "supernode"
    assert cpu.role_of("/v/bin/python -m fedorasflwr.launch.warm --x", 1, set()).startswith("warm")
    assert cpu.role_of("/v/bin/python /v/bin/flwr-simulation --a", 1, set()).startswith("serverapp")
    assert cpu.role_of("ray::ClientAppActor", 1, set()) == "ray"
