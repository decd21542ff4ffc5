"""ClientApp: short handlers that delegate to ``clients.<method>``.

Identity comes from ``context.node_config`` (``partition-id``,
``num-partitions``, optional ``tier`` and ``cluster``); the data settings
from the run config; what to do from the message's ConfigRecord.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from .clients.fedoras import train_supernet
from .config import parse_run_config
from .data import ClientData, load_client_data
from .protocol import PROFILE

app = ClientApp()


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
    return load_client_data(spec, partition_id, num_partitions)


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
    content = train_supernet(msg.content, _client_data(context), partition_id)
    return Message(content, reply_to=msg)
