"""``benchmarks/idle_cpu.py --quick``: an idle local deployment's processes, each read for
its CPU over the window, by role; every role found (the times are the benchmark's: the
executors' back-off is asserted in tests/test_warm_executor.py, never a figure here)."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_idle_cpu_quick_reads_every_process_of_the_deployment():
    saved = run_quick("idle_cpu")
    roles = [row["role"] for row in saved["rows"]]
    assert roles.count("clientapp executor") == roles.count("supernode") == 2
    assert roles.count("superlink") == 1 and roles.count("superlink superexec") == 1
    assert all(row["cpu_s"] >= 0 for row in saved["rows"])
    headline = saved["headline"]
    assert headline["nodes"] == 2 and headline["window_s"] >= 10
    assert headline["idle_cores"] == pytest.approx(
        sum(row["cpu_s"] for row in saved["rows"]) / headline["window_s"], rel=0.05
    )
