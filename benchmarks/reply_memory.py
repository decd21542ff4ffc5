"""How much memory does the server take for an oversized packed reply it refuses? (issue 42)

A node is sent a small instruction (a quarter-width ``cnn_s``-sized record of ~80 kB);
its reply is a packed record of 400 MB (as this project's ClientApp packs it: one
``uint8`` array and the index). The server path runs on it as ``exchange`` runs it on
the in-process grid: ``wire.unpack_replies`` (the size bound, then each packed index
against what was sent) and ``replies.screen_replies``. Measured around that path alone
(the reply already built, as the grid hands it over): the peak of ``tracemalloc``
(Python's and numpy's allocations) and the peak resident set (Linux's ``VmHWM``, reset
through ``/proc/self/clear_refs`` just before), each minus what was held before, against
the bytes sent. The same reply through the order of before issue 42 (unpacked first,
then bounded: ``unpack_replies`` without the messages sent) is measured for contrast.

On a deployment Flower itself first rebuilds the reply's arrays from their chunks
(``Array.inflate``) before the ServerApp holds the reply; that copy is Flower's and is
not measured here.

    python benchmarks/reply_memory.py            # a 400 MB reply (~1 min, ~2 GB of RAM)
    python benchmarks/reply_memory.py --quick    # CI smoke run (a 40 MB reply)
"""

# ruff: noqa: E402 (the package is imported after this checkout is put on sys.path)
from __future__ import annotations

import argparse
import gc
import io
import json
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from common import ROOT, report

if str(ROOT) not in sys.path:  # this checkout's package, not another installed one
    sys.path.insert(0, str(ROOT))

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from fedorasflwr.federation.replies import content_bytes, screen_replies
from fedorasflwr.federation.wire import unpack_replies
from fedorasflwr.nonce import echo, stamp
from fedorasflwr.packing import PACKED, VERSION
from fedorasflwr.protocol import ARRAYS, METRICS, PACKING

NODE = 7
STATUS = Path("/proc/self/status")


def _status_kib(field: str) -> int:
    for line in STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _instruction() -> Message:
    """~80 kB of arrays, stamped with a nonce as ``exchange`` stamps every instruction."""
    rng = np.random.default_rng(0)
    arrays = ArrayRecord(
        {
            "stem.weight": Array(rng.standard_normal((16, 1, 3, 3)).astype(np.float32)),
            "body.weight": Array(rng.standard_normal((64, 16, 3, 3)).astype(np.float32)),
            "head.weight": Array(rng.standard_normal((10, 1024)).astype(np.float32)),
        }
    )
    message = Message(RecordDict({ARRAYS: arrays}), dst_node_id=NODE, message_type="train.x")
    return stamp(message, "train", 1)


def _reply(instruction: Message, size: int) -> Message:
    """A packed reply of ``size`` bytes of weights: one ``uint8`` array (its ``.npy``
    bytes built in place: one copy of ``size``) and an index naming a sent key."""
    header = np.lib.format.header_data_from_array_1_0(np.zeros(0, np.uint8))
    header["shape"] = (size,)
    stream = io.BytesIO()
    np.lib.format.write_array_header_1_0(stream, header)
    prefix = stream.getvalue()
    buffer = bytearray(len(prefix) + size)
    buffer[: len(prefix)] = prefix
    holder = Array(dtype="uint8", shape=(size,), stype="numpy.ndarray", data=bytes(buffer))
    del buffer
    index = [["body.weight", "<f4", [size // 4], 0]]
    content = RecordDict(
        {
            ARRAYS: ArrayRecord({PACKED: holder}),
            METRICS: MetricRecord({"num-examples": 10}),
            PACKING: ConfigRecord({"version": VERSION, "index": json.dumps(index)}),
        }
    )
    reply = Message(content, reply_to=instruction)
    return echo(instruction, reply)


def _measure(path: Callable[[], Any]) -> dict[str, Any]:
    gc.collect()
    rss_before = _status_kib("VmRSS")
    STATUS.with_name("clear_refs").write_text("5")  # VmHWM := VmRSS
    tracemalloc.start()
    outcome = path()
    traced_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    hwm = _status_kib("VmHWM")
    return {
        "outcome": outcome,
        "traced_peak_bytes": traced_peak,
        "rss_peak_extra_bytes": max(0, hwm - rss_before) * 1024,
    }


def run(quick: bool) -> dict[str, Any]:
    # messages take their run and sender from the task identity (as InProcessGrid sets it)
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, SUPERLINK_NODE_ID
    size = (40 if quick else 400) * 10**6
    instruction = _instruction()
    sent_bytes = content_bytes(instruction.content)

    def server_path() -> str:
        reply = _reply_holder.pop()
        replies, refused = unpack_replies([reply], [instruction])
        replies, more = screen_replies([instruction], replies)
        reasons = [reason for _, reason in refused + more]
        return reasons[0] if reasons else "kept"

    def unpacked_first() -> str:  # the order of before issue 42: unpack, then bound
        reply = _reply_holder.pop()
        replies, refused = unpack_replies([reply])
        replies, more = screen_replies([instruction], replies)
        reasons = [reason for _, reason in refused + more]
        return reasons[0] if reasons else "kept"

    rows = {}
    for name, path in (("server-path", server_path), ("unpacked-first", unpacked_first)):
        _reply_holder.append(_reply(instruction, size))
        reply_bytes = content_bytes(_reply_holder[0].content)
        rows[name] = {**_measure(path), "reply_bytes": reply_bytes}
        _reply_holder.clear()
    server = rows["server-path"]
    headline = {
        "reply_mb": round(size / 1e6),
        "sent_bytes": sent_bytes,
        "refused": server["outcome"] != "kept",
        "traced_peak_bytes": server["traced_peak_bytes"],
        "rss_peak_extra_mb": round(server["rss_peak_extra_bytes"] / 1e6, 1),
        "extra_over_sent": round(
            max(server["traced_peak_bytes"], server["rss_peak_extra_bytes"]) / sent_bytes, 3
        ),
        "unpacked_first_traced_mb": round(rows["unpacked-first"]["traced_peak_bytes"] / 1e6, 1),
    }
    return {"sent_bytes": sent_bytes, "rows": rows, "headline": headline}


#: the reply under test, held here so that each path drops its last reference itself
_reply_holder: list[Message] = []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    args = parser.parse_args(argv)
    result = run(args.quick)
    headline = result.pop("headline")
    print("| path | outcome | tracemalloc peak | RSS peak extra |")
    print("| --- | --- | --- | --- |")
    for name, row in result["rows"].items():
        print(
            f"| {name} | {row['outcome'][:70]} | {row['traced_peak_bytes'] / 1e6:.2f} MB "
            f"| {row['rss_peak_extra_bytes'] / 1e6:.1f} MB |"
        )
    report("reply_memory", args.quick, headline, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
