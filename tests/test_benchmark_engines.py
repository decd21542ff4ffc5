"""Smoke test of ``benchmarks/engines.py --quick`` (tiny config, 2 nodes, all three engines)."""

from __future__ import annotations

import math
import os
import statistics
import time

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
    # the load, per round (issue 44 item 3): one entry per round, from the samples in the
    # round's window; the mean round beside the median, and their ratios in the headline
    for engine in ("inprocess", "simulation", "deployment"):
        m = tiny[engine]
        assert [e["round"] for e in m["round_load"]] == [1, 2]
        assert 0 < m["max_sample_gap_s"] < 10  # the sampler kept its 0.5-s beat, give or take
        for entry in m["round_load"] + [m["run_load"]]:
            assert entry["window_s"] > 0, (engine, entry)
            if entry["window_s"] > max(0.5, m["max_sample_gap_s"]):
                assert entry["samples"] > 0, (engine, entry)
            if entry["samples"]:
                assert entry["load_avg_1m"] >= 0
                assert 0.0 <= entry["cpu_busy"] <= 1.0, (engine, entry)
        assert m["run_load"]["samples"] >= sum(e["samples"] for e in m["round_load"])
        mean = m["mean_round_after_first"]
        assert math.isfinite(mean) and mean > 0
        assert mean == pytest.approx(statistics.fmean(m["round_seconds"][1:]), abs=1e-3)
    means = [tiny[e]["mean_round_after_first"] for e in ("deployment", "simulation")]
    ratio = tiny["deployment_over_simulation_mean"]
    assert ratio == pytest.approx(means[0] / means[1], abs=1e-3) and ratio > 0
    assert headline["tiny_deployment_over_simulation_mean"] == ratio
    loads = [
        e["load_avg_1m"]
        for engine in ("inprocess", "simulation", "deployment")
        for e in tiny[engine]["round_load"]
        if e["samples"]
    ]
    assert loads and headline["tiny_max_round_load"] == tiny["max_round_load"] == max(loads)
    # the time between rounds, split by the ServerApp's grid records (deployments only)
    gaps = deployment["round_gaps"]
    assert gaps["rounds"] == 1 and gaps["server"] >= 0 and gaps["push"] >= 0
    parts = sum(gaps[part] for part in ("reply_to_grid", "server", "push", "to_process_start"))
    assert parts == pytest.approx(gaps["total"], abs=0.01)
    assert "round_gaps" not in tiny["simulation"]
    # a warm task's steps, joined to the ClientApp's record by pid (deployments only)
    tasks = deployment["task_timings"]
    assert sorted(t["pid"] for t in tasks) == sorted(r["pid"] for r in deployment["timings"])
    phases = deployment["task_phases"]
    assert phases["bare"]["messages"] == 2 and phases["train"]["messages"] == 4
    for kind in ("bare", "train"):
        assert all(phases[kind][name] >= 0 for name in ("fork", "pull", "install_fab", "push"))
        assert phases[kind]["fork_to_handler"] > 0
    assert "task_phases" not in tiny["simulation"]


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


def _timed(kind: str, server_round: int, start: float, entry: float, built: float) -> dict:
    return {
        "message-type": kind,
        "server-round": server_round,
        "process-start": start,
        "handler-entry": entry,
        "reply-built": built,
    }


def test_round_gaps_split_the_time_between_two_rounds():
    """Hand-made ClientApp and grid records: round 1's last reply is built at 14.0, the
    grid pulls it at 14.5 and returns, the server sends round 2 at 16.0 (pushed 16.25),
    and round 2's first process starts at 17.0: 0.5 + 1.5 + 0.25 + 0.75 = 3.0 s."""
    engines = load_benchmark("engines")
    records = [
        _timed("query.profile", -1, 1.0, 2.0, 3.0),
        _timed("train.fedoras_supernet", 1, 10.0, 11.0, 14.0),
        _timed("train.fedoras_supernet", 1, 10.5, 12.0, 13.0),
        _timed("train.fedoras_supernet", 2, 17.5, 18.0, 22.0),
        _timed("train.fedoras_supernet", 2, 17.0, 18.5, 21.0),
    ]

    def step(kind: str, sent: float, arrivals: list[float]) -> dict:
        return {
            "message-type": kind,
            "sent": sent,
            "pushed": sent + 0.25,
            "arrivals": arrivals,
            "returned": max(arrivals),
        }

    steps = [
        step("train.fedoras_supernet", 16.0, [21.5, 22.5]),  # out of order: sorted by sent
        step("query.profile", 0.5, [3.5]),
        step("train.fedoras_supernet", 9.0, [13.5, 14.5]),
    ]
    gaps = engines.round_gaps(records, steps)
    assert gaps == {
        "reply_to_grid": 0.5,
        "server": 1.5,
        "push": 0.25,
        "to_process_start": 0.75,
        "total": 3.0,
        "rounds": 1,
    }
    assert engines.round_gaps(records, []) == {}  # the simulation engine logs no steps


def test_task_phases_join_a_tasks_steps_to_its_message_by_pid():
    engines = load_benchmark("engines")
    records = [
        {**_record("query.profile", 0, 10.0, 10.5), "pid": 1},
        {**_record("train.fedoras_supernet", 240, 20.0, 20.25), "pid": 2},
        {**_record("train.fedoras_supernet", 240, 30.0, 30.75), "pid": 3},
    ]

    def task(pid: int, forked: float, install: float) -> dict:
        marks = {"pid": pid, "forked": forked, "child": forked + 0.01}
        at = forked + 0.01
        for step, took in (
            ("pull_task_input", 0.04),
            ("install_from_fab", install),
            ("load_client_app", 0.01),
        ):
            marks[f"{step}-start"], marks[f"{step}-end"] = at, at + took
            at += took
        return marks

    tasks = [task(1, 10.0, 0.25), task(2, 20.0, 0.0), task(3, 30.0, 0.5), task(9, 1.0, 1.0)]
    phases = engines.task_phases(records, tasks)  # pid 9 has no ClientApp record: left out
    assert phases["bare"]["messages"] == 1 and phases["train"]["messages"] == 2
    assert phases["bare"]["install_fab"] == 0.25 and phases["bare"]["fork_to_handler"] == 0.5
    assert phases["train"]["install_fab"] == 0.25  # median of 0.0 and 0.5
    assert phases["train"]["fork"] == pytest.approx(0.01)
    assert phases["train"]["pull"] == pytest.approx(0.04)
    assert phases["train"]["fork_to_handler"] == 0.5  # median of 0.25 and 0.75
    assert phases["train"]["push"] is None  # no push stamped
    assert engines.task_phases(records, []) == {}


def test_round_windows_and_the_load_inside_them():
    """Hand-made timing records, samples and windows: each round's window is the span of
    its training messages (process start on a deployment, handler entry elsewhere, to the
    last reply built), and its load the means of the samples stamped inside it."""
    engines = load_benchmark("engines")
    records = [
        _timed("query.profile", -1, 1.0, 2.0, 3.0),  # not a Stage-1 message: no round
        _timed("train.fedoras_supernet", 1, 10.0, 11.0, 14.0),
        _timed("train.fedoras_supernet", 1, 10.5, 12.0, 13.0),
        _timed("train.fedoras_supernet", 2, 20.0, 20.5, 22.0),
        _timed("train.fedoras_supernet", 2, 19.0, 21.0, 23.5),
    ]
    # round 3 had no timing record
    assert engines.round_windows(records, "deployment", 3) == [(10.0, 14.0), (19.0, 23.5), None]
    assert engines.round_windows(records, "simulation", 2) == [(11.0, 14.0), (20.5, 23.5)]

    samples = [
        {"time": 9.5, "load_avg_1m": 9.0, "cpu_busy": 0.9},  # before round 1
        {"time": 10.0, "load_avg_1m": 1.0, "cpu_busy": 0.5},  # on its start: inside
        {"time": 12.0, "load_avg_1m": 2.0, "cpu_busy": 0.25},
        {"time": 14.0, "load_avg_1m": 3.0, "cpu_busy": None},  # on its end; busy unknown
        {"time": 16.0, "load_avg_1m": 8.0, "cpu_busy": 1.0},  # between the rounds
        {"time": 19.5, "load_avg_1m": 1.5, "cpu_busy": 0.75},
        {"time": 23.0, "load_avg_1m": 2.5, "cpu_busy": 0.25},
    ]
    windows = [(10.0, 14.0), (19.0, 23.5), (24.0, 25.0), None]
    assert engines.round_load(samples, windows) == [
        {"round": 1, "window_s": 4.0, "samples": 3, "load_avg_1m": 2.0, "cpu_busy": 0.375},
        {"round": 2, "window_s": 4.5, "samples": 2, "load_avg_1m": 2.0, "cpu_busy": 0.5},
        {"round": 3, "window_s": 1.0, "samples": 0, "load_avg_1m": None, "cpu_busy": None},
        {"round": 4, "window_s": None, "samples": 0, "load_avg_1m": None, "cpu_busy": None},
    ]
    # the config's highest round load: over every engine's rounds, the empty ones skipped
    measured = {
        "simulation": {"round_load": engines.round_load(samples, windows)},
        "deployment": {"round_load": engines.round_load(samples, [(16.0, 16.0), None])},
        "deployment_over_simulation": 1.0,
    }
    assert engines.max_round_load(measured) == 8.0
    assert engines.max_round_load({"simulation": {"round_load": []}}) is None


def test_load_sampler_samples_every_period_and_once_at_the_end():
    engines = load_benchmark("engines")
    with engines.LoadSampler(period=0.1) as sampler:
        deadline = time.monotonic() + 0.45
        while time.monotonic() < deadline:  # keep a core busy
            pass
    stamps = [s["time"] for s in sampler.samples]
    assert len(stamps) >= 3 and stamps == sorted(stamps) and stamps[0] > sampler.started
    assert 0 < sampler.max_gap() < 5
    for sample in sampler.samples:
        assert sample["load_avg_1m"] >= 0
        assert sample["cpu_busy"] is None or 0.0 <= sample["cpu_busy"] <= 1.0
    assert any(s["cpu_busy"] for s in sampler.samples)  # this loop's core was busy


def test_engines_cpu_books_a_busy_child_and_names_the_roles():
    """``engines_cpu.py``'s sampler (the engines are not started here: its full run is in
    benchmarks/README.md): a child that burns CPU is booked with about what it used, under
    its command line, even after it exited, and the roles come from the command lines."""
    import subprocess
    import sys

    cpu = load_benchmark("engines_cpu")
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    with cpu.CpuSampler(interval=0.05) as sampler:
        child = subprocess.Popen([sys.executable, "-c", burn])
        child.wait(timeout=60)
    ((reading, used),) = [(r, u) for r, u in sampler.spent() if r.pid == child.pid]
    assert used >= 0.4
    assert "process_time" in reading.command  # the command line seen alive, not the zombie's ""
    assert sampler.by_role(set())["other"] >= 0.4
    assert sampler.by_role({child.pid})["clientapp (training message)"] >= 0.4
    assert cpu.role_of("/v/bin/python /v/bin/flower-supernode --insecure", 1, set()) == "supernode"
    assert cpu.role_of("/v/bin/python -m fedorasflwr.launch.warm --x", 1, set()).startswith("warm")
    assert cpu.role_of("/v/bin/python /v/bin/flwr-simulation --a", 1, set()).startswith("serverapp")
    assert cpu.role_of("ray::ClientAppActor", 1, set()) == "ray"
