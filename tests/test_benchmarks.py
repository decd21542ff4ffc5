"""Benchmarks' ``--quick`` versions run in CI as smoke tests: they finish and report."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_quick(name: str, *extra: str, saved_as: str | None = None) -> dict:
    """Run ``benchmarks/<name>.py --quick [extra]``: it must exit 0 and end with a headline
    line whose every value is the one it saved in ``results/<saved_as or name>.quick.json``;
    returns that."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), "--quick", *extra],
        capture_output=True,
        text=True,
        timeout=1800,  # against a hang: a loaded 2-core machine runs some for minutes
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("headline: ")]
    assert lines, done.stdout[-2000:]
    printed = dict(item.split("=", 1) for item in lines[-1].split()[1:])
    saved = json.loads((ROOT / f"benchmarks/results/{saved_as or name}.quick.json").read_text())
    assert printed.pop("quick") == "True" and saved["quick"] is True
    # where and under what load it ran (issue 30: a ratio holds only under the same conditions)
    machine = saved["machine"]
    assert machine["device"] in {"cpu", "cuda", "cuda:0"} and machine["torch_threads"] >= 1
    for key in ("load_average_start", "load_average_end"):
        assert len(machine[key]) == 3 and all(v >= 0 for v in machine[key]), machine
    finished = datetime.fromisoformat(machine["finished"])  # when: reruns are ordered by it
    assert finished.tzinfo is not None and finished <= datetime.now(UTC)
    assert printed.keys() == saved["headline"].keys()
    for key, value in saved["headline"].items():
        if isinstance(value, float):
            assert float(printed[key]) == pytest.approx(value, abs=1e-3, nan_ok=True), key
        else:
            assert printed[key] == str(value), key
    return saved


def load_benchmark(name: str):
    """Import ``benchmarks/<name>.py`` (it imports its sibling ``common``)."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module(name)


def test_fedoras_tiers_runs_the_main_cases_at_every_seed_and_merges_earlier_files(tmp_path):
    tiers = load_benchmark("fedoras_tiers")
    keys = [tiers.case_key(c) for c in tiers.cases([0, 1, 2], [])]
    assert len(keys) == len(set(keys)) == 3 * 2 + 3 + 3
    assert {k for k in keys if k[0] != "opa"} == {
        ("fedavg", 0.1, 0),
        ("budget-1", 0.1, 0),
        ("budget-1/4", 0.1, 0),
        ("tier-unaware", 0.1, 0),  # the baseline, like the main runs, at every seed
        ("tier-unaware", 0.1, 1),
        ("tier-unaware", 0.1, 2),
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


@pytest.mark.slow
def test_threads_quick_compares_the_wait_policies():
    saved = run_quick("threads")
    assert [(r["policy"], r["threads"]) for r in saved["rows"]] == [
        ("default", saved["cores"]),
        ("PASSIVE", saved["cores"]),
    ]
    assert all(r["seconds"] > 0 for r in saved["rows"])
    assert saved["competitors"] == 0  # the smoke run takes no core from the suite
    (ratio,) = saved["headline"].values()
    assert ratio > 0


def test_fedoras_text_gain_is_rand_init_perplexity_minus_fedoras_per_tier():
    text = load_benchmark("fedoras_text")
    run = {
        "models": [
            {"tier": 1, "init": "supernet", "test": {"perplexity": 10.0, "accuracy": 0.4}},
            {"tier": 1, "init": "random", "test": {"perplexity": 14.5, "accuracy": 0.3}},
            {"tier": 2, "init": "supernet", "test": {"perplexity": 12.0, "accuracy": 0.35}},
            {"tier": 2, "init": "random", "test": None},  # not tested: no gain
        ]
    }
    assert text.per_tier(run, "random", "perplexity", 2) == [14.5, None]
    assert text.gains([run], 2) == [[4.5, None]]
    # the recipe is the paper's for its RNN task (Tables 9-11), at every size
    for quick in (True, False):
        recipe = text.settings(quick)
        assert recipe["space.name"] == "rnn" and recipe["fedoras.grad-clip"] == "auto"
        assert recipe["fedoras.finetune-lr-schedule"] == "step"
        assert recipe["fedoras.rand-init-rounds"] == recipe["fedoras.rounds"]


def test_suite_processes_names_each_kind_of_process_by_its_command_line():
    processes = load_benchmark("suite_processes")
    kinds = {
        "/v/bin/python -m pytest -p no:cacheprovider": "pytest (workers: in-process tests)",
        "python -u -c import sys;exec(eval(sys.stdin.readline()))": (
            "pytest (workers: in-process tests)"
        ),
        "ray::ClientAppActor": "Ray ClientApp actors",
        "ray::IDLE": "Ray runtime",
        "/v/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --x": "Ray runtime",
        "/v/bin/python3 /v/bin/flwr-simulation --runtime-api-address 127.0.0.1:1": (
            "flwr-simulation"
        ),
        "/v/bin/python3 /v/bin/flwr-serverapp --token t": "flwr-serverapp",
        "/v/bin/python3 /v/bin/flower-superlink --insecure": "SuperLink",
        "python -m fedorasflwr.launch.supernode --superlink 127.0.0.1:1": "SuperNode",
        "python -m fedorasflwr.launch.warm --insecure": "ClientApp executors",
        "/v/bin/python3 /v/bin/flower-superexec --insecure": "SuperExec",
        "/v/bin/python3 /v/bin/flwr ls local --run-id 3 --format json": "flwr command line",
        "python /r/benchmarks/scale.py --quick": "benchmarks' quick runs",
        "python -m fedorasflwr.launch --app-dir /r": "launcher and compare",
        "python -c import json, sys": "other Python processes",
        "/process_api --firecracker-init": "rest of the machine",
        "": "rest of the machine",
    }
    for command, kind in kinds.items():
        assert processes.kind_of(command) == kind, command


def test_the_proc_readers_book_a_busy_child_and_the_sampler_itself():
    """``common``'s /proc readers, which every CPU benchmark uses: a child that burns CPU
    is booked under its command line with about what its own clock says it used, the
    machine's CPU grows by at least as much, a reused pid is another process, and
    ``suite_processes`` books the sampler's own process as a row of its own."""
    common = load_benchmark("common")
    processes = load_benchmark("suite_processes")
    me = common.read_process(os.getpid())
    assert me is not None and me.pid == os.getpid() and me.cpu_s > 0
    assert sys.executable.split("/")[-1] in me.command
    assert common.read_process(2**22 + 1) is None  # above Linux's pid_max: no such process
    burn = (
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\n"
        "print(time.process_time())"
    )
    machine_before = common.machine_cpu_seconds()
    with common.ProcessSampler(interval=0.05) as sampler:
        child = subprocess.run(
            [sys.executable, "-c", burn], capture_output=True, text=True, timeout=60
        )
    own_clock = float(child.stdout)
    assert common.machine_cpu_seconds() - machine_before >= 0.6
    (booked,) = [
        (reading, used) for reading, used in sampler.spent() if "process_time" in reading.command
    ]
    # its last reading is at most one interval before it exited (plus interpreter start-up)
    assert own_clock - 0.2 <= booked[1] <= own_clock + 1.0, (booked, own_clock)
    assert sampler.samples >= 3
    cpu, count = processes.by_kind(sampler)
    assert count[processes.SAMPLER] == 1 and cpu[processes.SAMPLER] > 0  # its reading thread
    assert cpu["other Python processes"] >= own_clock - 0.2
    busy, total = common.machine_busy_jiffies()
    assert 0 < busy <= total
