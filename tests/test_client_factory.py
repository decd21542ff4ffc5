"""``fedorasflwr.clients.make_client_app`` / ``register`` with a user's own data: the profile,
a FedorAS Stage-1 round and a DecNAS round on the in-process grid, one load per node."""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from torch.utils.data import Dataset, TensorDataset

from fedorasflwr.clients import HANDLERS, data_partition_id, make_client_app, register
from fedorasflwr.clients.node_data import NodeDataCache, to_client_data
from fedorasflwr.config import parse_run_config
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.decnas.messages import DECNAS_TUNE, DECNAS_UPLOAD
from fedorasflwr.methods.decnas.strategy import DecNAS
from fedorasflwr.methods.fedoras.messages import FEDORAS_SUPERNET
from fedorasflwr.methods.fedoras.strategy import FedorAS
from fedorasflwr.protocol import METRICS, PROFILE, QUERY_PROFILE
from fedorasflwr.search_spaces import build_space
from fedorasflwr.search_spaces.prunable import build_prunable
from tests.runconfig import tiny_decnas, tiny_fedoras

NUM_NODES = 4
NUM_CLASSES = 10


class Digits(Dataset):
    """A user's own data: 8x8 single-channel float64 images and ``int`` labels 0..9."""

    def __init__(self, seed: int, size: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, NUM_CLASSES, (size,), generator=generator)
        noise = torch.rand(size, 1, 8, 8, generator=generator, dtype=torch.float64)
        self.images = noise + self.labels.view(-1, 1, 1, 1) / NUM_CLASSES

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])


def splits(seed: int) -> tuple[Digits, Digits, Digits]:
    """Train / val / test of one node; the sizes differ from node to node."""
    return Digits(3 * seed, 40 + seed), Digits(3 * seed + 1, 12), Digits(3 * seed + 2, 10)


class UserData:
    """``load_data(context)``: the node's splits by partition id, counting the calls per node."""

    def __init__(self) -> None:
        self.calls: Counter[int] = Counter()

    def __call__(self, context: Context) -> tuple[Digits, Digits, Digits]:
        self.calls[context.node_id] += 1
        return splits(int(context.node_config["partition-id"]))


def recorded(replies: list[Message]):
    """A grid fault that keeps every reply (and changes none)."""

    def keep(reply: Message) -> Message:
        replies.append(reply)
        return reply

    return keep


def user_grid(load_data: Any, run_config: dict[str, Any], num_nodes: int = NUM_NODES):
    replies: list[Message] = []
    app = make_client_app(load_data, num_classes=NUM_CLASSES)
    faults = {pid: recorded(replies) for pid in range(num_nodes)}
    return InProcessGrid(app, run_config, num_nodes, faults=faults), replies


def start(strategy: Any, grid: InProcessGrid, arrays: ArrayRecord, rounds: int) -> Any:
    """``strategy.start`` as a Flower user calls it (``num_rounds`` where ``start`` takes it:
    issue 13 item 2; the settings give the same number of rounds either way)."""
    if "num_rounds" in inspect.signature(strategy.start).parameters:
        return strategy.start(grid, arrays, num_rounds=rounds)
    return strategy.start(grid, arrays)


def profile_of(grid: InProcessGrid, node: int) -> ConfigRecord:
    query = Message(RecordDict(), dst_node_id=node, message_type=QUERY_PROFILE)
    (reply,) = grid.send_and_receive([query])
    assert not reply.has_error(), reply.error
    return reply.content.config_records[PROFILE]


# --- the profile ------------------------------------------------------------------------


def test_the_profile_is_built_from_the_users_data() -> None:
    load_data = UserData()
    grid, _ = user_grid(load_data, {})
    for pid, node in grid.node_of_partition.items():
        train, val, test = splits(pid)
        record = profile_of(grid, node)
        assert record["partition-id"] == pid
        assert record["num-partitions"] == NUM_NODES
        assert (record["num-train"], record["num-val"], record["num-test"]) == (40 + pid, 12, 10)
        histogram = torch.bincount(train.labels, minlength=NUM_CLASSES).tolist()
        assert list(record["label-counts"]) == histogram
        assert (record["tier"], record["cluster"]) == (-1, -1)
    profile_of(grid, grid.node_of_partition[0])  # asked again: not loaded again
    assert load_data.calls == Counter(dict.fromkeys(grid.node_of_partition.values(), 1))


def test_without_a_partition_id_the_data_gives_a_stable_one() -> None:
    grid, _ = user_grid(lambda context: splits(context.node_id), {}, num_nodes=2)
    for context in grid.contexts.values():
        del context.node_config["partition-id"], context.node_config["num-partitions"]
    ids = {}
    for node in grid.contexts:
        record = profile_of(grid, node)
        assert record["num-partitions"] == 0
        ids[node] = record["partition-id"]
        expected = data_partition_id(to_client_data(splits(node), NUM_CLASSES))
        assert ids[node] == expected and 0 <= expected < 2**31
    assert len(set(ids.values())) == 2  # different data, different ids
    again, _ = user_grid(lambda context: splits(context.node_id), {}, num_nodes=2)
    for context in again.contexts.values():
        del context.node_config["partition-id"]
    assert {n: profile_of(again, n)["partition-id"] for n in again.contexts} == ids


# --- the methods on the user's data ---------------------------------------------------------


def test_a_fedoras_stage1_round_trains_on_the_users_data(tmp_path) -> None:
    config = tiny_fedoras(
        tmp_path,
        **{
            "fedoras.rounds": 1,
            "fedoras.clients-per-round": NUM_NODES,
            "fedoras.stop-after": "supernet",
        },
    )
    settings = parse_run_config(config)
    torch.manual_seed(0)
    space = build_space(
        "cnn_s", num_classes=NUM_CLASSES, in_channels=1, input_height=8, input_width=8, width=0.25
    )
    load_data = UserData()
    grid, replies = user_grid(load_data, config)
    strategy = FedorAS(space=space, settings=settings.method_settings, seed=0)
    start(strategy, grid, ArrayRecord(space.state_dict()), rounds=1)
    trained = [r for r in replies if r.metadata.message_type == FEDORAS_SUPERNET]
    assert len(trained) == NUM_NODES
    partition_of = {node: pid for pid, node in grid.node_of_partition.items()}
    for reply in replies:
        assert not reply.has_error(), reply.error
    for reply in trained:
        examples = reply.content.metric_records[METRICS]["num-examples"]
        assert examples == 40 + partition_of[reply.metadata.src_node_id]  # 1 local epoch
    # a profile and a training message per node, one load per node
    assert load_data.calls == Counter(dict.fromkeys(grid.node_of_partition.values(), 1))


def test_a_decnas_round_prunes_on_the_users_data(tmp_path) -> None:
    config = tiny_decnas(
        tmp_path,
        **{"decnas.num-groups": 2, "decnas.gm0-rounds": 0, "decnas.final-rounds": 0},
    )
    settings = parse_run_config(config)
    torch.manual_seed(0)
    net = build_prunable(
        "convnet",
        num_classes=NUM_CLASSES,
        in_channels=1,
        input_height=8,
        input_width=8,
        width=0.125,
    )
    load_data = UserData()
    grid, replies = user_grid(load_data, config)
    strategy = DecNAS(net=net, settings=settings.method_settings, seed=0)
    start(strategy, grid, ArrayRecord(net.state_dict()), rounds=1)
    types = Counter(r.metadata.message_type for r in replies)
    assert types[QUERY_PROFILE] == NUM_NODES
    assert types[DECNAS_TUNE] > 0 and types[DECNAS_UPLOAD] > 0
    for reply in replies:
        assert not reply.has_error(), reply.error
    assert load_data.calls == Counter(dict.fromkeys(grid.node_of_partition.values(), 1))


# --- the factory itself ----------------------------------------------------------------------


def test_register_adds_every_handler_to_an_app_of_ones_own() -> None:
    order: list[str] = []

    def outer(msg: Message, context: Context, call_next: Any) -> Message:
        order.append("app mod")
        return call_next(msg, context)

    def inner(msg: Message, context: Context, call_next: Any) -> Message:
        order.append("handler mod")
        return call_next(msg, context)

    app = ClientApp(mods=[outer])

    @app.query("hello")
    def hello(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"hi": ConfigRecord({"x": 1})}), reply_to=msg)

    assert register(app, UserData(), num_classes=NUM_CLASSES, mods=[inner]) is app
    grid = InProcessGrid(app, {}, 2)
    node = grid.node_of_partition[1]
    assert profile_of(grid, node)["num-train"] == 41
    assert order == ["app mod", "handler mod"]
    (reply,) = grid.send_and_receive(
        [Message(RecordDict(), dst_node_id=node, message_type="query.hello")]
    )
    assert reply.content.config_records["hi"]["x"] == 1
    with pytest.raises(ValueError, match="already registered"):
        register(app, UserData())
    assert {h.message_type for h in HANDLERS} >= {QUERY_PROFILE, FEDORAS_SUPERNET, DECNAS_TUNE}
    assert len({h.message_type for h in HANDLERS}) == len(HANDLERS) == 23


def test_bad_data_is_an_error_reply_naming_the_split() -> None:
    floats = TensorDataset(torch.rand(4, 1, 8, 8), torch.rand(4))
    grid, _ = user_grid(lambda context: (floats, floats, floats), {}, num_nodes=1)
    query = Message(RecordDict(), dst_node_id=grid.node_of_partition[0], message_type=QUERY_PROFILE)
    (reply,) = grid.send_and_receive([query])
    assert reply.has_error()
    assert "y of the train split" in reply.error.reason


def test_the_cache_loads_again_for_another_run_config_and_keeps_at_most_max_nodes() -> None:
    load_data = UserData()
    cache = NodeDataCache(load_data, num_classes=NUM_CLASSES, max_nodes=1)

    def context(node: int, run_config: dict[str, Any]) -> Context:
        node_config = {"partition-id": node, "num-partitions": 2}
        return Context(
            run_id=1,
            node_id=node,
            node_config=node_config,
            state=RecordDict(),
            run_config=run_config,
        )

    first = cache(context(0, {}))
    assert cache(context(0, {})) is first
    cache(context(0, {"seed": 1}))  # another run config: loaded again
    cache(context(1, {"seed": 1}))  # evicts node 0 (max_nodes = 1)
    cache(context(0, {"seed": 1}))
    assert load_data.calls == Counter({0: 3, 1: 1})


# --- what the data may look like -------------------------------------------------------------


def test_a_tensor_dataset_of_the_right_dtypes_is_used_as_it_is() -> None:
    x, y = torch.rand(5, 1, 8, 8), torch.tensor([0, 1, 2, 3, 3])
    data = to_client_data((TensorDataset(x, y), TensorDataset(x[:0], y[:0]), TensorDataset(x, y)))
    assert data.train.tensors[0] is x and data.train.tensors[1] is y
    assert data.num_classes == 4 and data.label_counts == (1, 1, 1, 2)
    assert len(data.val) == 0 and data.val.tensors[0].shape == (0, 1, 8, 8)


def test_items_are_stacked_and_typed() -> None:
    class Items(Dataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, index: int) -> tuple[Any, Any]:
            return [[float(index)] * 2], torch.tensor(index, dtype=torch.int32)

    data = to_client_data((Items(), [], Items()), num_classes=5)
    x, y = data.train.tensors
    assert x.dtype == torch.float32 and x.shape == (3, 1, 2)
    assert y.dtype == torch.int64 and y.tolist() == [0, 1, 2]
    assert data.label_counts == (1, 1, 1, 0, 0)
    assert len(data.val) == 0 and data.val.tensors[0].shape == (0, 1, 2)


def test_text_targets_count_every_position() -> None:
    ids = torch.tensor([[1, 2, 3], [3, 3, 0]], dtype=torch.int32)
    data = to_client_data((TensorDataset(ids, ids), [], []), num_classes=4)
    assert data.train.tensors[0].dtype == torch.int64
    assert data.label_counts == (1, 1, 1, 3)


@pytest.mark.parametrize(
    ("train", "match"),
    [
        (TensorDataset(torch.rand(2, 3), torch.tensor([0, 9])), r"labels span \[0, 9\]"),
        ([("not an image", 0)], "x of item 0 of the train split is a str"),
        ([(torch.rand(3),)], "item 0 of the train split is a tuple"),
        ([(torch.rand(3), 0), (torch.rand(4), 1)], "x of the train split has several shapes"),
        (TensorDataset(torch.rand(2, 4), torch.tensor([0, 1])), "differ from the train split"),
    ],
)
def test_bad_splits_are_refused_naming_the_fault(train: Any, match: str) -> None:
    test = TensorDataset(torch.rand(1, 3), torch.tensor([1]))
    with pytest.raises(ValueError, match=match):
        to_client_data((train, [], test), num_classes=4)


def test_the_app_pickles_for_the_simulation_engine_after_serving_a_node() -> None:
    # Flower's Ray backend sends the ClientApp to every actor with cloudpickle: the data
    # cache's lock failed that ("cannot pickle '_thread.lock' object"), so every message of
    # every simulation run failed. The copy starts with an empty cache of the same bound.
    from ray import cloudpickle

    from fedorasflwr.client_app import app as project_app

    load_data = UserData()
    app = make_client_app(load_data, num_classes=NUM_CLASSES, cache_nodes=3)
    grid = InProcessGrid(app, {}, 2)
    profile_of(grid, grid.node_of_partition[0])  # the cache now holds a node's data
    assert sum(load_data.calls.values()) == 1
    assert isinstance(cloudpickle.loads(cloudpickle.dumps(project_app)), ClientApp)
    copy = cloudpickle.loads(cloudpickle.dumps(app))
    assert isinstance(copy, ClientApp)
    grid = InProcessGrid(copy, {}, 2)
    profile = profile_of(grid, grid.node_of_partition[0])
    assert profile["num-train"] == len(splits(0)[0])
    assert sum(load_data.calls.values()) == 1  # the copy's loader: the pickled one's calls


def test_the_client_app_imports_no_library_its_handlers_do_not_need_at_import():
    # Every deployment message starts a fresh ClientApp process that imports the app:
    # opacus alone (with scipy and torch.distributed.tensor) cost as much as torch.
    heavy = ["opacus", "scipy", "matplotlib", "pymoo", "torchvision", "datasets", "onnx"]
    heavy += ["onnxruntime", "sklearn", "pandas", "flwr_datasets", "mlxtend", "ray"]
    code = (
        "import sys, fedorasflwr.client_app; "
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.strip() == ""
