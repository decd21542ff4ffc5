"""A node's own data as the method code needs it: checked tensors, a profile, a per-process cache.

``load_data(context)`` (the user's) returns ``(train, val, test)``: any map-style
``torch.utils.data.Dataset`` with ``len`` whose items are ``(x, y)`` pairs.

- ``x``: a tensor (or numpy array / number) of the same shape for every item, the
  model's input for one sample. Images: floating ``(C, H, W)``, made ``float32``.
  Text: integer token ids ``(seq_len,)``, made ``int64``.
- ``y``: an integer class index (a Python ``int`` or a 0-d integer tensor), or, for
  next-token text, integer targets ``(seq_len,)``; made ``int64``, each in
  ``[0, num_classes)``.

Each split is turned into one ``TensorDataset`` (stacked once, per node and process);
a ``TensorDataset`` of two tensors with these dtypes is used as it is. ``val`` and
``test`` may be empty; ``load_data`` may also return a ready
:class:`~fedorasflwr.data.ClientData`.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import Context
from torch import Tensor
from torch.utils.data import Dataset, TensorDataset

from ..data import ClientData

__all__ = [
    "LoadData",
    "NodeData",
    "NodeDataCache",
    "data_partition_id",
    "node_data",
    "to_client_data",
]

#: ``load_data(context) -> (train, val, test)`` (or a ``ClientData``)
LoadData = Callable[[Context], "Sequence[Dataset] | ClientData"]

_SPLITS = ("train", "val", "test")
#: data-derived partition ids lie in [0, 2**31): an int32 everywhere they travel
_ID_BITS = 31


@dataclass(frozen=True)
class NodeData:
    """One node's data and identity, as every handler uses them.

    Attributes
    ----------
    data : ClientData
        ``train`` / ``val`` / ``test`` as ``TensorDataset``, ``num_classes``, ``label_counts``.
    partition_id : int
        Node config ``partition-id`` when set, else :func:`data_partition_id` of ``data``.
        Seeds the node's local streams; the server refuses two nodes with the same id.
    num_partitions : int
        Node config ``num-partitions`` when set, else 0 (unknown).
    """

    data: ClientData
    partition_id: int
    num_partitions: int


def _as_tensor(value: Any, what: str) -> Tensor:
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(
            f"{what} is a {type(value).__name__}, not a tensor: return tensors or arrays from "
            "the dataset (for images, e.g. torchvision's transforms.ToTensor())"
        ) from exc


def _stack_split(dataset: Dataset, split: str) -> tuple[Tensor, Tensor] | None:
    """``(x, y)`` of every item of ``dataset``, stacked; None when it is empty."""
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        x, y = dataset.tensors
        return (x, y) if len(x) else None
    try:
        size = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(
            f"the {split} split ({type(dataset).__name__}) has no len(): return map-style "
            "datasets (torch.utils.data.Dataset with __len__ and __getitem__)"
        ) from None
    xs, ys = [], []
    for index in range(size):
        item = dataset[index]
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ValueError(
                f"item {index} of the {split} split is a {type(item).__name__}: "
                "each item must be an (x, y) pair"
            )
        xs.append(_as_tensor(item[0], f"x of item {index} of the {split} split"))
        ys.append(_as_tensor(item[1], f"y of item {index} of the {split} split"))
    if not xs:
        return None
    for name, values in (("x", xs), ("y", ys)):
        shapes = {tuple(v.shape) for v in values}
        if len(shapes) > 1:
            raise ValueError(f"{name} of the {split} split has several shapes: {sorted(shapes)}")
    return torch.stack(xs), torch.stack(ys)


def _typed(x: Tensor, y: Tensor, split: str) -> tuple[Tensor, Tensor]:
    """``x`` float32 (or int64 token ids), ``y`` int64: what the method code trains on."""
    if x.is_floating_point():
        x = x.to(torch.float32)
    elif x.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        x = x.to(torch.int64)
    else:
        raise ValueError(f"x of the {split} split is {x.dtype}: floating, or integer token ids")
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ValueError(f"y of the {split} split is {y.dtype}: integer class indices")
    return x.contiguous(), y.to(torch.int64).contiguous()


def to_client_data(splits: Sequence[Dataset], num_classes: int | None = None) -> ClientData:
    """``(train, val, test)`` as the method code's ``ClientData`` (see the module docstring).

    ``num_classes``: the length of the label histogram; None: the largest label + 1
    found in this node's splits (DecNAS groups nodes by their histograms, which must
    then have one length on every node: give ``num_classes`` there).

    Raises
    ------
    ValueError
        Naming the split and the fault: not three splits, an item that is not an
        ``(x, y)`` pair, mixed shapes or the splits disagreeing, a non-integer or
        out-of-range label, every split empty.
    """
    if len(splits) != 3:
        raise ValueError(f"load_data must return (train, val, test); got {len(splits)} item(s)")
    stacked = {name: _stack_split(split, name) for name, split in zip(_SPLITS, splits, strict=True)}
    present = {name: _typed(*pair, name) for name, pair in stacked.items() if pair is not None}
    if not present:
        raise ValueError("load_data returned three empty splits")
    first_name, (x0, y0) = next(iter(present.items()))
    for name, (x, y) in present.items():
        if x.shape[1:] != x0.shape[1:] or y.shape[1:] != y0.shape[1:] or x.dtype != x0.dtype:
            raise ValueError(
                f"the {name} split's samples ({x.dtype} x {tuple(x.shape[1:])}, y "
                f"{tuple(y.shape[1:])}) differ from the {first_name} split's "
                f"({x0.dtype} x {tuple(x0.shape[1:])}, y {tuple(y0.shape[1:])})"
            )
    labels = torch.cat([y.reshape(-1) for _, y in present.values()])
    low, high = int(labels.min()), int(labels.max())
    classes = high + 1 if num_classes is None else int(num_classes)
    if low < 0 or high >= classes:
        raise ValueError(f"labels span [{low}, {high}]: each must be in [0, {classes})")
    empty = (x0.new_empty((0, *x0.shape[1:])), y0.new_empty((0, *y0.shape[1:])))
    datasets = {name: TensorDataset(*present.get(name, empty)) for name in _SPLITS}
    train_y = datasets["train"].tensors[1]
    counts = torch.bincount(train_y.reshape(-1), minlength=classes)
    return ClientData(
        train=datasets["train"],
        val=datasets["val"],
        test=datasets["test"],
        num_classes=classes,
        label_counts=tuple(int(c) for c in counts.tolist()),
    )


def data_partition_id(data: ClientData) -> int:
    """A partition id of the node's data itself: the first 31 bits of the BLAKE2b digest of
    its three splits (shapes, dtypes and bytes of ``x`` and ``y``).

    Stable across processes, restarts and runs as long as the data is the same;
    nodes with different data get different ids (two of 1000 nodes collide with
    probability ~2e-4; the server then refuses both, naming them).
    """
    digest = hashlib.blake2b(digest_size=8)
    for split in (data.train, data.val, data.test):
        for tensor in split.tensors:
            array = np.ascontiguousarray(tensor.detach().cpu().numpy())
            digest.update(f"{array.dtype.str}{array.shape}".encode())
            digest.update(array.tobytes())
    return int.from_bytes(digest.digest(), "big") >> (64 - _ID_BITS)


def _node_config_int(context: Context, key: str) -> int | None:
    value = context.node_config.get(key)
    if value is None:
        return None
    try:
        number = int(str(value))
    except ValueError:
        number = -1
    if isinstance(value, bool) or number < 0:
        raise ValueError(f"node config {key} = {value!r} is invalid: an integer >= 0")
    return number


def node_data(context: Context, load_data: LoadData, num_classes: int | None = None) -> NodeData:
    """Call ``load_data(context)`` and turn its result into this node's :class:`NodeData`."""
    loaded = load_data(context)
    data = loaded if isinstance(loaded, ClientData) else to_client_data(loaded, num_classes)
    partition_id = _node_config_int(context, "partition-id")
    num_partitions = _node_config_int(context, "num-partitions")
    return NodeData(
        data=data,
        partition_id=data_partition_id(data) if partition_id is None else partition_id,
        num_partitions=0 if num_partitions is None else num_partitions,
    )


def _frozen(config: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), repr(v)) for k, v in config.items()))


class NodeDataCache:
    """Each node's :class:`NodeData`, loaded once per process.

    A node is keyed by its run id, node id, node config and run config (what
    ``load_data`` may read), so a node of another run or configuration is loaded
    afresh. A message of another run, or of another run config, empties the cache
    first; ``max_nodes`` (None: no limit) bounds how many nodes' data it holds,
    dropping the least recently used.
    """

    def __init__(
        self, load_data: LoadData, *, num_classes: int | None = None, max_nodes: int | None = None
    ) -> None:
        if max_nodes is not None and max_nodes < 1:
            raise ValueError(f"max_nodes = {max_nodes} is invalid: an integer >= 1, or None")
        self.load_data = load_data
        self.num_classes = num_classes
        self.max_nodes = max_nodes
        self._run: Hashable = None
        self._nodes: OrderedDict[Hashable, NodeData] = OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, object]:
        # The simulation engine pickles the ClientApp (with this cache) to each Ray actor:
        # send the loader and the bound, not the lock or data loaded so far.
        state = dict(self.__dict__)
        state.update(_run=None, _nodes=OrderedDict(), _lock=None)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __call__(self, context: Context) -> NodeData:
        """This node's data: from the cache, else loaded now (``load_data`` called once)."""
        run = (context.run_id, _frozen(context.run_config))
        node = (context.node_id, _frozen(context.node_config))
        with self._lock:
            if run != self._run:
                self._nodes.clear()
                self._run = run
            cached = self._nodes.get(node)
            if cached is not None:
                self._nodes.move_to_end(node)
                return cached
            loaded = node_data(context, self.load_data, self.num_classes)
            self._nodes[node] = loaded
            if self.max_nodes is not None and len(self._nodes) > self.max_nodes:
                self._nodes.popitem(last=False)
            return loaded
