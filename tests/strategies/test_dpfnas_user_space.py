"""DP-FNAS on a user's own DARTS-style space (defined here, not darts): it runs end to end on
the in-process grid (parties rebuild it and its derived net from its import path), and
spaces that lack the API or fail the per-sample-gradient check are refused with why."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from flwr.app import ArrayRecord
from torch import Tensor, nn

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.dpfnas.contract import DPFNAS_ARCH
from fedorasflwr.methods.dpfnas.strategy import DPFNAS
from fedorasflwr.search_spaces import MixedOp, SearchSpace, build_derived_network, build_space
from tests.strategies.test_dpfnas_strategy import tiny_dpfnas

OPTIONS = ("conv3x3", "avg_pool", "skip")


def _options(channels: int, norm: str) -> dict[str, nn.Module]:
    if norm == "group":
        layer: nn.Module = nn.GroupNorm(2, channels)
    else:  # "batch": trainable, opacus sees it; "batch-stats": not trainable, it does not
        layer = nn.BatchNorm2d(channels, affine=norm == "batch")
    return {
        "conv3x3": nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), layer, nn.ReLU()),
        "avg_pool": nn.AvgPool2d(3, 1, 1, count_include_pad=False),
        "skip": nn.Identity(),
    }


class EdgeNet(nn.Module):
    """28x28 -> 8x8 stem, two searchable edges, GAP, linear; ``alpha`` (2 x 3) mixes them."""

    def __init__(self, channels: int, num_classes: int, norm: str) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.AdaptiveAvgPool2d(8), nn.Conv2d(1, channels, 3, padding=1))
        self.edges = nn.ModuleList([MixedOp(_options(channels, norm)) for _ in range(2)])
        self.classifier = nn.Linear(channels, num_classes)
        self.alpha = nn.Parameter(1e-3 * torch.randn(2, len(OPTIONS)))

    def forward(self, x: Tensor, arch=None) -> Tensor:
        x = self.stem(x)
        for index, edge in enumerate(self.edges):
            if arch is None:  # the continuous relaxation: every option, weighted
                weights = torch.softmax(self.alpha[index], dim=0)
                x = sum(w * op(x) for w, op in zip(weights, edge.ops.values(), strict=True))
            else:
                x = edge(x, arch[index])
        return self.classifier(x.mean((2, 3)))


@dataclass(frozen=True)
class EdgeGenotype:
    """The option of each edge (what ``genotype()`` returns); travels as text."""

    ops: tuple[str, ...]

    def to_text(self) -> str:
        return ",".join(self.ops)


class TinyCellSpace(SearchSpace):
    """What a user writes for DP-FNAS: alphas in the state, a mixed forward, a derivation."""

    NORM = "group"

    def __init__(self, num_classes: int = 10, channels: int = 4) -> None:
        super().__init__(
            EdgeNet(channels, num_classes, self.NORM),
            input_shape=(1, 28, 28),
            input_dtype=torch.float32,
            spec={"num_classes": num_classes, "channels": channels},
        )

    @property
    def arch_keys(self) -> tuple[str, ...]:
        return ("net.alpha",)

    def forward(self, x: Tensor, arch=None) -> Tensor:
        return self.net(x) if arch is None else super().forward(x, arch)

    def genotype(self) -> EdgeGenotype:
        return EdgeGenotype(tuple(OPTIONS[int(i)] for i in self.net.alpha.detach().argmax(1)))

    @classmethod
    def derived_network(cls, genotype: str, **spec: int) -> nn.Module:
        space = cls(**spec)  # the derived net is the genotype's path of the supernet
        return space.subnet(space.arch_from_names(genotype.split(",")))


class BatchNormCellSpace(TinyCellSpace):
    NORM = "batch"


class BatchStatsCellSpace(TinyCellSpace):
    NORM = "batch-stats"


class NoGenotypeSpace(SearchSpace):
    """A plain supernet: no architecture variables, no derivation."""

    def __init__(self) -> None:
        super().__init__(
            EdgeNet(4, 10, "group"), input_shape=(1, 28, 28), input_dtype=torch.float32, spec={}
        )


def _strategy(config, space):
    settings = parse_run_config(config)
    return DPFNAS(space=space, settings=settings.method_settings, seed=settings.seed)


def test_dpfnas_searches_derives_and_trains_a_user_space(data_cache):
    config = tiny_dpfnas(data_cache)
    torch.manual_seed(0)
    space = TinyCellSpace()
    initial = {k: v.clone() for k, v in space.state_dict().items()}
    strategy = _strategy(config, space)
    assert strategy.arch_keys == ("net.alpha",)
    assert set(strategy.weight_keys) == set(space.state_dict()) - {"net.alpha"}
    grid = InProcessGrid(client_app, config, 2)
    result = strategy.start(grid, ArrayRecord(), 2)
    assert result.iterations == 2 and result.stopped == "completed"
    assert sum(m.metadata.message_type == DPFNAS_ARCH for m in grid.sent) == 2 * 2
    # the alphas and the weights moved; the genotype is the argmax of the searched alphas
    for key in ("net.alpha", "net.classifier.weight"):
        assert not torch.allclose(torch.from_numpy(result.arrays[key].numpy()), initial[key])
    searched = TinyCellSpace()
    searched.load_state_dict(result.arrays.to_torch_state_dict())
    assert result.genotype == searched.genotype()
    assert set(result.genotype.ops) <= set(OPTIONS) and len(result.genotype.ops) == 2
    # the final net is the genotype's derived network, trained and tested by the parties
    derived = build_derived_network(searched.spec, result.genotype.to_text())  # as parties do
    derived.load_state_dict(result.final_arrays.to_torch_state_dict(), strict=True)
    assert derived.arch == searched.arch_from_names(result.genotype.ops)
    assert derived(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    assert 0.0 <= result.test_accuracy <= 1.0


@pytest.mark.parametrize(
    ("space", "message"),
    [
        (
            BatchNormCellSpace,
            "per-sample gradients would be wrong \\(opacus ModuleValidator: BatchNorm cannot",
        ),
        (BatchStatsCellSpace, "output depends on the other samples of its batch"),
        (NoGenotypeSpace, "lacks arch_keys, genotype, derived_network"),
        (lambda: build_space("mbconv", width=0.25, layers_per_stage=1), "lacks arch_keys"),
    ],
    ids=["batchnorm", "batch-statistics", "no-api", "mbconv"],
)
def test_a_space_failing_the_api_or_the_per_sample_check_is_refused(data_cache, space, message):
    with pytest.raises(ValueError, match=message):
        _strategy(tiny_dpfnas(data_cache), space())


def test_arch_keys_must_name_parameters(data_cache):
    space = TinyCellSpace()
    space.net.alpha = nn.Parameter(torch.zeros(2, 3))  # still fine: a parameter
    _strategy(tiny_dpfnas(data_cache), space)

    class Renamed(TinyCellSpace):
        arch_keys = ("net.alphas",)

    with pytest.raises(ValueError, match=r"not parameters: \['net.alphas'\]"):
        _strategy(tiny_dpfnas(data_cache), Renamed())
