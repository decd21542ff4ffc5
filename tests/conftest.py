"""Session-wide test settings: one torch thread, no telemetry, one shared data cache."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from fedorasflwr.training import apply_determinism, torch_device

# Tiny models gain nothing from intra-op threads, and a loaded 2-core machine
# makes two threads per process very slow; engines' clients inherit this too.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
torch.set_num_threads(1)
# On a GPU the suite computes as a run with the default 'deterministic = true' does (same
# seed, same result; no TF32 in the DP mechanism's exact checks); a no-op on the CPU.
apply_determinism(torch_device(), True)


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data cache for the session: partitions are built once, then loaded."""
    return tmp_path_factory.mktemp("data-cache")


# --- running the suite on several workers (pytest-xdist, see pyproject's addopts) -------
#
# ``--dist loadfile``: a module runs whole on one worker, so module- and session-scoped runs
# are made once (a session-scoped run shared by several tests, like the README's default
# search, has all its tests in one module). Modules are handed out in the order below,
# kept by ``--no-loadscope-reorder``: the README run first (the suite's longest), then the
# other modules that run a real engine, then the rest, so the longest does not start last.
# (pytest-xdist's ``loadgroup`` would allow groups across modules, but with pytest 9.2 its
# group suffix no longer reaches the node ids, and every worker ran the README search.)

#: session-scoped runs that the order above starts first
_LONGEST_RUNS = ("readme_run",)


#: test modules that leave the fast subset (``python -m pytest -m "not slow"``) besides
#: those marking themselves ``slow`` (the engines): one path per line, ``#`` comments. They
#: run federations in process (or benchmarks' quick modes) long enough to matter; the list
#: and how it was measured are in the file.
SLOW_MODULES_FILE = Path(__file__).with_name("slow_modules.txt")

#: benchmarks' ``--quick`` smoke runs left out of the default run (pyproject's addopts:
#: ``-m 'not benchmark'``; ``python -m pytest -m benchmark`` runs them): what they run, the
#: suite runs anyway (issue 44 item 5: "move benchmark smoke runs that duplicate a test's
#: assertions out"). faults.py re-runs the suite's own fault tests and its FedorAS reply and
#: profile trials; engines.py runs Stage 1 in process, on the simulation engine and deployed
#: (tests/engines/test_engines.py, test_every_method_deployed.py); fedoras_tiers.py,
#: fdnas_clusters.py and baselines.py run their methods as the quick presets and the
#: strategies' tests do. Together about 1,000 s of a CI worker's 14,400 (2026-12-03);
#: dpfnas_accounting.py and idle_cpu.py's 62 s of 3,800 since, and ten more below
#: (2026-12-07; CI's clean-clone run went from 1,146 s to 968 s on a 2-core AMD EPYC, this
#: file's session line), each beside the tests that assert what it asserts, or a timing.
#: Their modules' other tests (the scripts' own logic, by hand) stay in the
#: default run; so do the quick runs whose claims no test makes (space_ablation.py, which
#: issue 40 keeps in CI, lr_stability.py, decnas_cost.py, dpfnas_draws.py, scale.py, ...).
BENCHMARK_SMOKE_TESTS = frozenset(
    {
        "tests/test_benchmark_faults.py::test_faults_quick_tries_every_kind_and_handles_all",
        "tests/test_benchmark_engines.py::"
        "test_engines_quick_reports_every_engine_and_the_breakdown",
        "tests/test_benchmark_fedoras_tiers.py::test_fedoras_tiers_quick_reports_every_comparison",
        "tests/test_benchmark_fdnas_clusters.py::"
        "test_fdnas_clusters_quick_reports_every_comparison",
        "tests/test_benchmark_baselines.py::test_baselines_quick_matches_tiers_macs_and_compute",
        # two one-round CFDNAS runs: the preset's own test runs it whole
        "tests/test_benchmark_preset_variants.py::"
        "test_preset_variants_quick_runs_two_variants_of_quick_cfdnas",
        # DP-FNAS searches to account for: tests/strategies/test_dpfnas_accounting.py has the
        # cached accountants equal to opacus's bit for bit; what is left is a timing claim
        "tests/test_benchmark_dpfnas_accounting.py::test_dpfnas_accounting_quick_is_equal_and_cheaper",
        # a deployment left idle: the suite starts deployments anyway, and the executors'
        # back-off is asserted in tests/test_warm_executor.py
        "tests/test_benchmark_idle_cpu.py::test_idle_cpu_quick_reads_every_process_of_the_deployment",
        # 2026-12-07: inflated counts rejected, a lying
        # profile bounded by the median and trimmed mean: tests/strategies/
        # test_bounded_influence.py (by hand and through FedAvg's aggregation)
        "tests/test_benchmark_attacks.py::"
        "test_attacks_quick_reports_every_case_and_bounds_the_inflated_client",
        # the mixed step keeps more activations than any one path:
        # tests/search_spaces/test_mixed_memory.py; what is left is a memory measurement
        "tests/test_benchmark_fedoras_memory.py::test_fedoras_memory_quick_reports_single_below_mixed",
        # tables that sum paths and are validated against measured subnets, device classes
        # placed by their budgets in a real run: tests/test_latency.py,
        # tests/strategies/test_fedoras_latency.py
        "tests/test_benchmark_latency.py::"
        "test_latency_quick_reports_every_space_and_the_two_class_fedoras_run",
        # the probe's halving, bound and clipping: tests/test_lr_probe.py; what is left is
        # the learning a probed rate buys, a finding of the benchmark's own full run
        "tests/test_benchmark_lr_probe.py::test_lr_probe_quick_lowers_the_rate_and_the_run_learns_more",
        "tests/test_benchmark_path_probe.py::"
        "test_path_probe_quick_probes_the_same_path_with_each_reduction",
        # DP-FNAS searches, noised and not, of one and of two parties (tests/strategies/
        # test_dpfnas_*.py run both modes; the accountants equal opacus's there); what is left
        # is the benchmark's epsilon per noise level
        "tests/test_benchmark_dpfnas_privacy.py::test_dpfnas_privacy_quick_reports_every_row",
        # a run by latency within its budgets: tests/strategies/test_decnas_latency.py
        "tests/test_benchmark_decnas_latency.py::"
        "test_decnas_latency_quick_compares_both_resources_at_one_budget",
        # timings only (a write per round is tests/test_checkpoints.py's; the training loop
        # and the wait policies are the suite's everywhere)
        "tests/test_benchmark_checkpoint_cost.py::test_checkpoint_cost_quick_times_a_write_per_round",
        "tests/test_benchmark_client_throughput.py::"
        "test_client_throughput_quick_reports_ours_over_plain",
        "tests/test_benchmarks.py::test_threads_quick_compares_the_wait_policies",
        # a timing: the conversions' bytes and values against numpy's are tests/test_arrays.py's,
        # and every bit-equality test of the suite runs through them
        "tests/test_benchmark_array_codec.py::"
        "test_array_codec_quick_compares_both_sides_with_the_same_results",
        # a measurement of a pytest run (what kind_of names is tests/test_benchmarks.py's)
        "tests/test_benchmark_suite_processes.py::"
        "test_suite_processes_quick_reads_the_run_by_kind_of_process",
    }
)


def slow_modules() -> frozenset[str]:
    """The module paths of `SLOW_MODULES_FILE` (``tests/...py``, as node ids begin)."""
    lines = (line.split("#", 1)[0].strip() for line in SLOW_MODULES_FILE.read_text().splitlines())
    return frozenset(line for line in lines if line)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # before pytest's own hook deselects by marker (-m): this one runs first (tryfirst)
    slow = slow_modules()
    for item in items:
        module = item.nodeid.split("::")[0]
        if module in slow:
            item.add_marker(pytest.mark.slow)
        if item.nodeid in BENCHMARK_SMOKE_TESTS:
            item.add_marker(pytest.mark.benchmark)
    module_cost: dict[str, int] = {}
    for item in items:
        if any(fixture in item.fixturenames for fixture in _LONGEST_RUNS):
            cost = 0
        else:
            cost = 1 if item.get_closest_marker("slow") else 2
        module = item.nodeid.split("::")[0]
        module_cost[module] = min(module_cost.get(module, cost), cost)
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (module_cost[item.nodeid.split("::")[0]], order[id(item)]))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the cores, at most 4. Engine tests spend much of
    their time waiting (a SuperNode's polls, a lost node's heartbeats, process starts):
    on 2 cores, 2 workers kept the CPUs about 45% busy (user + system time of the suite
    over twice its wall time), 3 workers about 100%, and finished in 1040 s against 1175 s
    (one pair of runs, both next to another job: compare -n 2 and -n 3 on an idle
    machine). More than 4 would only compete for memory (each engine run starts its own
    processes and Ray cluster)."""
    return max(1, min((os.cpu_count() or 1) + 1, 4))


# --- where the suite's CPU goes (``benchmarks/suite_cpu.py``) ------------------------------

#: with this set to a file, every test appends one JSON line: the machine's CPU seconds
#: (user + nice + system over all cores, from /proc/stat: Ray's clients run at nice 15, and
#: an engine's processes are not this process's children) and the wall seconds from its
#: setup to its teardown. Only meaningful on one worker (``-n 0``) with nothing else running.
SUITE_CPU_LOG_ENV = "FEDORASFLWR_SUITE_CPU_LOG"


def _machine_cpu_seconds() -> float:
    with open("/proc/stat") as stat:
        user, nice, system = (int(v) for v in stat.readline().split()[1:4])
    return (user + nice + system) / os.sysconf("SC_CLK_TCK")


#: the machine's CPU and the wall clock when the session started (the controlling process
#: only: with pytest-xdist, not on its workers)
_SESSION_START: dict[str, float] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):
        _SESSION_START.update(cpu=_machine_cpu_seconds(), wall=time.monotonic())


@pytest.hookimpl(trylast=True)  # after the warnings and the durations: next to the verdict
def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """One line at the end of every run (CI's too): the machine's CPU seconds over the
    session, its wall seconds, and how busy that kept the cores. On a machine running
    nothing else, wall ~= CPU / cores when the cores were busy throughout: then only less
    CPU makes the suite faster. ``benchmarks/suite_cpu.py`` reads this line."""
    if "cpu" not in _SESSION_START:
        return
    cpu = _machine_cpu_seconds() - _SESSION_START["cpu"]
    wall = time.monotonic() - _SESSION_START["wall"]
    cores = os.cpu_count() or 1
    terminalreporter.write_line(
        f"machine CPU during the suite: {cpu:.1f} CPU-s in {wall:.1f} s wall on {cores} "
        f"cores ({cpu / max(wall * cores, 1e-9):.0%} busy; every process on the machine counts)"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    path = os.environ.get(SUITE_CPU_LOG_ENV)
    if not path:
        yield
        return
    cpu, wall = _machine_cpu_seconds(), time.monotonic()
    yield
    record = {
        "id": item.nodeid,
        "cpu": round(_machine_cpu_seconds() - cpu, 2),
        "wall": round(time.monotonic() - wall, 2),
    }
    with open(path, "a") as log:
        log.write(json.dumps(record) + "\n")
