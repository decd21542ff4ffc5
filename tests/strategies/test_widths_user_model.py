"""HeteroFL and FjORD for library users (issue 43): a width-scalable Conv1d model of the
user's, trained through ``make_client_app`` on 1-D signals; runs reproducible from the seed
with empty initial arrays; ``evaluate_fn`` after every round; the docs' snippets run."""

from __future__ import annotations

import functools
import re
import sys
import types
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord, RecordDict
from torch import nn
from torch.utils.data import TensorDataset

from fedorasflwr.clients import make_client_app, to_client_data, widths
from fedorasflwr.config import TrainingRecipe
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.widths.model import MODEL_FN, factory_path
from fedorasflwr.methods.widths.strategy import TRAIN, to_numpy
from fedorasflwr.protocol import ARRAYS, CONFIG, METRICS
from fedorasflwr.search_spaces.widths import width_net
from fedorasflwr.seeding import seed_torch
from fedorasflwr.strategies import FjORD, FjORDSettings, HeteroFL, HeteroFLSettings
from tests.runconfig import ROOT

NUM_NODES = 4
LENGTH = 64
MNIST = {"num_classes": 10, "in_channels": 1, "input_height": 28, "input_width": 28}


class SignalNet(nn.Module):
    """A 1-D conv net whose width-p version keeps the leading channels of every hidden
    layer; ``dropout`` draws from torch's global generator while training."""

    def __init__(self, width: float = 1.0, dropout: float = 0.0) -> None:
        super().__init__()
        c1, c2 = max(1, round(8 * width)), max(1, round(16 * width))
        self.conv1 = nn.Conv1d(1, c1, 5, padding=2)
        self.bn1 = nn.BatchNorm1d(c1)
        self.conv2 = nn.Conv1d(c1, c2, 5, padding=2)
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(c2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return self.fc(self.drop(x.mean(-1)))


def signal_net(width: float) -> nn.Module:
    return SignalNet(width)


def dropout_net(width: float) -> nn.Module:
    return SignalNet(width, dropout=0.3)


def misfit_net(width: float) -> nn.Module:
    """Its width-0.5 classifier takes more inputs than the full one's: no slice of it."""
    net = SignalNet(width)
    if width < 1:
        net.fc = nn.Linear(40, 3)
    return net


def signals(seed: int, size: int, length: int = LENGTH) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (size,), generator=generator)
    time = torch.linspace(0, 1, length)
    clean = torch.sin(2 * torch.pi * (2 + 3 * labels[:, None]) * time)
    noise = 0.5 * torch.randn(size, length, generator=generator)
    return TensorDataset((clean + noise).unsqueeze(1), labels)


def load_signals(context: Context) -> tuple[TensorDataset, ...]:
    node = int(context.node_config["partition-id"])
    return signals(3 * node, 48), signals(3 * node + 1, 8), signals(3 * node + 2, 24)


def load_one_odd(context: Context) -> tuple[TensorDataset, ...]:
    """Partition 3's signals are 32 samples long, the others' 64."""
    node = int(context.node_config["partition-id"])
    length = 32 if node == 3 else LENGTH
    return tuple(signals(3 * node + k, 16, length) for k in range(3))


def grid_of(load_data: Any = load_signals) -> InProcessGrid:
    return InProcessGrid(make_client_app(load_data, num_classes=3), {}, NUM_NODES)


def heterofl_settings(**train: Any) -> HeteroFLSettings:
    recipe = {"rounds": 2, "clients_per_round": 0, "batch_size": 16, "lr": 0.1, **train}
    return HeteroFLSettings(tier_widths=(0.25, 0.5, 0.75, 1.0), train=TrainingRecipe(**recipe))


def fjord_settings(distill: bool = False, **train: Any) -> FjORDSettings:
    recipe = {"rounds": 2, "clients_per_round": 0, "batch_size": 16, "lr": 0.1, **train}
    return FjORDSettings(
        widths=(0.25, 0.5, 1.0),
        tier_widths=(0.5, 1.0),
        train=TrainingRecipe(**recipe),
        distill=distill,
    )


# --- the model, checked on construction -------------------------------------------------


def test_a_model_whose_slices_are_not_corners_is_refused_naming_the_tensor() -> None:
    with pytest.raises(ValueError) as caught:
        HeteroFL(settings=heterofl_settings(), seed=0, model_fn=misfit_net)
    assert str(caught.value).startswith(
        "HeteroFL: model_fn(0.25)'s 'fc.weight' has shape (3, 40), not a leading corner of "
        "model_fn(1.0)'s (3, 16)"
    )


def _local(width: float) -> nn.Module:
    return SignalNet(width)


def test_exactly_one_model_and_an_importable_factory() -> None:
    settings = heterofl_settings()
    with pytest.raises(ValueError, match="exactly one of image .* and model_fn.*got both"):
        HeteroFL(settings=settings, seed=0, image=MNIST, model_fn=signal_net)
    with pytest.raises(ValueError, match="exactly one of image .*got neither"):
        HeteroFL(settings=settings, seed=0)

    def inner(width: float) -> nn.Module:
        return SignalNet(width)

    refused = {
        "lambda": lambda w: SignalNet(w),
        "inner": inner,
        "partial": functools.partial(SignalNet, dropout=0.1),
    }
    for name, model_fn in refused.items():
        with pytest.raises(ValueError, match="HeteroFL: .*top level of a module") as caught:
            HeteroFL(settings=settings, seed=0, model_fn=model_fn)
        assert "model_fn" in str(caught.value), name
    assert factory_path(signal_net, "HeteroFL") == f"{__name__}:signal_net"
    assert factory_path(SignalNet, "FjORD") == f"{__name__}:SignalNet"  # a class will do


def test_costs_come_from_the_users_model_and_its_input() -> None:
    strategy = HeteroFL(
        settings=heterofl_settings(), seed=0, model_fn=signal_net, input_shape=(1, LENGTH)
    )
    c1, c2 = 8, 16  # width 1: conv1 64 x 8 x 5, conv2 64 x 16 x 8 x 5, fc 16 x 3 MACs
    assert strategy.costs[1.0]["macs"] == 64 * c1 * 5 + 64 * c2 * c1 * 5 + c2 * 3
    assert strategy.costs[0.25]["macs"] == 64 * 2 * 5 + 64 * 4 * 2 * 5 + 4 * 3
    assert strategy.costs[1.0]["params"] == sum(p.numel() for p in signal_net(1.0).parameters())
    rules = strategy.profile_rules()
    assert (rules.input_shape, rules.input_kind) == ((1, LENGTH), "float")
    assert HeteroFL(settings=heterofl_settings(), seed=0, model_fn=signal_net).costs == {}


# --- a run on the user's model and data -------------------------------------------------


@pytest.mark.parametrize("method", ["heterofl", "fjord"])
def test_a_tiny_run_trains_the_users_conv1d_model(method) -> None:
    if method == "heterofl":
        settings = heterofl_settings(local_epochs=2)
        strategy = HeteroFL(settings=settings, seed=0, model_fn=signal_net, input_shape=(1, LENGTH))
    else:  # the input from the profiles: the nodes' sample-shape
        settings = fjord_settings(distill=True, local_epochs=2)
        strategy = FjORD(settings=settings, seed=0, model_fn=signal_net)
    grid = grid_of()
    result = strategy.start(grid, ArrayRecord(), num_rounds=8)
    widths = [0.25, 0.5, 0.75, 1.0] if method == "heterofl" else [0.5, 1.0]
    assert [t.width for t in result.tiers] == widths
    assert all(t.test_count > 0 and t.test_accuracy is not None for t in result.tiers)
    assert result.tiers[-1].macs == strategy.costs[1.0]["macs"] > result.tiers[0].macs
    assert result.ledger["train"]["totals"]["replies"] == 8 * NUM_NODES
    full = {k: tuple(v.shape) for k, v in signal_net(1.0).state_dict().items()}
    assert {k: a.shape for k, a in to_numpy(result.arrays).items()} == full
    sent = [m for m in grid.sent if m.metadata.message_type == TRAIN]
    assert sent, "no training message sent"
    assert strategy.message_config(1, 0.5)[MODEL_FN] == f"{__name__}:signal_net"
    assert "num-classes" not in strategy.message_config(1, 0.5)  # no image keys
    # the widest tier's model told the three frequencies apart (chance: 1/3; measured with
    # seeds 0-2: 0.92-1.0 for HeteroFL, 0.98-1.0 for FjORD, on its node's 24 test signals)
    assert result.tiers[-1].test_accuracy > 0.75


def test_a_node_whose_samples_do_not_fit_is_refused_or_stops_the_run(caplog) -> None:
    given = HeteroFL(
        settings=heterofl_settings(rounds=1), seed=0, model_fn=signal_net, input_shape=(1, 64)
    )
    result = given.start(grid_of(load_one_odd), ArrayRecord(), num_rounds=1)
    assert sorted(p for t in result.tiers for p in t.partitions) == [0, 1, 2]
    assert "sample-shape = [1, 32]: the model expects samples of shape [1, 64]" in caplog.text
    derived = HeteroFL(settings=heterofl_settings(rounds=1), seed=0, model_fn=signal_net)
    with pytest.raises(ValueError, match=r"different samples: \[1, 32\] float \(partitions \[3\]"):
        derived.start(grid_of(load_one_odd), ArrayRecord(), num_rounds=1)


def test_a_clientapp_of_its_own_passes_the_factory_to_the_handlers() -> None:
    strategy = HeteroFL(
        settings=heterofl_settings(), seed=0, model_fn=signal_net, input_shape=(1, LENGTH)
    )
    strategy.tiers = {7: 1}  # width 0.5
    strategy.use_model(ArrayRecord())
    (message,) = strategy._messages(strategy._global, [_node(7)], 1, TRAIN)
    config = dict(message.content.config_records[CONFIG])
    del config[MODEL_FN]  # a message that names no model
    content = RecordDict(
        {ARRAYS: message.content.array_records[ARRAYS], CONFIG: ConfigRecord(config)}
    )
    train, test = signals(0, 32), signals(1, 16)
    data = to_client_data((train, [], test), num_classes=3)
    reply = widths.train_width(content, data, 0, model_fn=signal_net)
    shapes = {k: tuple(v.shape) for k, v in signal_net(0.5).state_dict().items()}
    assert {k: tuple(a.shape) for k, a in reply.array_records[ARRAYS].items()} == shapes
    assert reply.metric_records[METRICS]["num-examples"] == 32
    assert widths.evaluate_width(content, data, model_fn=signal_net).metric_records[METRICS][
        "num-examples"
    ] == len(test)
    with pytest.raises(ValueError, match="names no model.*pass the strategy's model_fn"):
        widths.train_width(content, data, 0)


def _node(node_id: int) -> Any:
    from fedorasflwr.federation.base import NodeProfile

    return NodeProfile(node_id, 0, 4, 32, 0, 16, (10, 11, 11))


# --- reproducible from the seed -------------------------------------------------------


def _final(strategy_class: Any, settings: Any, seed: int, caller: int) -> dict[str, np.ndarray]:
    torch.manual_seed(caller)  # the caller's RNG state must not matter
    strategy = strategy_class(settings=settings, seed=seed, model_fn=dropout_net)
    return to_numpy(strategy.start(grid_of(), ArrayRecord(), num_rounds=1).arrays)


@pytest.mark.parametrize("method", ["heterofl", "fjord"])
def test_the_seed_fixes_a_run_from_empty_initial_arrays(method) -> None:
    """Issue 43: three identical runs gave three results. The initial weights come from the
    seed; FjORD's widths and a model's dropout from the clients' seeded streams."""
    cls, settings = {
        "heterofl": (HeteroFL, heterofl_settings(rounds=1)),
        "fjord": (FjORD, fjord_settings()),
    }[method]
    first, second, other = (_final(cls, settings, s, c) for s, c in ((3, 1), (3, 2), (4, 1)))
    assert first.keys() == second.keys()
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
    assert any(not np.array_equal(first[k], other[k]) for k in first)


def test_the_initial_weights_are_the_runners_and_leave_the_callers_rng_alone() -> None:
    state = torch.get_rng_state()
    strategy = HeteroFL(settings=heterofl_settings(), seed=7, image=MNIST)
    assert torch.equal(torch.get_rng_state(), state)
    seed_torch(7, "init")  # what the project's runner does before building its initial model
    runner = width_net(MNIST, 1.0).state_dict()
    strategy.use_model(ArrayRecord())
    for name, value in to_numpy(strategy._global).items():
        np.testing.assert_array_equal(value, runner[name].numpy(), err_msg=name)


# --- evaluate_fn ------------------------------------------------------------------------


def test_evaluate_fn_sees_the_full_width_model_after_every_round() -> None:
    calls: list[tuple[int, dict[str, tuple[int, ...]]]] = []

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        calls.append((server_round, {k: tuple(a.shape) for k, a in arrays.items()}))
        return None if server_round == 1 else MetricRecord({"score": float(server_round)})

    def ignored(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        raise AssertionError("start's evaluate_fn replaces the constructor's")

    strategy = HeteroFL(
        settings=heterofl_settings(rounds=1),
        seed=0,
        model_fn=signal_net,
        input_shape=(1, LENGTH),
        evaluate_fn=ignored,
    )
    result = strategy.start(grid_of(), ArrayRecord(), num_rounds=3, evaluate_fn=evaluate)
    full = {k: tuple(v.shape) for k, v in signal_net(1.0).state_dict().items()}
    assert calls == [(1, full), (2, full), (3, full)]
    assert dict(result.evaluate_metrics_serverapp) == {
        2: MetricRecord({"score": 2.0}),
        3: MetricRecord({"score": 3.0}),
    }
    assert [h.get("val-score") for h in result.history] == [None, 2.0, 3.0]
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]


# --- docs/baselines.md ------------------------------------------------------------------


def doc_snippets() -> list[str]:
    """The ```python blocks of docs/baselines.md's "From Python" section, in order."""
    text = (ROOT / "docs/baselines.md").read_text()
    section = text.split("\n## From Python\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def test_the_from_python_snippets_of_the_docs_run() -> None:
    """Run in order in one module (the factory imports back from it, as from an app's
    module), with what a ServerApp has: ``grid`` (4 in-process nodes of the snippets'
    ClientApp) and ``context`` (a run config of two tiny HeteroFL rounds)."""
    snippets = doc_snippets()
    assert len(snippets) >= 5
    module = types.ModuleType("baselines_doc")
    sys.modules[module.__name__] = module
    try:
        for code in snippets:
            if "grid" in code and "grid" not in module.__dict__:
                run_config = {"heterofl.widths": "0.5,1.0", "heterofl.batch-size": 16}
                module.grid = InProcessGrid(module.app, {}, NUM_NODES)
                module.context = Context(1, 0, {}, RecordDict(), run_config)
            exec(compile(code, "docs/baselines.md", "exec"), module.__dict__)
        result = module.result
        assert [t.width for t in result.tiers] == [0.5, 1.0]  # the FjORD snippet's tiers
    finally:
        del sys.modules[module.__name__]
