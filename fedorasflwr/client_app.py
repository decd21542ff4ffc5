"""ClientApp: short handlers that delegate to ``clients.<method>``.

Identity comes from ``context.node_config`` (``partition-id``,
``num-partitions``, optional ``tier`` and ``cluster``); the data settings
from the run config; what to do from the message's ConfigRecord.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from .clients import decnas, dpfnas, fdnas, fedoras
from .clients.training import device_mod
from .config import parse_run_config
from .data import ClientData, load_client_data
from .protocol import PROFILE

app = ClientApp(mods=[device_mod])  # every handler runs on this node's device


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
