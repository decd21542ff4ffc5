"""Every kind of malformed reply in the catalogue, sent by a different node in the same
run of each method, is dropped with a log line naming the node and booked in the ledger,
and corrupts nothing: the run's result equals, to the bit, the run in which those
replies were never sent."""

from __future__ import annotations

import pytest

from tests.reliability.trials import METHODS, reply_trial


@pytest.mark.parametrize("method", METHODS)
def test_each_malformed_reply_is_dropped_and_changes_nothing(method, data_cache, tmp_path):
    trial = reply_trial(method, data_cache, tmp_path)
    for row in trial["rows"]:
        assert row["logged"], f"{row['kind']}: no log line names node {row['node']}"
        assert row["booked"] > 0, f"{row['kind']}: node {row['node']} not booked as dropped"
    assert trial["identical"]
