"""The fault benchmark's ``--quick`` run: its table and headline, every fault handled."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_faults_quick_tries_every_kind_and_handles_all():
    saved = run_quick("faults")
    headline = saved["headline"]
    assert headline["all_handled"] is True
    assert headline["faults_tried"] == headline["faults_handled"] > 500
    assert headline["faults_lost"] == 0
    assert headline["reply_kinds"] >= 15
    table = saved["table"]
    assert table["corrupted files"]["tried"] >= 23
    assert table["terminating signals"]["tried"] == table["terminating signals"]["handled"] >= 6
    assert table["oversized replies"]["tried"] == table["oversized replies"]["handled"] >= 3
    assert table["malformed replies (fedoras)"]["corrupted nothing"] == headline["reply_kinds"]
    assert headline["profile_kinds"] >= 12 and headline["runs_lost"] == 0
    assert table["bad profiles (fedoras)"]["corrupted nothing"] == headline["profile_kinds"]
