"""Every kind of bad profile in the catalogue (``PROFILE_FAULTS``), each sent by its own
node in one run of each method, drops that node with a log line naming it and a rejection
in the ledger, never loses the run, and reshapes nothing: the run's result equals, to the
bit, the run in which those nodes sent no profile at all."""

from __future__ import annotations

import pytest

from tests.reliability.test_replies import smaller_runs  # noqa: F401 - the fixture
from tests.reliability.trials import METHODS, profile_trial


@pytest.mark.parametrize("method", METHODS)
def test_each_bad_profile_drops_its_node_and_changes_nothing(
    method,
    data_cache,
    tmp_path,
    smaller_runs,  # noqa: F811 - the fixture imported above
):
    trial = profile_trial(method, data_cache, tmp_path)
    assert not trial["lost"], trial["lost"]
    for row in trial["rows"]:
        assert row["logged"], f"{row['kind']}: no log line names node {row['node']}"
        assert row["booked"] == 1, f"{row['kind']}: node {row['node']} not booked as rejected"
    assert trial["identical"]
