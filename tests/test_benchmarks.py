"""Benchmarks' ``--quick`` versions run in CI as smoke tests: they finish and report."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_stage1_overhead_quick_reports_a_ratio():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "stage1_overhead.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    headline = re.search(r"^headline: engine_over_direct=([0-9.]+) ", done.stdout, re.M)
    assert headline, done.stdout[-2000:]
    saved = json.loads((ROOT / "benchmarks/results/stage1_overhead.quick.json").read_text())
    assert saved["engine_over_direct"] == pytest.approx(float(headline.group(1)), abs=0.01)
    assert len(saved["engine_round_seconds"]) == len(saved["direct_round_seconds"]) == 3
