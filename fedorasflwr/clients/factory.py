"""Every handler of every method on a ClientApp, given a function that loads the node's data.

>>> from fedorasflwr.clients import make_client_app
>>> app = make_client_app(load_data)        # load_data(context) -> (train, val, test)

or, on a ClientApp of your own (its other handlers and mods stay as they are):

>>> from fedorasflwr.clients import register
>>> register(app, load_data)

The message types and records are those of ``docs/protocol.md``; each handler delegates
to ``fedorasflwr.methods.<method>.client``. See ``docs/library.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod

from ..data import ClientData
from ..methods.decnas import client as decnas
from ..methods.dpfnas import client as dpfnas
from ..methods.fdnas import client as fdnas
from ..methods.fednas import client as fednas
from ..methods.fedoras import client as fedoras
from ..methods.widths import client as widths
from ..nonce import echo
from ..packing import packed_messages
from ..protocol import CONFIG, PROFILE, sample_kind
from ..training import device_mod
from .latency import answer_latency
from .layer_latency import answer_layer_latency
from .node_data import LoadData, NodeData, NodeDataCache

__all__ = ["HANDLERS", "Handler", "make_client_app", "node_threads", "register"]

#: what a handler does with the message's content, this node's data and its context
Work = Callable[[RecordDict, NodeData, Context], RecordDict]


@dataclass(frozen=True)
class Handler:
    """One message type (``<category>.<action>``) and the work that answers it."""

    category: str
    action: str
    work: Work
    doc: str

    @property
    def message_type(self) -> str:
        return f"{self.category}.{self.action}"


def _profile(content: RecordDict, node: NodeData, context: Context) -> RecordDict:
    data = node.data
    inputs = data.train.tensors[0]  # one shape and dtype for every split (ClientData)
    record = ConfigRecord(
        {
            "partition-id": node.partition_id,
            "num-partitions": node.num_partitions,
            "num-train": len(data.train),
            "num-val": len(data.val),
            "num-test": len(data.test),
            "label-counts": list(data.label_counts),
            "sample-shape": [int(d) for d in inputs.shape[1:]],
            "sample-dtype": sample_kind(inputs.dtype),
            "tier": int(context.node_config.get("tier", -1)),
            "cluster": int(context.node_config.get("cluster", -1)),
            "device-class": str(context.node_config.get("device-class", "")),
            "latency-budget-ms": float(context.node_config.get("latency-budget-ms", 0.0)),
        }
    )
    return RecordDict({PROFILE: record})


def _seeded(work: Callable[[RecordDict, ClientData, int], RecordDict]) -> Work:
    """``work(content, data, partition_id)``: local training seeded by the partition id."""
    return lambda content, node, _: work(content, node.data, node.partition_id)


def _plain(work: Callable[[RecordDict, ClientData], RecordDict]) -> Work:
    """``work(content, data)``: evaluation, no randomness."""
    return lambda content, node, _: work(content, node.data)


def _private(work: Callable[[RecordDict, ClientData, int], RecordDict]) -> Work:
    """A DP-FNAS computation, done only if the node's owner allows the noise the message
    asks for (``dpfnas.check_noise_consent``: node config ``allow-reproducible-noise``)."""

    def answer(content: RecordDict, node: NodeData, context: Context) -> RecordDict:
        dpfnas.check_noise_consent(content.config_records[CONFIG], context.node_config)
        return work(content, node.data, node.partition_id)

    return answer


def _tune(content: RecordDict, node: NodeData, context: Context) -> RecordDict:
    return decnas.tune_candidate(content, node.data, node.partition_id, context.state)


def _upload(content: RecordDict, node: NodeData, context: Context) -> RecordDict:
    return decnas.upload_candidate(content, node.data, context.state)


#: every message type of every method (docs/protocol.md), in that page's order
HANDLERS: tuple[Handler, ...] = (
    Handler(
        "query", "profile", _profile, "partition id, split sizes, label histogram, sample, tier"
    ),
    Handler("query", "latency", lambda content, *_: answer_latency(content), "latency table"),
    Handler(
        "query",
        "decnas_latency",
        lambda content, *_: answer_layer_latency(content),
        "DecNAS: layer-wise latency table of a prunable net",
    ),
    Handler("train", "fedoras_supernet", _seeded(fedoras.train_supernet), "FedorAS Stage 1"),
    Handler("evaluate", "fedoras_paths", _seeded(fedoras.score_paths_locally), "Stage 2 scoring"),
    Handler("train", "fedoras_finetune", _seeded(fedoras.train_subnet), "FedorAS Stage 3"),
    Handler("evaluate", "fedoras_finetune", _plain(fedoras.evaluate_subnet), "Stage 3 test"),
    Handler("train", "fdnas_search", _seeded(fdnas.search_supernet), "FDNAS / CFDNAS search"),
    Handler("train", "fdnas_final", _seeded(fdnas.train_net), "FDNAS / CFDNAS final FedAvg"),
    Handler("evaluate", "fdnas_final", _plain(fdnas.evaluate_net), "FDNAS / CFDNAS test"),
    Handler("train", "dpfnas_weights", _private(dpfnas.weight_gradient), "DP-FNAS exchange (a)"),
    Handler("train", "dpfnas_arch", _private(dpfnas.architecture_gradient), "DP-FNAS exchange (b)"),
    Handler("train", "dpfnas_final", _private(dpfnas.train_final), "DP-FNAS final FedAvg"),
    Handler("evaluate", "dpfnas_final", _plain(dpfnas.evaluate_final), "DP-FNAS test"),
    Handler("train", "decnas_tune", _tune, "DecNAS: tune a candidate, keep its weights"),
    Handler("train", "decnas_upload", _upload, "DecNAS: upload a survivor's kept weights"),
    Handler("train", "decnas_fedavg", _seeded(decnas.train_model), "DecNAS FedAvg stages"),
    Handler("evaluate", "decnas", _plain(decnas.evaluate_model), "DecNAS validation and tests"),
    Handler("train", "fednas_search", _seeded(fednas.search_supernet), "FedNAS local DARTS"),
    Handler("train", "fednas_final", _seeded(fednas.train_final), "FedNAS final FedAvg"),
    Handler("evaluate", "fednas_final", _plain(fednas.evaluate_final), "FedNAS test"),
    Handler("train", "widths", _seeded(widths.train_width), "HeteroFL / FjORD local training"),
    Handler("evaluate", "widths", _plain(widths.evaluate_width), "HeteroFL / FjORD tier test"),
)


def node_threads(msg: Message, context: Context, call_next: Callable[..., Message]) -> Message:
    """ClientApp mod: honour the node config's ``num-threads`` (torch intra-op threads).

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


def _answer(handler: Handler, nodes: NodeDataCache) -> Callable[[Message, Context], Message]:
    def answer(msg: Message, context: Context) -> Message:
        # every reply echoes its instruction's nonce (docs/protocol.md)
        return echo(msg, Message(handler.work(msg.content, nodes(context), context), reply_to=msg))

    answer.__name__ = handler.action
    answer.__doc__ = handler.doc
    return answer


def register(
    app: ClientApp,
    load_data: LoadData,
    *,
    num_classes: int | None = None,
    cache_nodes: int | None = None,
    mods: Sequence[Mod] = (),
) -> ClientApp:
    """Add a handler for every message type of every method (``HANDLERS``) to ``app``.

    Parameters
    ----------
    app : ClientApp
        A ClientApp with decorator-registered handlers (not a ``client_fn`` one), none of
        them for these message types (Flower refuses a second handler for one type).
    load_data : callable
        ``load_data(context) -> (train, val, test)``: this node's datasets, map-style
        ``Dataset``s of ``(x, y)`` pairs (``fedorasflwr.clients.node_data`` says which
        shapes and dtypes), or a ready ``ClientData``. Called once per node and process;
        the result is stacked into tensors and kept (:class:`NodeDataCache`).
    num_classes : int, optional
        Length of the profile's label histogram; default: the node's largest label + 1.
        DecNAS needs the same length on every node: give it.
    cache_nodes : int, optional
        At most this many nodes' data kept per process (least recently used dropped);
        default: every node of the current run this process serves.
    mods : sequence of Mod
        Flower mods run around each handler, inside this library's own three: packed
        messages (``fedorasflwr.packing.packed_messages``: these mods and the handler see
        plain records), the node config's ``num-threads`` (:func:`node_threads`), then its
        ``device`` (``fedorasflwr.training.device_mod``). ``app``'s own mods run outside
        all four (and see a packed instruction packed).

    Returns
    -------
    ClientApp
        ``app``, with the handlers added.
    """
    nodes = NodeDataCache(load_data, num_classes=num_classes, max_nodes=cache_nodes)
    around = [packed_messages, node_threads, device_mod, *mods]
    for handler in HANDLERS:
        decorate = getattr(app, handler.category)
        decorate(handler.action, mods=around)(_answer(handler, nodes))
    return app


def make_client_app(
    load_data: LoadData,
    *,
    num_classes: int | None = None,
    cache_nodes: int | None = None,
    mods: Sequence[Mod] = (),
) -> ClientApp:
    """A ClientApp that answers every message type of every method with the node's own data.

    ``register(ClientApp(), load_data, ...)``: see :func:`register` for the arguments.
    """
    return register(
        ClientApp(), load_data, num_classes=num_classes, cache_nodes=cache_nodes, mods=mods
    )
