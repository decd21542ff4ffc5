"""The ClientApp's ``num-threads`` node config and its opt-in timing log."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Message, RecordDict

from fedorasflwr.client_app import TIMING_LOG_ENV, app
from fedorasflwr.inprocess import InProcessGrid
from tests.runconfig import pyproject_run_config


def _profile_replies(
    data_cache: Path, node_config: dict, content: RecordDict | None = None
) -> list[Message]:
    config = pyproject_run_config() | {"data.cache-dir": str(data_cache)}
    grid = InProcessGrid(app, config, 2, node_configs={0: node_config})
    node = grid.node_of_partition[0]
    query = Message(content or RecordDict(), dst_node_id=node, message_type="query.profile")
    return list(grid.send_and_receive([query]))


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_num_threads_sets_torch_threads(data_cache: Path, restore_threads) -> None:
    torch.set_num_threads(1)
    [reply] = _profile_replies(data_cache, {"num-threads": 2})
    assert not reply.has_error()
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("bad", [0, -1, "two", True])
def test_bad_num_threads_is_an_error_reply_naming_the_key(
    data_cache: Path, restore_threads, bad: object
) -> None:
    [reply] = _profile_replies(data_cache, {"num-threads": bad})
    assert reply.has_error()
    assert "num-threads" in reply.error.reason


def test_timing_log_off_by_default_and_ordered_when_on(
    data_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "timing.jsonl"
    monkeypatch.delenv(TIMING_LOG_ENV, raising=False)
    _profile_replies(data_cache, {})
    assert not log.exists()
    monkeypatch.setenv(TIMING_LOG_ENV, str(log))
    [reply] = _profile_replies(data_cache, {})
    assert not reply.has_error()
    [record] = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["message-type"] == "query.profile" and record["partition-id"] == 0
    stamps = ["process-start", "module-loaded", "handler-entry", "data-loaded", "reply-built"]
    values = [record[k] for k in stamps]
    assert values == sorted(values), dict(zip(stamps, values, strict=True))
    assert record["serialize-seconds"] >= 0
    # what the engines benchmark's per-message fixed cost selects and checks: messages
    # without arrays (no payload to pull), and the process that started the ClientApp
    assert record["arrays"] == 0 and record["ppid"] == os.getppid()
    assert record["app-file"] == sys.modules["fedorasflwr.client_app"].__file__
    carried = RecordDict({"a": ArrayRecord([np.zeros(3)]), "b": ArrayRecord([np.ones(2)] * 2)})
    _profile_replies(data_cache, {}, carried)
    assert json.loads(log.read_text().splitlines()[-1])["arrays"] == 3
