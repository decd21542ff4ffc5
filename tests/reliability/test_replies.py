"""Every kind of malformed reply in the catalogue, sent by a different node in the same
run of each method and width baseline (packed or plain, metadata that lies about the
bytes behind it included), is dropped with a log line naming the node and booked in the ledger,
and corrupts nothing: the run's result equals, to the bit, the run in which those
replies were never sent."""

from __future__ import annotations

import pytest

from fedorasflwr.federation.replies import REPLY_MARGIN
from tests.reliability import trials
from tests.reliability.trials import BASELINES, METHODS, reply_trial
from tests.runconfig import FEW_ROWS

#: smaller runs than benchmarks/faults.py's (which shares the trial): the claim holds for
#: any size, and these parts are what the trial's CPU went into (cProfile); every client
#: trains on 64 rows of its own (``FEW_ROWS``)
SMALLER = {
    "fedoras": {"fedoras.batch-size": 128},  # fewer, larger local steps
    "dpfnas": {"space.layers-per-block": 1},  # one darts cell
    # the lr probe (48 server-side steps per rate tried, before round 1) sends nothing:
    # a third of a baseline's trial, and tests/strategies/test_widths.py has its own tests
    "heterofl": {"heterofl.lr-probe": False},
    "fjord": {"fjord.lr-probe": False},
}


@pytest.fixture
def smaller_runs(monkeypatch):
    full = trials.run_config_for

    def smaller(method, cache):
        return {**full(method, cache), **FEW_ROWS, **SMALLER.get(method, {})}

    monkeypatch.setattr(trials, "run_config_for", smaller)


@pytest.mark.parametrize("method", METHODS + BASELINES)
def test_each_malformed_reply_is_dropped_and_changes_nothing(
    method, data_cache, tmp_path, smaller_runs
):
    trial = reply_trial(method, data_cache, tmp_path)
    for row in trial["rows"]:
        assert row["logged"], f"{row['kind']}: no log line names node {row['node']}"
        assert row["booked"] > 0, f"{row['kind']}: node {row['node']} not booked as dropped"
    assert trial["identical"]
    assert trial["honest-dropped"] == 0
    # the size bound leaves room: no honest reply comes near what it was sent + the margin
    assert trial["honest-excess"] < REPLY_MARGIN / 4
