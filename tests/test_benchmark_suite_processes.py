"""Smoke test of ``benchmarks/suite_processes.py --quick``: a pytest run read by kind of
process."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_suite_processes_quick_reads_the_run_by_kind_of_process():
    saved = run_quick("suite_processes")
    headline = saved["headline"]
    assert headline["pytest_exit_code"] == 0
    assert 0 < headline["covered"] <= 1.05  # the sampled processes: within the machine's CPU
    kinds = {row["kind"]: row for row in saved["rows"]}
    assert kinds["pytest (workers: in-process tests)"]["cpu_s"] > 0
    assert headline["pytest_workers_share"] == pytest.approx(
        kinds["pytest (workers: in-process tests)"]["share"], abs=1e-3
    )
    assert sum(row["share"] for row in saved["rows"]) == pytest.approx(1.0, abs=1e-2)
