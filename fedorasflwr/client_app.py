"""ClientApp: short handlers that delegate to ``methods.<method>.client``.

Identity comes from ``context.node_config`` (``partition-id``,
``num-partitions``, optional ``tier`` and ``cluster``); the data settings
from the run config; what to do from the message's ConfigRecord.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from .config import parse_run_config
from .data import ClientData, load_client_data
from .methods.decnas import client as decnas
from .methods.dpfnas import client as dpfnas
from .methods.fdnas import client as fdnas
from .methods.fedoras import client as fedoras
from .protocol import PROFILE
from .training import device_mod

#: When set, every handled message appends one JSON line of timestamps to this file
#: (``benchmarks/engines.py`` reads it); unset, the only cost is one dict lookup.
TIMING_LOG_ENV = "FEDORASFLWR_TIMING_LOG"
#: Seconds since the epoch when this module finished importing (timing only).
_MODULE_LOADED = time.time()
_MARKS: dict[str, float] = {}


def _node_threads(msg: Message, context: Context, call_next: _Handler) -> Message:
    """Honour the node config's ``num-threads`` (torch intra-op threads for this process).

    Several SuperNodes on one host each start a ClientApp process per message, and
    torch starts one thread per core in each: ``num-threads`` caps that.
    """
    threads = context.node_config.get("num-threads")
    if threads is not None:
        import torch

        torch.set_num_threads(_positive_threads(threads))
    return call_next(msg, context)


def _positive_threads(value: object) -> int:
    """``value`` as an integer >= 1, or ``ValueError`` naming the key."""
    try:
        threads = int(str(value))
    except ValueError:
        threads = 0
    if isinstance(value, bool) or threads < 1:
        raise ValueError(f"node config num-threads = {value!r} is invalid: an integer >= 1")
    return threads


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
        "message-type": msg.metadata.message_type,
        "partition-id": context.node_config.get("partition-id"),
        "server-round": _server_round(msg),
        "process-start": _process_start(),
        "module-loaded": _MODULE_LOADED,
        "handler-entry": entered,
        "data-loaded": _MARKS.get("data-loaded", entered),
        "reply-built": done,
        "serialize-seconds": serialized,
        "threads": _torch_threads(),
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

# thread cap, then this node's device for every handler, then the (optional) timing log
app = ClientApp(mods=[_node_threads, device_mod, _timing])


def _identity(context: Context) -> tuple[int, int]:
    try:
        return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    except KeyError as exc:
        raise ValueError(
            f"node config lacks {exc.args[0]!r}: start the SuperNode with "
            "--node-config 'partition-id=<i> num-partitions=<n>'"
        ) from None


def _client_data(context: Context) -> ClientData:
    """This node's partition (cached on disk: deployment starts a process per message)."""
    partition_id, num_partitions = _identity(context)
    spec = parse_run_config(context.run_config).data
    data = load_client_data(spec, partition_id, num_partitions)
    _MARKS["data-loaded"] = time.time()
    return data


@app.query("profile")
def profile(msg: Message, context: Context) -> Message:
    """Report partition id, data sizes, label histogram and declared tier/cluster."""
    partition_id, num_partitions = _identity(context)
    data = _client_data(context)
    record = ConfigRecord(
        {
            "partition-id": partition_id,
            "num-partitions": num_partitions,
            "num-train": len(data.train),
            "num-val": len(data.val),
            "num-test": len(data.test),
            "label-counts": list(data.label_counts),
            "tier": int(context.node_config.get("tier", -1)),
            "cluster": int(context.node_config.get("cluster", -1)),
        }
    )
    return Message(RecordDict({PROFILE: record}), reply_to=msg)


@app.train("fedoras_supernet")
def fedoras_supernet(msg: Message, context: Context) -> Message:
    """FedorAS Stage 1: local supernet training under the tier budget."""
    partition_id, _ = _identity(context)
    content = fedoras.train_supernet(msg.content, _client_data(context), partition_id)
    return Message(content, reply_to=msg)


@app.evaluate("fedoras_paths")
def fedoras_paths(msg: Message, context: Context) -> Message:
    """FedorAS Stage 2 (federated scoring): a generation's paths on the local val split."""
    partition_id, _ = _identity(context)
    content = fedoras.score_paths_locally(msg.content, _client_data(context), partition_id)
    return Message(content, reply_to=msg)


@app.train("fedoras_finetune")
def fedoras_finetune(msg: Message, context: Context) -> Message:
    """FedorAS Stage 3: local epochs of a tier's subnet (FedAvg fine-tuning)."""
    partition_id, _ = _identity(context)
    content = fedoras.train_subnet(msg.content, _client_data(context), partition_id)
    return Message(content, reply_to=msg)


@app.evaluate("fedoras_finetune")
def fedoras_evaluate(msg: Message, context: Context) -> Message:
    """FedorAS Stage 3: test loss and accuracy of a tier's subnet on the local test split."""
    content = fedoras.evaluate_subnet(msg.content, _client_data(context))
    return Message(content, reply_to=msg)


@app.train("fdnas_search")
def fdnas_search(msg: Message, context: Context) -> Message:
    """FDNAS / CFDNAS: local ProxylessNAS epochs on w (train split) and alpha (val split)."""
    partition_id, _ = _identity(context)
    content = fdnas.search_supernet(msg.content, _client_data(context), partition_id)
    return Message(content, reply_to=msg)


@app.train("fdnas_final")
def fdnas_final(msg: Message, context: Context) -> Message:
    """FDNAS / CFDNAS: local epochs of the derived net (FedAvg stage)."""
    partition_id, _ = _identity(context)
    content = fdnas.train_net(msg.content, _client_data(context), partition_id)
    return Message(content, reply_to=msg)


@app.evaluate("fdnas_final")
def fdnas_evaluate(msg: Message, context: Context) -> Message:
    """FDNAS / CFDNAS: test accuracy of a derived net on the local test split."""
    content = fdnas.evaluate_net(msg.content, _client_data(context))
    return Message(content, reply_to=msg)


@app.train("dpfnas_weights")
def dpfnas_weights(msg: Message, context: Context) -> Message:
    """DP-FNAS exchange (a): clipped, noised training gradient of the weights W."""
    partition_id, _ = _identity(context)
    content = dpfnas.weight_gradient(msg.content, _client_data(context), partition_id)
    return Message(content, reply_to=msg)


@app.train("dpfnas_arch")
def dpfnas_arch(msg: Message, context: Context) -> Message:
    """DP-FNAS exchange (b): clipped, noised validation gradient of the alphas A."""
    partition_id, _ = _identity(context)
    content = dpfnas.architecture_gradient(msg.content, _client_data(context), partition_id)
    return Message(content, reply_to=msg)


@app.train("dpfnas_final")
def dpfnas_final(msg: Message, context: Context) -> Message:
    """DP-FNAS: local epochs of the derived network (FedAvg stage)."""
    partition_id, _ = _identity(context)
    content = dpfnas.train_final(msg.content, _client_data(context), partition_id)
    return Message(content, reply_to=msg)


@app.evaluate("dpfnas_final")
def dpfnas_evaluate(msg: Message, context: Context) -> Message:
    """DP-FNAS: test accuracy of the derived network on the local test split."""
    content = dpfnas.evaluate_final(msg.content, _client_data(context))
    return Message(content, reply_to=msg)


@app.train("decnas_tune")
def decnas_tune(msg: Message, context: Context) -> Message:
    """DecNAS: tune a candidate, report its validation accuracy; keep the weights."""
    partition_id, _ = _identity(context)
    content = decnas.tune_candidate(msg.content, _client_data(context), partition_id, context.state)
    return Message(content, reply_to=msg)


@app.train("decnas_upload")
def decnas_upload(msg: Message, context: Context) -> Message:
    """DecNAS: upload the weights kept for a candidate that survived the round."""
    content = decnas.upload_candidate(msg.content, _client_data(context), context.state)
    return Message(content, reply_to=msg)


@app.train("decnas_fedavg")
def decnas_fedavg(msg: Message, context: Context) -> Message:
    """DecNAS: local epochs of GM_0, a chosen GM or a baseline (FedAvg stages)."""
    partition_id, _ = _identity(context)
    content = decnas.train_model(msg.content, _client_data(context), partition_id)
    return Message(content, reply_to=msg)


@app.evaluate("decnas")
def decnas_evaluate(msg: Message, context: Context) -> Message:
    """DecNAS: accuracy of a model on the local validation or test split."""
    content = decnas.evaluate_model(msg.content, _client_data(context))
    return Message(content, reply_to=msg)
