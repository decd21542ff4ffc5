"""The ``mbconv`` space: a ProxylessNAS-style chain of MBConv layers (FDNAS / CFDNAS).

ProxylessNAS (Cai et al., ICLR 2019) and FDNAS (Zhang et al., arXiv:2011.03372):
a fixed stem and first MBConv (expansion 1), then stages of searchable
layers, each choosing among MBConv with kernel 3/5/7 and expansion 3/6, plus
``identity`` (skip the layer) where input and output shapes agree; a fixed
1x1 head, global average pooling and a linear classifier.  The paper's space
has 19 searchable layers on 32x32 / 224x224 inputs; here depth and width
scale so a 2-core CPU can search on 28x28 MNIST.

Each searchable layer carries its architecture parameters ``alpha`` (one
logit per option) as an ``nn.Parameter``, so they are in ``state_dict`` and
travel in the ``ArrayRecord`` with the weights (keys ``*.alpha``, listed by
``alpha_keys()``).  Weight steps run one sampled path (``forward(x, arch)``,
binary gates); alpha steps run a few candidates per layer with binary gates
(``forward_gated``) for the ProxylessNAS gradient estimator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from .base import MixedOp, SearchSpace, image_spec, positive_float, positive_int, register_space

__all__ = ["MBCONV_OPTIONS", "GatedMixedOp", "MBConv", "MBConvSpace", "mbconv"]

MBCONV_OPTIONS = tuple(f"mbconv_k{k}_e{e}" for e in (3, 6) for k in (3, 5, 7))
"""Options of every searchable layer (``identity`` is added where shapes allow)."""

STAGES = ((24, 2), (40, 2), (64, 1))
"""(output channels at width 1, stride of the stage's first layer); paper: 6 stages."""


def _channels(value: float) -> int:
    return max(4, 2 * round(value / 2))


class MBConv(nn.Module):
    """Inverted residual (MobileNetV2): 1x1 expand, k x k depthwise, linear 1x1 project."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, expansion: int, stride: int
    ) -> None:
        super().__init__()
        hidden = in_channels * expansion
        layers: list[nn.Module] = []
        if expansion != 1:
            layers += [
                nn.Conv2d(in_channels, hidden, 1, bias=False),
                nn.BatchNorm2d(hidden),
                nn.ReLU6(),
            ]
        layers += [
            nn.Conv2d(
                hidden, hidden, kernel_size, stride, kernel_size // 2, groups=hidden, bias=False
            ),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, out_channels, 1, bias=False),
            nn.BatchNorm2d(out_channels),
        ]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: Tensor) -> Tensor:
        out = self.body(x)
        return x + out if self.residual else out


class GatedMixedOp(MixedOp):
    """A searchable layer with architecture parameters ``alpha`` (one logit per option)."""

    def __init__(self, options: Mapping[str, nn.Module]) -> None:
        super().__init__(options)
        self.alpha = nn.Parameter(torch.zeros(len(self.option_names)))

    def forward_gated(self, x: Tensor, candidates: Sequence[int], gates: Tensor) -> Tensor:
        """``sum_j gates[j] * op_{candidates[j]}(x)``: binary gates, gradients reach all."""
        out = 0
        for j, option in enumerate(candidates):
            out = out + gates[j] * self.ops[self.option_keys[option]](x)
        return out


def _layer(in_channels: int, out_channels: int, stride: int) -> GatedMixedOp:
    options: dict[str, nn.Module] = {
        f"mbconv_k{k}_e{e}": MBConv(in_channels, out_channels, k, e, stride)
        for e in (3, 6)
        for k in (3, 5, 7)
    }
    if stride == 1 and in_channels == out_channels:
        options["identity"] = nn.Identity()
    return GatedMixedOp(options)


class MBConvSupernet(nn.Module):
    """Stem -> MBConv e1 -> searchable layers -> 1x1 head -> GAP -> linear."""

    def __init__(
        self, in_channels: int, num_classes: int, width: float, layers_per_stage: int
    ) -> None:
        super().__init__()
        stem = _channels(16 * width)
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, stem, 3, 2, 1, bias=False),
            nn.BatchNorm2d(stem),
            nn.ReLU6(),
            MBConv(stem, _channels(8 * width), 3, 1, 1),
        )
        channels = _channels(8 * width)
        layers = []
        for out, stride in STAGES:
            out = _channels(out * width)
            for index in range(layers_per_stage):
                layers.append(_layer(channels, out, stride if index == 0 else 1))
                channels = out
        self.layers = nn.ModuleList(layers)
        head = _channels(128 * width)
        self.head = nn.Sequential(
            nn.Conv2d(channels, head, 1, bias=False), nn.BatchNorm2d(head), nn.ReLU6()
        )
        self.classifier = nn.Linear(head, num_classes)

    def forward(self, x: Tensor, arch: Sequence[int]) -> Tensor:
        x = self.stem(x)
        for layer, option in zip(self.layers, arch, strict=True):
            x = layer(x, option)
        return self.classifier(self.head(x).mean((2, 3)))

    def forward_gated(
        self, x: Tensor, candidates: Sequence[Sequence[int]], gates: Sequence[Tensor]
    ) -> Tensor:
        x = self.stem(x)
        for layer, options, layer_gates in zip(self.layers, candidates, gates, strict=True):
            x = layer.forward_gated(x, options, layer_gates)
        return self.classifier(self.head(x).mean((2, 3)))


@register_space
class MBConvSpace(SearchSpace):
    """``mbconv``: ProxylessNAS-style supernet with per-layer ``alpha`` (FDNAS space).

    Stem conv3x3 stride 2 (16 x width channels) and a fixed MBConv e1 (8 x width);
    three stages (24, 40, 64 x width channels; strides 2, 2, 1) of
    ``layers_per_stage`` searchable layers with options :data:`MBCONV_OPTIONS`
    (+ ``identity`` in every layer but a stage's first); a 1x1 head (128 x width),
    GAP, linear.  Paper: 19 searchable layers in 6 stages.
    """

    name = "mbconv"

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        input_height: int = 28,
        input_width: int = 28,
        width: float = 1.0,
        layers_per_stage: int = 2,
    ) -> None:
        spec = {
            **image_spec(num_classes, in_channels, input_height, input_width),
            "width": positive_float("width", width),
            "layers_per_stage": positive_int("layers_per_stage", layers_per_stage),
        }
        net = MBConvSupernet(
            spec["in_channels"], spec["num_classes"], spec["width"], spec["layers_per_stage"]
        )
        super().__init__(
            net,
            input_shape=(spec["in_channels"], spec["input_height"], spec["input_width"]),
            input_dtype=torch.float32,
            spec=spec,
        )

    # ------------------------------------------------------- architecture parameters
    def alpha_keys(self) -> tuple[str, ...]:
        """``state_dict`` keys of the architecture parameters, one per searchable layer."""
        return tuple(f"net.{choice.name}.alpha" for choice in self.choices)

    def arch_parameters(self) -> list[nn.Parameter]:
        """The ``alpha`` of every searchable layer, in layer order."""
        return [layer.alpha for layer in self.net.layers]

    def weight_parameters(self) -> list[nn.Parameter]:
        """Every parameter but the ``alpha``s (the network weights ``w``)."""
        alphas = {id(p) for p in self.arch_parameters()}
        return [p for p in self.parameters() if id(p) not in alphas]

    def probabilities(self) -> list[Tensor]:
        """``softmax(alpha)`` of every layer (differentiable)."""
        return [torch.softmax(alpha, dim=0) for alpha in self.arch_parameters()]

    def expected_flops(self) -> Tensor:
        """Expected FLOPs of a path drawn from ``softmax(alpha)`` (differentiable in alpha)."""
        device = self.arch_parameters()[0].device
        total = torch.tensor(float(self.fixed_cost.flops), device=device)
        for layer, probs in enumerate(self.probabilities()):
            flops = torch.tensor(
                [float(self.option_cost(layer, o).flops) for o in range(len(probs))],
                device=device,
            )
            total = total + (probs * flops).sum()
        return total

    def derive(self, max_flops: float | None = None) -> tuple[int, ...]:
        """The derived ("normal") net: argmax alpha per layer.

        With ``max_flops`` (absolute), the most probable path under ``softmax(alpha)``
        whose FLOPs stay within it: the argmax when that fits, else the path maximising
        ``sum(log p)`` among those that fit (exact, by keeping per layer only the
        partial paths no other beats on both FLOPs and probability).  The hardware
        term bounds *expected* FLOPs; the argmax of a soft distribution can land on
        either side of it, and a device's limit is a bound on the net it runs."""
        argmax = tuple(int(alpha.detach().argmax()) for alpha in self.arch_parameters())
        if max_flops is None or self.cost(argmax).flops <= max_flops:
            return argmax
        if self.min_flops() > max_flops:
            raise ValueError(
                f"no path of the {self.name!r} space fits in {max_flops:.6g} FLOPs "
                f"(the cheapest has {self.min_flops()})"
            )
        budget = max_flops - self.fixed_cost.flops
        # partial paths as (flops, log-probability, options), Pareto-pruned per layer
        frontier: list[tuple[int, float, tuple[int, ...]]] = [(0, 0.0, ())]
        for layer, alpha in enumerate(self.arch_parameters()):
            logp = torch.log_softmax(alpha.detach().double(), dim=0).tolist()
            costs = [self.option_cost(layer, o).flops for o in range(len(logp))]
            grown = sorted(
                (
                    (flops + costs[o], score + logp[o], path + (o,))
                    for flops, score, path in frontier
                    for o in range(len(logp))
                    if flops + costs[o] <= budget
                ),
                key=lambda t: (t[0], -t[1]),
            )
            frontier = []
            for candidate in grown:  # cheapest first: keep those more probable than all cheaper
                if not frontier or candidate[1] > frontier[-1][1]:
                    frontier.append(candidate)
        return max(frontier, key=lambda t: t[1])[2]

    def forward_gated(
        self, x: Tensor, candidates: Sequence[Sequence[int]], gates: Sequence[Tensor]
    ) -> Tensor:
        """Run each layer's ``candidates`` weighted by ``gates`` (binary, one active)."""
        return self.net.forward_gated(x, candidates, gates)


mbconv = MBConvSpace
"""Alias: ``mbconv(num_classes=10, ...)`` reads like the design table."""
