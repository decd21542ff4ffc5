"""result.json's form: snake_case top-level keys, the ledger by partition id; its status: one
state (running, finished, failed, interrupted and by what), the error once."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from fedorasflwr import server_app
from fedorasflwr.checkpoints import STATES, Checkpointer, Snapshot, error_text
from fedorasflwr.client_app import app as client_app
from fedorasflwr.federation.base import StageFailedError
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.ledger import Ledger, by_partition, check_summary
from fedorasflwr.results import result_json
from fedorasflwr.server_app import interruption
from tests.runconfig import pyproject_run_config


def _ledger() -> Ledger:
    ledger = Ledger()
    for node, partition in ((11, 0), (12, 1)):
        ledger.assign(node, partition)
    ledger.sent("train", 11, 100)
    ledger.received("train", 11, 40)
    ledger.sent("train", 12, 100)
    ledger.failed("train", 12, "lost")
    ledger.sent("profile", 13, 0)  # never profiled
    ledger.assign(14, 1)  # node 12 came back as node 14 and took partition 1 over
    ledger.sent("train", 14, 100)
    ledger.received("train", 14, 60)
    return ledger


def test_the_ledger_of_result_json_is_by_partition_with_its_node_ids() -> None:
    stage = by_partition(_ledger().summary())["train"]
    assert stage["totals"]["messages"] == 3
    assert stage["partitions"] == {
        "0": {"node_ids": [11], "bytes_down": 100, "bytes_up": 40, "train_flops": 0,
              "messages": 1, "replies": 1, "failed": 0, "rejected": 0, "lost": 0,
              "timed_out": 0, "error_replies": 0},
        "1": {"node_ids": [12, 14], "bytes_down": 200, "bytes_up": 60, "train_flops": 0,
              "messages": 2, "replies": 1, "failed": 1, "rejected": 0, "lost": 1,
              "timed_out": 0, "error_replies": 0},
    }  # fmt: skip
    assert stage["unprofiled"] == {}
    profile = by_partition(_ledger().summary())["profile"]
    assert profile["partitions"] == {} and profile["unprofiled"]["13"]["messages"] == 1


def test_a_restored_ledger_keeps_each_node_s_partition() -> None:
    summary = _ledger().summary()
    assert summary["train"]["nodes"]["11"]["partition_id"] == 0
    assert check_summary(summary) is None
    restored = Ledger()
    restored.restore(summary)
    assert restored.summary() == summary
    reason = check_summary({"train": {"nodes": {"11": {"partition_id": -1}}}})
    assert reason is not None and "'partition_id'] = -1" in reason


def test_result_json_has_snake_case_keys_at_every_depth_and_keeps_data_keys() -> None:
    ledger = _ledger().summary()
    ledger["finetune-t1-supernet"] = ledger["train"]
    document = {
        "run-id": 7,
        "resumed-from": None,
        "tier-of-partition": {"0": 1},
        "models": [{"search-accuracy": 0.5, "history": [{"val-accuracy": 0.4}]}],
        "settings": {"output-dir": "x"},
        "onnx": {"tier-1.onnx": {"max-abs-diff": 0.0}},
        "latency-tables": {"groups": {"cluster-0": {"fixed-ms": 0.1}}},
        "ledger": ledger,
    }
    content = result_json(document)
    assert list(content) == [
        "run_id",
        "resumed_from",
        "tier_of_partition",
        "models",
        "settings",
        "onnx",
        "latency_tables",
        "ledger",
    ]
    assert content["models"] == [{"search_accuracy": 0.5, "history": [{"val_accuracy": 0.4}]}]
    assert content["settings"] == {"output_dir": "x"}
    assert content["tier_of_partition"] == {"0": 1}  # ids: data
    assert content["onnx"] == {"tier-1.onnx": {"max_abs_diff": 0.0}}  # file names: data
    groups = content["latency_tables"]["groups"]
    assert groups == {"cluster-0": {"fixed_ms": 0.1}}  # stage names: data
    assert "finetune-t1-supernet" in content["ledger"]  # stage names: data
    assert "finetune_t1_supernet" not in content["ledger"]
    assert set(content["ledger"]["train"]) == {"seconds", "totals", "partitions", "unprofiled"}
    with pytest.raises(ValueError, match="'run-id' and 'run_id' are the same key"):
        result_json({"run_id": 1, "run-id": 2})


# --- status: one state, the error once, what interrupted a run (issue 41) ------------------


def _main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_method) -> None:
    """``server_app.main`` with ``run_method`` as the method's runner; its result.json."""
    monkeypatch.setattr(server_app, "runner", lambda method: run_method)
    config = {**pyproject_run_config(), "output-dir": str(tmp_path)}
    context = Context(run_id=3, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    server_app.main(InProcessGrid(client_app, config, 1), context)


def _written(tmp_path: Path) -> dict:
    (path,) = tmp_path.glob("*/result.json")
    return json.loads(path.read_text())


def test_a_running_a_finished_a_failed_and_an_interrupted_status_differ(tmp_path) -> None:
    progress = Checkpointer(tmp_path, method="fdnas", seed=0)
    progress(Snapshot("final-fdnas", 0, None, Ledger()))  # the last stage begins
    running = progress.status(finished=False)
    assert running["state"] == "running" and running["stage_done"] is False
    # a finished run's last stage ended, whatever its last report said
    finished = progress.status(finished=True)
    assert (finished["state"], finished["finished"], finished["stage_done"]) == (
        "finished",
        True,
        True,
    )
    failed = progress.status(finished=False, error=ValueError("bad"))
    assert (failed["state"], failed["error"]) == ("failed", "ValueError: bad")
    stopped = progress.status(finished=False, interrupted="SIGTERM")
    assert (stopped["state"], stopped["interrupted_by"]) == ("interrupted", "SIGTERM")
    assert "error" not in stopped and "interrupted_by" not in failed
    assert {s["state"] for s in (running, finished, failed, stopped)} == set(STATES)


def test_the_error_is_its_original_cause_once_on_one_line_without_colour_codes() -> None:
    traceback = (
        "\x1b[36m(ClientAppActor pid=7)\x1b[0m Traceback (most recent call last):\n"
        '  File "x.py", line 3, in f\n    g()\n'
        'KeyError: "Column label not in the dataset"\n'
    )
    error = StageFailedError(
        "[gm0] 0 usable replies out of 2 message(s) sent; at least 2 required "
        f"(run config 'min-replies'). Reasons: error: {traceback}; error: {traceback}"
    )
    text = error_text(error)
    assert "\x1b" not in text and "\n" not in text
    assert text.count('KeyError: "Column label not in the dataset"') == 1
    assert text.startswith("StageFailedError: [gm0] 0 usable replies out of 2 message(s) sent;")
    assert "File " not in text  # the frames above the cause are not kept
    assert error_text(ValueError("a; b; b")) == "ValueError: a; b"


def test_a_failed_run_writes_its_error_once(tmp_path, monkeypatch) -> None:
    def fails(grid, settings, out_dir, progress):
        raise ValueError("run config 'x' = 1: \x1b[31mbad\x1b[0m")

    with pytest.raises(ValueError):
        _main(tmp_path, monkeypatch, fails)
    status = _written(tmp_path)["status"]
    assert status["state"] == "failed" and status["finished"] is False
    assert status["error"] == "ValueError: run config 'x' = 1: bad"


@pytest.mark.skipif(not hasattr(signal, "raise_signal"), reason="needs signal.raise_signal")
def test_a_run_stopped_by_a_signal_says_it_was_interrupted_and_by_which(
    tmp_path, monkeypatch
) -> None:
    def stopped(grid, settings, out_dir, progress):
        progress(Snapshot("search", 1, None, Ledger()))
        signal.raise_signal(signal.SIGTERM)  # the default action: the run is interrupted
        raise AssertionError("not reached")

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        _main(tmp_path, monkeypatch, stopped)
    assert signal.getsignal(signal.SIGTERM) == before  # the handler in place is restored
    status = _written(tmp_path)["status"]
    assert status["state"] == "interrupted" and status["interrupted_by"] == "SIGTERM"
    assert status["finished"] is False and "error" not in status
    assert (status["stage"], status["step"]) == ("search", 1)


def test_an_exit_without_a_signal_is_named() -> None:
    assert interruption(SystemExit(0), []) == "SystemExit(0)"
    assert interruption(KeyboardInterrupt(), []) == "KeyboardInterrupt"
    assert interruption(SystemExit(0), ["SIGTERM"]) == "SIGTERM"
