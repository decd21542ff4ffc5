"""A reply may carry at most what was sent to its node plus ``REPLY_MARGIN`` bytes.

Flower 1.41 bounds no reply's total size on its way (arrays travel in 5 MB chunks of the
sender's choosing; see docs/protocol.md), so ``screen_replies`` - which every strategy
runs on the replies of every step - drops a larger reply with the reason, before anything
reads it. The whole-run case (an ``oversized`` node among honest ones, every method, the
result equal to the bit to the run without it) is ``test_replies.py``'s trial.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedorasflwr.federation.replies import (
    REPLY_MARGIN,
    check_reply_size,
    content_bytes,
    screen_replies,
)
from fedorasflwr.protocol import ARRAYS, METRICS


@pytest.fixture(autouse=True)
def server_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages take their run and sender from the task identity an engine sets (as
    ``InProcessGrid`` does): this test is the ServerApp's process."""
    for name, value in (("_run_id", 1), ("_task_id", 0), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value)


def _instruction(node_id: int, weights: np.ndarray) -> Message:
    content = RecordDict({ARRAYS: ArrayRecord({"w": Array(weights)})})
    return Message(content, dst_node_id=node_id, message_type="train.x")


def _reply(instruction: Message, extra: int = 0) -> Message:
    weights = instruction.content.array_records[ARRAYS]["w"].numpy()
    content = RecordDict(
        {
            ARRAYS: ArrayRecord({"w": Array(weights + 1)}),
            METRICS: MetricRecord({"num-examples": 10}),
        }
    )
    if extra:
        content["padding"] = ConfigRecord({"junk": bytes(extra)})
    return Message(content, reply_to=instruction)


def test_content_bytes_counts_arrays_text_numbers_and_names() -> None:
    array = Array(np.zeros(100, np.float32))
    content = RecordDict(
        {
            "a": ArrayRecord({"w": array}),
            "m": MetricRecord({"n": 1, "l": [1.0, 2.0]}),
            "c": ConfigRecord({"s": "abc", "b": b"12345"}),
        }
    )
    names = len("a") + len("w") + len("m") + len("n") + len("l") + len("c") + len("s") + 1
    assert content_bytes(content) == names + len(array.data) + 8 * 3 + 3 + 5


def test_a_reply_larger_than_what_was_sent_plus_the_margin_is_dropped_with_the_reason() -> None:
    sent = [_instruction(node, np.zeros(1000, np.float32)) for node in (1, 2, 3)]
    base = content_bytes(_reply(sent[0]).content)
    room = content_bytes(sent[0].content) + REPLY_MARGIN - base
    padding = len("padding") + len("junk")
    replies = [
        _reply(sent[0]),  # honest
        _reply(sent[1], extra=room - padding),  # exactly at the bound
        _reply(sent[2], extra=room - padding + 1),  # one byte over
    ]
    kept, refused = screen_replies(sent, replies)
    assert kept == replies[:2]
    ((node, reason),) = refused
    assert node == 3
    sent_bytes = content_bytes(sent[2].content)
    assert reason == (
        f"reply of {sent_bytes + REPLY_MARGIN + 1} bytes exceeds the {sent_bytes} bytes sent "
        f"to the node plus a margin of {REPLY_MARGIN}"
    )


def test_the_honest_reply_behind_an_oversized_one_still_counts() -> None:
    sent = [_instruction(7, np.zeros(10, np.float32))]
    oversized, honest = _reply(sent[0], extra=2 * REPLY_MARGIN), _reply(sent[0])
    kept, refused = screen_replies(sent, [oversized, honest])
    assert kept == [honest] and [node for node, _ in refused] == [7]
    assert check_reply_size(sent[0], honest) is None
