"""FDNAS / CFDNAS on a user's own space: a DifferentiableSpace defined here (not mbconv)
runs end to end on the in-process grid (clients rebuild it from its import path), and a
space without architecture parameters is refused on both sides with what it lacks."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from torch import Tensor, nn

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.fdnas.client import search_supernet
from fedorasflwr.methods.fdnas.derivation import derive_toward
from fedorasflwr.methods.fdnas.runner import cluster_tagger
from fedorasflwr.protocol import ARRAYS, CONFIG, space_to_config
from fedorasflwr.search_spaces import (
    DifferentiableSpace,
    GatedMixedOp,
    MixedOp,
    SearchSpace,
    build_space,
)
from fedorasflwr.strategies import CFDNAS, FDNAS
from tests.runconfig import tiny_fdnas

NUM_NODES = 10  # the class-group split of tiny_fdnas: three clusters


def _options(channels: int) -> dict[str, nn.Module]:
    return {
        "conv3x3": nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU()),
        "conv1x1": nn.Sequential(nn.Conv2d(channels, channels, 1), nn.ReLU()),
        "identity": nn.Identity(),
    }


class TwoLayerNet(nn.Module):
    """28x28 -> 8x8 stem, two searchable layers, GAP, linear."""

    def __init__(self, layer: type[MixedOp], channels: int, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.AdaptiveAvgPool2d(8), nn.Conv2d(1, channels, 3, padding=1))
        self.layers = nn.ModuleList([layer(_options(channels)), layer(_options(channels))])
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: Tensor, arch) -> Tensor:
        x = self.stem(x)
        for layer, option in zip(self.layers, arch, strict=True):
            x = layer(x, option)
        return self.classifier(x.mean((2, 3)))


class TinyGatedSpace(DifferentiableSpace):
    """What a user writes for FDNAS: GatedMixedOp layers; the rest comes from the base."""

    def __init__(self, num_classes: int = 10, channels: int = 4) -> None:
        super().__init__(
            TwoLayerNet(GatedMixedOp, channels, num_classes),
            input_shape=(1, 28, 28),
            input_dtype=torch.float32,
            spec={"num_classes": num_classes, "channels": channels},
        )


class PlainSpace(SearchSpace):
    """The same space without architecture parameters (MixedOp layers)."""

    def __init__(self, num_classes: int = 10, channels: int = 4) -> None:
        super().__init__(
            TwoLayerNet(MixedOp, channels, num_classes),
            input_shape=(1, 28, 28),
            input_dtype=torch.float32,
            spec={"num_classes": num_classes, "channels": channels},
        )


class UngatedDifferentiableSpace(DifferentiableSpace):
    """A DifferentiableSpace whose layers are plain MixedOp: refused when built."""

    def __init__(self) -> None:
        super().__init__(
            TwoLayerNet(MixedOp, 4, 10), input_shape=(1, 28, 28), input_dtype=torch.float32, spec={}
        )


@pytest.fixture(scope="module")
def run_config(data_cache):
    return tiny_fdnas(data_cache)


def _strategy(config, cls=FDNAS, space=None, **overrides):
    settings = parse_run_config(config)
    torch.manual_seed(settings.seed)
    return cls(
        space=TinyGatedSpace() if space is None else space,
        settings=settings.method_settings,
        seed=settings.seed,
        cluster_of=cluster_tagger(settings),
        **overrides,
    )


def _check_net(space: TinyGatedSpace, net) -> None:
    """The derived net is a path of the user's space, costed and trained as one."""
    assert net.option_names == space.option_names(net.arch)
    assert (net.flops, net.params) == (space.cost(net.arch).flops, space.cost(net.arch).params)
    rebuilt = build_space(**space.spec).subnet(net.arch)
    rebuilt.load_state_dict(net.arrays.to_torch_state_dict(), strict=True)
    assert rebuilt(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    assert 0.0 <= net.averaged_accuracy() <= 1.0


def test_the_user_space_derives_everything_from_its_gated_layers():
    space = TinyGatedSpace()
    assert space.spec["name"] == "tests.strategies.test_fdnas_user_space:TinyGatedSpace"
    assert space.alpha_keys() == ("net.layers.0.alpha", "net.layers.1.alpha")
    assert [tuple(a.shape) for a in space.arch_parameters()] == [(3,), (3,)]
    with torch.no_grad():
        space.arch_parameters()[0][1] = 2.0  # layer 0: conv1x1
        space.arch_parameters()[1][2] = 2.0  # layer 1: identity
    assert space.derive() == (1, 2)
    assert space.derive(space.min_flops()) == (2, 2)  # only identity twice fits
    x = torch.randn(2, 1, 28, 28)
    gates = [torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.0])]
    torch.testing.assert_close(space.forward_gated(x, [(0, 1), (2, 0)], gates), space(x, (1, 2)))


def test_fdnas_searches_derives_and_trains_a_user_space(run_config):
    strategy = _strategy(run_config)
    result = strategy.start(
        InProcessGrid(client_app, run_config, NUM_NODES), ArrayRecord(), num_rounds=1
    )
    assert set(result.supernet) == set(TinyGatedSpace().state_dict())
    assert [net.name for net in result.nets] == ["fdnas"]
    net = result.nets[0]
    space = TinyGatedSpace()
    space.load_state_dict(result.supernet.to_torch_state_dict())
    # the searched alphas' most probable path pulled toward the target (fdnas.derive-beta)
    settings = strategy.settings
    target = settings.target_flops * space.max_flops()
    assert net.arch == derive_toward(space, target, settings.derive_beta, strategy.max_flops)
    assert net.target_flops == target
    assert any(  # the clients moved the alphas
        not torch.equal(alpha.detach(), torch.zeros(3)) for alpha in space.arch_parameters()
    )
    _check_net(space, net)


def test_naive_cfdnas_gives_a_net_per_cluster_of_a_user_space(run_config):
    strategy = _strategy(run_config, cls=CFDNAS, inherit=False, train_global=False)
    result = strategy.start(
        InProcessGrid(client_app, run_config, NUM_NODES), ArrayRecord(), num_rounds=1
    )
    assert [net.name for net in result.nets] == ["cluster-0", "cluster-1", "cluster-2"]
    assert [net.partitions for net in result.nets] == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    assert all(len(history) == 1 for history in result.cluster_history.values())
    for net in result.nets:
        _check_net(TinyGatedSpace(), net)


@pytest.mark.parametrize("cls", [FDNAS, CFDNAS])
def test_a_space_without_architecture_parameters_is_refused_by_the_strategy(run_config, cls):
    with pytest.raises(ValueError, match=rf"{cls.__name__} needs a search space with archi"):
        _strategy(run_config, cls=cls, space=PlainSpace())
    with pytest.raises(ValueError, match="lacks arch_parameters, weight_parameters, probabil"):
        _strategy(run_config, cls=cls, space=PlainSpace())


def test_a_differentiable_space_of_plain_layers_is_refused_when_built():
    with pytest.raises(ValueError, match=r"layer\(s\) \['layers.0', 'layers.1'\] have no arch"):
        UngatedDifferentiableSpace()


def test_wrong_alpha_shapes_are_refused(run_config):
    space = TinyGatedSpace()
    space.net.layers[1].alpha = nn.Parameter(torch.zeros(4))
    with pytest.raises(ValueError, match=r"layer 1 .* have shape \(4,\); expected \(3,\)"):
        _strategy(run_config, space=space)


def test_the_client_refuses_a_space_without_architecture_parameters(data_cache):
    space = PlainSpace()
    config = {"seed": 0, "server-round": 1, **space_to_config(space.spec)}
    content = RecordDict({ARRAYS: ArrayRecord(space.state_dict()), CONFIG: ConfigRecord(config)})
    with pytest.raises(ValueError, match="FDNAS needs a search space with architecture param"):
        search_supernet(content, None, 0)
