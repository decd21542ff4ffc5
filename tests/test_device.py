"""Every training, evaluation, per-sample-gradient and search loop computes on ``torch_device()``.

How a CPU-only machine catches a wrong ``.to()``
------------------------------------------------
The loops run with the device helper set to PyTorch's ``meta`` device
(``using_device("meta")``): a module or batch that is not moved stays on the CPU,
and noise or gates made without ``device=`` are born there.  ``meta`` alone is not
strict enough (a CPU batch through a meta conv is silently accepted), so every
ATen op also passes through :class:`DeviceGuard`, a ``TorchDispatchMode`` that fails
the test, naming the op, when

- an op mixes tensors of two devices (0-dim CPU scalars excepted, as CUDA allows them)
  - what raises on a GPU for a batch, noise tensor or gate left on the CPU; or
- a compute op (convolution, matmul) runs on the CPU - a model never moved, with
  its batches never moved either, computes without mixing devices.

It also counts the compute ops that ran on the helper's device (> 0: the loop did
run there).  Meta tensors hold no data, so the guard answers the host reads a loop
makes (``float(loss)``, ``.cpu()`` of a reply or of alpha's softmax) with
placeholders: 1 for a scalar read, ones for a copy to the CPU (valid sampling
probabilities once normalised).  The numbers are meaningless; only placement is
checked here, the values are by the methods' own tests.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.data import TensorDataset

from fedorasflwr import training
from fedorasflwr.clients import make_client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.data import ClientData
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.decnas import client as decnas
from fedorasflwr.methods.dpfnas import client as dpfnas
from fedorasflwr.methods.dpfnas.contract import INSECURE_KEY
from fedorasflwr.methods.dpfnas.secure_random import SecureRandom, gaussian
from fedorasflwr.methods.fdnas import client as fdnas
from fedorasflwr.methods.fedoras import client as fedoras
from fedorasflwr.methods.fedoras.evaluation import ServerPathScorer, SupernetEvaluator
from fedorasflwr.protocol import ARRAYS, CONFIG, METRICS, space_to_config
from fedorasflwr.search_spaces import build_space
from fedorasflwr.search_spaces.darts import DerivedNetwork
from fedorasflwr.search_spaces.prunable import build_prunable
from fedorasflwr.training import (
    device_mod,
    device_setting,
    resolve_device,
    torch_device,
    using_device,
)

aten = torch.ops.aten
META = torch.device("meta")
COMPUTE = {aten.convolution, aten.convolution_backward, aten.addmm, aten.mm, aten.bmm}
TRANSFERS = {aten._to_copy, aten.copy_, aten.to, aten._copy_from, aten.lift_fresh}


class DeviceGuard(TorchDispatchMode):
    """Fails on an op mixing devices or computing off ``device``; answers host reads of
    meta tensors with placeholders (module docstring)."""

    def __init__(self, device: torch.device = META) -> None:
        super().__init__()
        self.device = device
        self.computed = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)]
        packet = func.overloadpacket
        if packet is aten._local_scalar_dense and tensors[0].device == META:
            return _placeholder_scalar(tensors[0].dtype)
        if packet in TRANSFERS and tensors:
            return _transfer(func, args, kwargs, tensors)
        devices = {t.device for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)}
        if len(devices) > 1:
            raise AssertionError(f"{func} mixes devices {sorted(map(str, devices))}")
        if packet in COMPUTE:
            if devices != {self.device}:
                raise AssertionError(f"{func} computes on {sorted(map(str, devices))}")
            self.computed += 1
        return func(*args, **kwargs)


def _placeholder_scalar(dtype: torch.dtype) -> bool | int | float:
    if dtype == torch.bool:
        return True
    return 1.0 if dtype.is_floating_point else 1  # 1, not 0: BN divides by its batch count


def _transfer(func, args, kwargs, tensors):  # noqa: ANN001
    """Copies between devices are how data legitimately moves; meta -> CPU gets ones."""
    if func.overloadpacket is aten.copy_:
        destination, source = args[0], args[1]
        if source.device == META and destination.device != META:
            return destination.fill_(1)
        return func(*args, **kwargs)
    source, target = tensors[0], kwargs.get("device")
    if source.device == META and target is not None and torch.device(target) != META:
        return torch.ones(source.shape, dtype=kwargs.get("dtype") or source.dtype, device=target)
    return func(*args, **kwargs)


@contextlib.contextmanager
def on_meta() -> Iterator[DeviceGuard]:
    """The helper returns ``meta`` and every op is checked (module docstring)."""
    guard = DeviceGuard()
    with using_device(META), guard:
        yield guard
    assert guard.computed > 0, "nothing was computed on the helper's device"


def _data(shape: tuple[int, ...] = (1, 28, 28), classes: int = 10, n: int = 24) -> ClientData:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, *shape, generator=generator)
    y = torch.randint(0, classes, (n,), generator=generator)
    data = TensorDataset(x, y)
    return ClientData(train=data, val=data, test=data, num_classes=classes, label_counts=(0,) * 10)


def _content(state: dict[str, Tensor], **config) -> RecordDict:  # noqa: ANN003
    base = {"seed": 0, "server-round": 1, "lr": 0.01, "momentum": 0.9, "weight-decay": 0.0}
    return RecordDict({ARRAYS: ArrayRecord(state), CONFIG: ConfigRecord({**base, **config})})


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    return build_space(
        "cnn_s", width=0.25, num_classes=10, in_channels=1, input_height=28, input_width=28
    )


def _fedoras_config(space) -> dict:  # noqa: ANN001
    return {
        "subspace-mask": [1] * sum(space.num_options()),
        "max-flops": float(space.max_flops()),
        "batch-size": 8,
        "local-epochs": 1,
        **space_to_config(space.spec),
    }


# ------------------------------------------------------------------ the helper


def test_the_helper_is_auto_unless_set_and_validates_settings():
    auto = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert torch_device() == auto == resolve_device("auto")
    with using_device("cpu"):
        assert torch_device() == torch.device("cpu")
        with using_device(META):
            assert torch_device() == META
        assert torch_device() == torch.device("cpu")
    assert torch_device() == auto
    for bad in ("gpu", "CUDA", "cuda:x", 1):
        with pytest.raises(ValueError, match="auto, cpu, cuda or cuda:<index>"):
            resolve_device(bad)  # type: ignore[arg-type]
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


def test_run_config_key_is_validated():
    assert parse_run_config({}).device == "auto"
    assert parse_run_config({"device": "cuda:1"}).device == "cuda:1"
    with pytest.raises(ValueError, match="run config 'device' = 'tpu'"):
        parse_run_config({"device": "tpu"})


def test_a_nodes_own_device_wins_over_the_run_config():
    assert device_setting({}, {}) == "auto"
    assert device_setting({}, {"device": "cpu"}) == "cpu"
    assert device_setting({"device": "cuda"}, {"device": "cpu"}) == "cuda"
    with pytest.raises(ValueError, match="node config 'device' = 'gpu'"):
        device_setting({"device": "gpu"}, {"device": "cpu"})


def test_the_client_mod_sets_the_nodes_device(monkeypatch):
    asked, seen = [], []

    def resolve(setting: str, where: str) -> torch.device:
        asked.append((setting, where))
        return META

    monkeypatch.setattr(training, "resolve_device", resolve)
    cases = [({}, {}), ({}, {"device": "cpu"}), ({"device": "cuda"}, {"device": "cpu"})]
    for node, run in cases:
        context = SimpleNamespace(node_config=node, run_config=run)
        device_mod(None, context, lambda msg, ctx: seen.append(torch_device()))  # type: ignore
    assert seen == [META] * 3
    assert asked == [
        ("auto", "run config 'device'"),
        ("cpu", "run config 'device'"),
        ("cuda", "node config 'device'"),
    ]
    assert torch_device() != META  # reset after the message


# ------------------------------------------------------- deterministic kernels


def _kernel_flags() -> dict[str, object]:
    return {
        "algorithms": torch.are_deterministic_algorithms_enabled(),
        "warn-only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn-deterministic": torch.backends.cudnn.deterministic,
        "cudnn-benchmark": torch.backends.cudnn.benchmark,
        "matmul-tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn-tf32": torch.backends.cudnn.allow_tf32,
        "cublas": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }


DETERMINISTIC = {
    "algorithms": True,
    "warn-only": True,
    "cudnn-deterministic": True,
    "cudnn-benchmark": False,
    "matmul-tf32": False,
    "cudnn-tf32": False,
    "cublas": training.CUBLAS_WORKSPACE,
}


@pytest.fixture
def fast_kernels(monkeypatch):
    """PyTorch's flags set the non-deterministic way for the test, restored after it."""
    saved = _kernel_flags()
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    yield _kernel_flags()
    torch.use_deterministic_algorithms(
        bool(saved["algorithms"]), warn_only=bool(saved["warn-only"])
    )
    torch.backends.cudnn.deterministic = saved["cudnn-deterministic"]
    torch.backends.cudnn.benchmark = saved["cudnn-benchmark"]
    torch.backends.cuda.matmul.allow_tf32 = saved["matmul-tf32"]
    torch.backends.cudnn.allow_tf32 = saved["cudnn-tf32"]


def test_the_deterministic_key_is_validated():
    assert parse_run_config({}).deterministic is True
    assert parse_run_config({"deterministic": False}).deterministic is False
    for bad in ("yes", 1):
        with pytest.raises(ValueError, match=f"run config 'deterministic' = {bad!r}"):
            parse_run_config({"deterministic": bad})
    with pytest.raises(ValueError, match="'deterministic' = 'no': allowed: true or false"):
        training.apply_determinism(torch.device("cpu"), "no")  # type: ignore[arg-type]


def test_deterministic_kernels_on_cuda_only_and_only_when_asked(fast_kernels):
    assert not training.apply_determinism(torch.device("cpu"), True)
    assert not training.apply_determinism(torch.device("cuda"), False)
    assert _kernel_flags() == fast_kernels  # left alone
    assert training.apply_determinism(torch.device("cuda", 0), True)
    assert _kernel_flags() == DETERMINISTIC


@pytest.mark.parametrize("deterministic", [True, False, None], ids=["true", "false", "default"])
def test_the_client_mod_applies_the_run_configs_deterministic(
    monkeypatch, fast_kernels, deterministic
):
    monkeypatch.setattr(training, "resolve_device", lambda setting, where: torch.device(setting))
    run = (
        {"device": "cuda"}
        if deterministic is None
        else {"device": "cuda", "deterministic": deterministic}
    )
    context = SimpleNamespace(node_config={}, run_config=run)
    device_mod(None, context, lambda msg, ctx: None)  # type: ignore[arg-type]
    assert _kernel_flags() == (fast_kernels if deterministic is False else DETERMINISTIC)


# ------------------------------------------------------------- client loops


def test_client_app_runs_fedoras_stage1_on_the_nodes_device(monkeypatch, cnn):
    """A ClientApp from the factory (this project's is one): its mod reads the node
    config's ``device`` (over the run config's) and the Stage-1 loop honours it.  "cuda"
    stands for meta here, so the run config's "cpu" would fail the guard ("computes on
    cpu")."""

    def resolve(setting: str, where: str) -> torch.device:
        return META if setting == "cuda" else torch.device(setting)

    monkeypatch.setattr(training, "resolve_device", resolve)
    app = make_client_app(lambda context: _data())
    grid = InProcessGrid(app, {"device": "cpu"}, 1, node_configs={0: {"device": "cuda"}})
    node = grid.node_of_partition[0]
    content = _content(cnn.state_dict(), **_fedoras_config(cnn))
    message = Message(content, dst_node_id=node, message_type="train.fedoras_supernet")
    guard = DeviceGuard()
    with guard:
        (reply,) = grid.send_and_receive([message])
    assert not reply.has_error(), reply.error
    assert guard.computed > 0


def test_fedoras_client_loops(cnn):
    data = _data()
    config = _fedoras_config(cnn)
    with on_meta():
        reply = fedoras.train_supernet(_content(cnn.state_dict(), **config), data, 0)
    assert all(v.device.type == "cpu" for v in reply[ARRAYS].to_torch_state_dict().values())
    paths = [0] * len(cnn.num_options()) + [1] * len(cnn.num_options())
    scoring = {**config, "paths": paths, "calibration-batches": 2}
    with on_meta():
        fedoras.score_paths_locally(_content(cnn.state_dict(), **scoring), data, 0)
    arch = [0] * len(cnn.num_options())
    subnet = cnn.subnet(arch)
    stage3 = {**config, "arch": arch, "net-flops": 1}
    with on_meta():
        fedoras.train_subnet(_content(subnet.state_dict(), **stage3), data, 0)
    with on_meta():
        fedoras.evaluate_subnet(_content(subnet.state_dict(), **stage3), data)


def test_fdnas_client_search_and_training():
    torch.manual_seed(0)
    space = build_space("mbconv", width=0.25, layers_per_stage=1)
    data = _data()
    search = {
        "local-epochs": 1,
        "batch-size": 8,
        "alpha-lr": 0.05,
        "alpha-every": 1,
        "target-flops": float(space.min_flops()),
        "hardware-beta": 0.5,
        **space_to_config(space.spec),
    }
    with on_meta():
        reply = fdnas.search_supernet(_content(space.state_dict(), **search), data, 0)
    assert "expected-flops" in reply[METRICS]
    arch = [0] * len(space.arch_parameters())
    net = space.subnet(arch)
    final = {"local-epochs": 1, "batch-size": 8, "arch": arch, "net-flops": 1}
    final.update(space_to_config(space.spec))
    with on_meta():
        fdnas.train_net(_content(net.state_dict(), **final), data, 0)
    with on_meta():
        fdnas.evaluate_net(_content(net.state_dict(), **final), data)


def test_local_sgd_leaves_the_callers_module_on_the_helpers_device():
    # the contract (local_sgd's docstring): the caller's module is trained in place and
    # stays on torch_device(), in eval mode; a caller reads its weights with .cpu()
    torch.manual_seed(0)
    net = build_prunable(
        "convnet", num_classes=10, in_channels=1, input_height=28, input_width=28, width=0.25
    )
    config = {"batch-size": 8, "local-epochs": 1, "lr": 0.1, "momentum": 0.0}
    with on_meta():
        done = training.local_sgd(net, _data().train, config, (0,))
    assert done.calibrated == 24  # BatchNorm refreshed there too
    assert not net.training
    assert {t.device for t in (*net.parameters(), *net.buffers())} == {META}


def test_decnas_client_loops():
    torch.manual_seed(0)
    net = build_prunable(
        "convnet", num_classes=10, in_channels=1, input_height=28, input_width=28, width=0.25
    )
    config = {"batch-size": 8, "local-epochs": 1, "net-macs": 1, "iteration": 1, "round": 1}
    config.update({"candidate": 0, **space_to_config(net.spec)})
    data = _data()
    with on_meta():
        decnas.tune_candidate(_content(net.state_dict(), **config), data, 0, RecordDict())
    with on_meta():
        decnas.train_model(_content(net.state_dict(), **config), data, 0)
    with on_meta():
        decnas.evaluate_model(_content(net.state_dict(), **config), data)


@pytest.fixture(scope="module")
def darts():
    torch.manual_seed(0)
    return build_space("darts", channels=2, cells=2, input_height=28, input_width=28, stem_stride=2)


@pytest.mark.parametrize(
    ("secure", "order"), [(True, 1), (False, 2)], ids=["os-csprng-first", "seeded-second"]
)
def test_dpfnas_private_exchanges_put_batches_and_noise_on_the_device(darts, secure, order):
    config = {
        # Poisson sampling: at 0.5 an OS-drawn batch of 8 was empty 1 time in 256 (nothing
        # computed, the guard failed in CI); at 0.99 a batch of 4 is empty 1 time in 1e8
        "sample-rate": 0.99,
        "clip": 0.5,
        "noise-multiplier": 1.0,
        "order": order,
        "weight-lr": 0.1,
        "mixed-flops": 1,
        INSECURE_KEY: not secure,
        **space_to_config(darts.spec),
    }
    state = darts.state_dict()
    if order == 2:
        state.update({dpfnas.PREVIOUS_PREFIX + k: state[k] for k in darts.weight_keys()})
    with on_meta():
        dpfnas.weight_gradient(_content(darts.state_dict(), **config), _data(n=4), 0)
    with on_meta():
        dpfnas.architecture_gradient(_content(state, **config), _data(n=4), 0)


@pytest.mark.parametrize("noise", [1.0, 0.0], ids=["private", "plain"])
def test_dpfnas_final_training(darts, noise):
    spec = {"channels": 2, "cells": 2, "input_height": 28, "input_width": 28, "stem_stride": 2}
    net = DerivedNetwork(darts.genotype(), **spec)
    config = {
        "genotype": darts.genotype().to_text(),
        "local-epochs": 1,
        "batch-size": 8,
        "noise-multiplier": noise,
        "clip": 1.0,
        "net-flops": 1,
        **space_to_config({"name": "darts", **spec}),
    }
    with on_meta():
        dpfnas.train_final(_content(net.state_dict(), **config), _data(), 0)
    with on_meta():
        dpfnas.evaluate_final(_content(net.state_dict(), **config), _data())


@pytest.mark.parametrize("source", ["secure", "seeded"])
def test_noise_is_created_on_the_gradients_device(source):
    generator = SecureRandom() if source == "secure" else torch.Generator().manual_seed(0)
    with DeviceGuard():
        noise = gaussian(1.0, (3, 4), generator, torch.float32, META)
    assert noise.device == META and noise.shape == (3, 4)


# ------------------------------------------------------------- server scoring


def test_server_scoring_runs_on_the_helpers_device():
    torch.manual_seed(0)
    space = build_space(
        "cnn_s", width=0.25, num_classes=10, in_channels=1, input_height=28, input_width=28
    )
    dataset = TensorDataset(*_data().train.tensors)
    arrays = ArrayRecord(space.state_dict())
    with on_meta():
        evaluator = SupernetEvaluator(space, dataset, num_paths=2, seed=0)
        evaluator(1, arrays)
    scorer = ServerPathScorer(space, dataset, seed=0)
    with on_meta():
        state = scorer.scored_state(arrays, [0] * len(space.num_options()))
    assert all(v.device.type == "cpu" for v in state.values())


def test_the_guard_catches_a_batch_a_model_or_noise_left_on_the_cpu():
    """The check itself can fail: a model moved but not its batch; neither moved;
    CPU noise added to a gradient on the device."""
    net = torch.nn.Conv2d(1, 2, 3).to(META)
    with pytest.raises(AssertionError, match="mixes devices"), DeviceGuard():
        net(torch.zeros(2, 1, 8, 8))
    with pytest.raises(AssertionError, match="computes on"), DeviceGuard():
        torch.nn.Conv2d(1, 2, 3)(torch.zeros(2, 1, 8, 8))
    with pytest.raises(AssertionError, match="mixes devices"), DeviceGuard():
        torch.zeros(3, device=META) + torch.from_numpy(np.ones(3, dtype=np.float32))


def test_fedoras_server_finetune_curve_runs_on_the_helpers_device():
    from fedorasflwr.methods.fedoras.finetune import _server_curve

    torch.manual_seed(0)
    space = build_space(
        "cnn_s", width=0.25, num_classes=10, in_channels=1, input_height=28, input_width=28
    )
    arch = [0] * len(space.num_options())
    dataset = TensorDataset(*_data().train.tensors)
    arrays = ArrayRecord(space.subnet(arch).state_dict())
    with on_meta():
        curve = _server_curve(space.spec, arch, dataset)
        assert curve is not None
        assert set(curve(1, arrays)) == {"val-accuracy", "val-loss"}
