"""ClientApp: every method's handlers (``fedorasflwr.clients.register``) on this
project's data.

Identity comes from ``context.node_config`` (``partition-id``, ``num-partitions``,
optional ``tier`` and ``cluster``); the data settings from the run config; what to do
from the message's ConfigRecord. A node's partition is loaded once per process.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from .clients import register
from .config import parse_run_config
from .data import ClientData, load_client_data

#: When set, every handled message appends one JSON line of timestamps to this file
#: (``benchmarks/engines.py`` reads it); unset, the only cost is one dict lookup.
TIMING_LOG_ENV = "FEDORASFLWR_TIMING_LOG"
#: Seconds since the epoch when this module finished importing (timing only).
_MODULE_LOADED = time.time()
_MARKS: dict[str, float] = {}


def _timing(msg: Message, context: Context, call_next: _Handler) -> Message:
    """With ``$FEDORASFLWR_TIMING_LOG`` set, log where this message's time went."""
    path = os.environ.get(TIMING_LOG_ENV)
    if not path:
        return call_next(msg, context)
    _MARKS.clear()
    entered = time.time()
    reply = call_next(msg, context)
    done = time.time()
    serialized = _serialize_seconds(reply)
    record = {
        "pid": os.getpid(),
        "ppid": os.getppid(),  # the SuperExec that started it (deployment)
        "message-type": msg.metadata.message_type,
        "arrays": _arrays(msg),  # a message without any is pulled in no time
        "app-file": __file__,  # on a deployment: the FAB's copy under $FLWR_HOME/apps
        "partition-id": context.node_config.get("partition-id"),
        "server-round": _server_round(msg),
        "process-start": _process_start(),
        "module-loaded": _MODULE_LOADED,
        "handler-entry": entered,
        "data-loaded": _MARKS.get("data-loaded", entered),
        "reply-built": done,
        "serialize-seconds": serialized,
        "threads": _torch_threads(),
        "arrays-out": _arrays(reply),  # the reply's, as it leaves (packed: 1)
    }
    with open(path, "a", encoding="utf-8") as sink:
        sink.write(json.dumps(record) + "\n")
    return reply


def _serialize_seconds(reply: Message) -> float:
    """Seconds to turn the reply's content into protobuf bytes (what Flower sends)."""
    if reply.has_error():
        return 0.0
    from flwr.common.serde import recorddict_to_proto

    started = time.perf_counter()
    recorddict_to_proto(reply.content).SerializeToString()
    return time.perf_counter() - started


def _arrays(msg: Message) -> int:
    """How many arrays the message carries as it travelled (Flower moves each as its own
    object; this mod runs outside the library's, so a packed message carries 1)."""
    if msg.has_error():
        return 0
    return sum(len(record) for record in msg.content.array_records.values())


def _server_round(msg: Message) -> int:
    if msg.has_error() or "config" not in msg.content.config_records:
        return -1
    return int(msg.content.config_records["config"].get("server-round", -1))


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _process_start() -> float:
    """This process's start (epoch seconds, 10 ms resolution) from ``/proc``; or the
    module's import time where ``/proc`` is missing."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as uptime:
            now_uptime = float(uptime.read().split()[0])
        now = time.time()
        started_uptime = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _MODULE_LOADED
    return now - (now_uptime - started_uptime)


_Handler = Callable[[Message, Context], Message]


def _identity(context: Context) -> tuple[int, int]:
    try:
        return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    except KeyError as exc:
        raise ValueError(
            f"node config lacks {exc.args[0]!r}: start the SuperNode with "
            "--node-config 'partition-id=<i> num-partitions=<n>'"
        ) from None


def load_node_data(context: Context) -> ClientData:
    """This node's partition of the run config's dataset (``data.*``), from the disk cache
    (built on a miss): the ``load_data`` of this project's ClientApp."""
    partition_id, num_partitions = _identity(context)
    spec = parse_run_config(context.run_config).data
    data = load_client_data(spec, partition_id, num_partitions)
    _MARKS["data-loaded"] = time.time()
    return data


# The timing log outermost (it sees each message as it travelled: packed, and times the
# packed reply's serialization), then the factory's mods around every handler: packed
# messages, the thread cap, this node's device. A simulation worker serves many nodes: it
# keeps the data of the last 32 it served (a partition is small; on a miss it is read
# again from the disk cache, not re-partitioned).
app = register(ClientApp(mods=[_timing]), load_node_data, cache_nodes=32)
