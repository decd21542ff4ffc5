"""A method that failed in ``python -m fedorasflwr.compare`` is reported by its real cause,
on one line: the launcher's refusal or the exception line of the run's log, not the
launcher's closing hints on where to look; the leaderboard's cell stays one line."""

from __future__ import annotations

from fedorasflwr.compare import leaderboard
from fedorasflwr.compare.execute import REASON_CHARS, failure_cause, one_line

#: the closing lines of a failed launch (``cli._how_to_see``): where to look, not why
HINTS = (
    "Flower home of this run: /o/flwr-home/20261127\n"
    "see it with:  FLWR_HOME=/o/flwr-home/20261127 flwr ls local\n"
    "              FLWR_HOME=/o/flwr-home/20261127 flwr log 4 local --show\n"
    'then stop the SuperLink they start:  pkill -f "/o/flwr-home/20261127/local-superlink/"\n'
)


def test_the_launchers_refusal_is_the_cause() -> None:
    log = "error: --run-config: run config 'fedoras.lr' = -1.0: allowed: > 0\n"
    assert failure_cause(log) == "error: --run-config: run config 'fedoras.lr' = -1.0: allowed: > 0"


def test_the_last_exception_line_is_the_cause_not_the_hints() -> None:
    log = (
        "\x1b[92mINFO \x1b[0m:      [stage1] round 1/2\n"
        "\x1b[91mERROR \x1b[0m:     ServerApp thread raised an exception: Traceback (most recent"
        " call last):\n"
        '  File "/x/runs.py", line 147, in check\n'
        "ValueError: run config 'data.dataset' = 'folder:/d' is invalid: 1 class\n"
        "    sub-directories\n"
        "\nFAILED: run 4 ended as 'finished:failed': ServerApp raised\n"
        "run 4: finished:failed; exit code 1\n" + HINTS
    )
    assert failure_cause(log) == (
        "ValueError: run config 'data.dataset' = 'folder:/d' is invalid: 1 class"
    )


def test_a_clients_error_as_ray_reports_it() -> None:
    log = (
        "ray.exceptions.RayTaskError(KeyError): ray::ClientAppActor.run() (pid=7)\n"
        '  File "/x/datasets/arrow_dataset.py", line 9\n'
        "KeyError: \"Column label not in the dataset. Current columns in the dataset: ['image']\"\n"
        + HINTS
    )
    assert failure_cause(log).startswith('KeyError: "Column label not in the dataset.')


def test_without_an_exception_the_failed_or_interrupted_line() -> None:
    assert failure_cause("x\nFAILED: run 3 timed out after 60.0s:\n" + HINTS) == (
        "FAILED: run 3 timed out after 60.0s:"
    )
    assert failure_cause("interrupted by SIGTERM; every Flower process ...\n" + HINTS) == (
        "interrupted by SIGTERM; every Flower process ..."
    )
    assert failure_cause("something odd\n" + HINTS) == "something odd"
    assert failure_cause("") == "no output"


def test_one_line_collapses_and_cuts() -> None:
    assert one_line("a\n  b\tc\n") == "a b c"
    long = one_line("x " * 1000)
    assert len(long) == REASON_CHARS and long.endswith("\u2026")


def test_the_leaderboard_cell_of_a_failure_is_one_line() -> None:
    content = {
        "setting_text": "mnist5k",
        "engine": "simulation",
        "nodes": 2,
        "budget": {"rule": "rounds", "statement": "equal rounds"},
        "ranked_by": "global_test_accuracy",
        "methods": [
            {"method": "fednas", "status": "failed", "reason": "Traceback:\n  File x\nBoom: y"}
        ],
        "rows": [],
    }
    text = leaderboard.markdown(content)
    (row,) = [line for line in text.splitlines() if line.startswith("| fednas")]
    assert row.endswith("| Traceback: File x Boom: y |")
