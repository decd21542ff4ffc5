"""result.json's form: snake_case top-level keys, the ledger by partition id."""

from __future__ import annotations

import pytest

from fedorasflwr.ledger import Ledger, by_partition, check_summary
from fedorasflwr.results import result_json


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
