"""Prunable networks for DecNAS (federated NetAdapt): plain nets whose layers lose filters.

A :class:`PrunableNet` is an ordinary ``nn.Module`` described by its *widths*:
the number of filters of each prunable layer (its architecture).  Two nets
(DecNAS paper, Table 2):

- ``convnet``: a simplified AlexNet, six CONV (3x3, BN, ReLU) layers with a
  2x2 max-pool after every second one, then one FC classifier;
- ``mobilenet``: MobileNet v1, a standard 3x3 CONV then 13 depthwise-separable
  blocks, global average pooling and one FC classifier.

``width`` scales the default filter counts (a width multiplier).  The prunable
layers are the CONV layers that choose their number of filters (convnet: all
six; mobilenet: the first CONV and the 13 pointwise CONVs: K = 14, as in the
paper); a depthwise CONV follows the layer that feeds it.

:func:`prune_layer` removes filters from one layer, keeping those with the
largest L2 norm, and slices everything that consumes that layer (BN, the next
layer's input channels, depthwise partners, the classifier's input columns).
Costs come from the shared cost layer (:class:`~.base.Cost`, measured with
``FlopCounterMode`` on one sample: FLOPs = 2 x MACs); MACs and parameters are
linear in any one layer's width, which :func:`prune_to_budget` uses to remove
just enough filters, then checks on the measured cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from .base import Cost, _count_flops, _num_params, image_spec, positive_float

__all__ = [
    "PRUNABLE_NETS",
    "RESOURCES",
    "ConvNet",
    "MobileNetV1",
    "PrunableNet",
    "build_prunable",
    "filter_norms",
    "prune_layer",
    "prune_to_budget",
    "resource",
    "spec_cost",
    "width_scaled",
]

RESOURCES = ("macs", "params")
"""What a budget may count: multiply-accumulates of one sample, or parameters."""

Slice = tuple[str, int, int]  # state_dict key, dimension, elements per filter along it

_BN_KEYS = ("weight", "bias", "running_mean", "running_var")
_COSTS: dict[tuple[Any, ...], Cost] = {}
_COSTS_LIMIT = 4096


def _bn(prefix: str) -> list[Slice]:
    return [(f"{prefix}.{key}", 0, 1) for key in _BN_KEYS]


class PrunableNet(nn.Module):
    """A net whose prunable layers have ``widths`` filters; rebuilt by ``build_prunable(**spec)``.

    Subclasses build their modules from ``widths`` and say, per prunable layer,
    which ``state_dict`` slices belong to its filters (:meth:`slice_plan`).
    """

    name: ClassVar[str] = ""
    base_widths: ClassVar[tuple[int, ...]] = ()

    def __init__(
        self,
        widths: Sequence[int],
        *,
        num_classes: int,
        in_channels: int,
        input_height: int,
        input_width: int,
    ) -> None:
        super().__init__()
        self.image = image_spec(num_classes, in_channels, input_height, input_width)
        values = tuple(widths)
        if len(values) != len(self.base_widths) or not all(
            isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in values
        ):
            raise ValueError(
                f"{self.name} needs {len(self.base_widths)} widths (filters per prunable "
                f"layer), each an integer >= 1; got {values}"
            )
        self.widths = values

    @property
    def spec(self) -> dict[str, Any]:
        """``build_prunable(**spec)`` rebuilds this structure (weights not included)."""
        return {"name": self.name, **self.image, "widths": list(self.widths)}

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.image["in_channels"], self.image["input_height"], self.image["input_width"])

    @property
    def num_layers(self) -> int:
        """K: the number of prunable layers."""
        return len(self.widths)

    def layer_names(self) -> tuple[str, ...]:
        """A label per prunable layer (its filters' weight key without ``.weight``)."""
        return tuple(
            self.filter_key(layer).removesuffix(".weight") for layer in range(self.num_layers)
        )

    def filter_key(self, layer: int) -> str:
        """The weight whose dimension 0 holds the layer's filters."""
        return self.slice_plan(layer)[0][0]

    def slice_plan(self, layer: int) -> list[Slice]:
        """Each ``(key, dim, group)`` that shrinks with ``layer``'s filters, own weight first."""
        raise NotImplementedError

    def cost(self) -> Cost:
        """FLOPs (2 x MACs, one sample, ``FlopCounterMode``) and parameters, memoised per spec."""
        key = (self.name, tuple(self.image.items()), self.widths)
        cost = _COSTS.get(key)
        if cost is None:
            probe = _on_meta(self.spec)
            probe.eval()
            x = torch.zeros((1, *self.input_shape), device="meta")
            cost = Cost(_count_flops(probe, x), _num_params(probe))
            if len(_COSTS) >= _COSTS_LIMIT:
                _COSTS.pop(next(iter(_COSTS)))
            _COSTS[key] = cost
        return cost

    def extra_repr(self) -> str:
        return f"name={self.name!r}, widths={list(self.widths)}"


class _ConvUnit(nn.Module):
    def __init__(self, c_in: int, c_out: int, pool: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.pool = nn.MaxPool2d(2) if pool else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.pool(torch.relu(self.bn(self.conv(x))))


class ConvNet(PrunableNet):
    """Simplified AlexNet ("ConvNet", DecNAS Table 2): 6 CONV layers, a max-pool after
    every second one (while the feature map is at least 2 px), then one FC layer."""

    name = "convnet"
    base_widths = (32, 32, 64, 64, 128, 128)

    def __init__(self, widths: Sequence[int], **image: Any) -> None:
        super().__init__(widths, **image)
        height, width = self.image["input_height"], self.image["input_width"]
        units, c_in = [], self.image["in_channels"]
        for layer, c_out in enumerate(self.widths):
            pool = layer % 2 == 1 and min(height, width) >= 2
            units.append(_ConvUnit(c_in, c_out, pool))
            if pool:
                height, width = height // 2, width // 2
            c_in = c_out
        self.blocks = nn.ModuleList(units)
        self.spatial = height * width
        self.classifier = nn.Linear(c_in * self.spatial, self.image["num_classes"])

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x)
        return self.classifier(torch.flatten(x, 1))

    def slice_plan(self, layer: int) -> list[Slice]:
        plan = [(f"blocks.{layer}.conv.weight", 0, 1), *_bn(f"blocks.{layer}.bn")]
        if layer + 1 < self.num_layers:
            plan.append((f"blocks.{layer + 1}.conv.weight", 1, 1))
        else:  # flattened channel-major: each filter owns `spatial` consecutive inputs
            plan.append(("classifier.weight", 1, self.spatial))
        return plan


class _Separable(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c_in, c_in, 3, stride, 1, groups=c_in, bias=False)
        self.dw_bn = nn.BatchNorm2d(c_in)
        self.pw = nn.Conv2d(c_in, c_out, 1, bias=False)
        self.pw_bn = nn.BatchNorm2d(c_out)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.relu(self.dw_bn(self.dw(x)))
        return torch.relu(self.pw_bn(self.pw(x)))


class _Stem(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn = nn.BatchNorm2d(c_out)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.bn(self.conv(x)))


class MobileNetV1(PrunableNet):
    """MobileNet v1 (Howard et al., 2017): CONV 3x3, 13 depthwise-separable blocks, GAP, FC.

    The stem's stride is 2 for inputs above 32 px and 1 otherwise (small images).
    """

    name = "mobilenet"
    base_widths = (32, 64, 128, 128, 256, 256, 512, 512, 512, 512, 512, 512, 1024, 1024)
    strides = (1, 2, 1, 2, 1, 2, 1, 1, 1, 1, 1, 2, 1)

    def __init__(self, widths: Sequence[int], **image: Any) -> None:
        super().__init__(widths, **image)
        stem_stride = 2 if min(self.image["input_height"], self.image["input_width"]) > 32 else 1
        self.stem = _Stem(self.image["in_channels"], self.widths[0], stem_stride)
        self.blocks = nn.ModuleList(
            _Separable(c_in, c_out, stride)
            for c_in, c_out, stride in zip(
                self.widths[:-1], self.widths[1:], self.strides, strict=True
            )
        )
        self.classifier = nn.Linear(self.widths[-1], self.image["num_classes"])

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    def slice_plan(self, layer: int) -> list[Slice]:
        if layer == 0:
            plan = [("stem.conv.weight", 0, 1), *_bn("stem.bn")]
        else:
            plan = [(f"blocks.{layer - 1}.pw.weight", 0, 1), *_bn(f"blocks.{layer - 1}.pw_bn")]
        if layer < len(self.blocks):  # the next block's depthwise partner, then its pointwise
            plan += [(f"blocks.{layer}.dw.weight", 0, 1), *_bn(f"blocks.{layer}.dw_bn")]
            plan.append((f"blocks.{layer}.pw.weight", 1, 1))
        else:
            plan.append(("classifier.weight", 1, 1))
        return plan


PRUNABLE_NETS: dict[str, type[PrunableNet]] = {ConvNet.name: ConvNet, MobileNetV1.name: MobileNetV1}
"""Prunable nets by name."""


def build_prunable(
    name: str,
    *,
    num_classes: int,
    in_channels: int,
    input_height: int,
    input_width: int,
    width: float = 1.0,
    widths: Sequence[int] | None = None,
) -> PrunableNet:
    """Build ``name`` (``convnet`` or ``mobilenet``) with ``widths`` filters per prunable
    layer, or the default filters scaled by ``width`` (each at least 1)."""
    if name not in PRUNABLE_NETS:
        raise ValueError(f"unknown prunable net {name!r}; valid: {', '.join(PRUNABLE_NETS)}")
    cls = PRUNABLE_NETS[name]
    if widths is None:
        scale = positive_float("width", width)
        widths = [max(1, round(w * scale)) for w in cls.base_widths]
    return cls(
        [int(w) for w in widths],
        num_classes=num_classes,
        in_channels=in_channels,
        input_height=input_height,
        input_width=input_width,
    )


def _on_meta(spec: dict[str, Any]) -> PrunableNet:
    """The structure of ``spec`` without storage (for costs and as a loading target)."""
    with torch.device("meta"):
        return build_prunable(**spec)


def spec_cost(spec: dict[str, Any]) -> Cost:
    """The cost of ``build_prunable(**spec)``, without building its weights."""
    return _on_meta(spec).cost()


def resource(net: PrunableNet | dict[str, Any], kind: str) -> int:
    """``"macs"`` (FLOPs / 2 of one sample) or ``"params"`` of a net or of its spec."""
    cost = spec_cost(net) if isinstance(net, dict) else net.cost()
    if kind == "macs":
        return cost.flops // 2
    if kind == "params":
        return cost.params
    raise ValueError(f"unknown resource {kind!r}; valid: {', '.join(RESOURCES)}")


def _with_widths(net: PrunableNet, widths: Sequence[int]) -> PrunableNet:
    return _on_meta({**net.spec, "widths": list(widths)})


def filter_norms(net: PrunableNet, layer: int) -> Tensor:
    """L2 norm of every filter of ``layer`` (NetAdapt / DecNAS §4.1 rank filters by it)."""
    weight = net.state_dict()[net.filter_key(_check_layer(net, layer))]
    return weight.detach().flatten(1).norm(dim=1)


def prune_layer(net: PrunableNet, layer: int, keep: int) -> PrunableNet:
    """A copy of ``net`` whose ``layer`` keeps its ``keep`` largest-norm filters (in their
    original order); BN, consumers and depthwise partners are sliced to match."""
    layer = _check_layer(net, layer)
    if not 1 <= keep <= net.widths[layer]:
        raise ValueError(f"layer {layer} has {net.widths[layer]} filters; cannot keep {keep}")
    norms = filter_norms(net, layer)
    kept = torch.sort(torch.argsort(norms, descending=True, stable=True)[:keep]).values
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    for key, dim, group in net.slice_plan(layer):
        index = (kept[:, None] * group + torch.arange(group)).reshape(-1)
        state[key] = state[key].index_select(dim, index)
    widths = list(net.widths)
    widths[layer] = keep
    pruned = _with_widths(net, widths)
    pruned.load_state_dict(state, strict=True, assign=True)
    return pruned.train(net.training)


def prune_to_budget(
    net: PrunableNet, layer: int, budget: float, kind: str = "macs", min_filters: int = 1
) -> PrunableNet | None:
    """Prune the fewest filters of ``layer`` so that ``resource(pruned, kind) <= budget``;
    ``None`` if even ``min_filters`` filters exceed it.

    The resource is linear in one layer's width, so the number to remove is
    ``ceil((Res(net) - budget) / (Res(net) - Res(net with one filter less)))``.
    """
    layer = _check_layer(net, layer)
    current, filters = resource(net, kind), net.widths[layer]
    if current <= budget:
        return prune_layer(net, layer, filters)
    if filters <= min_filters:
        return None
    narrower = list(net.widths)
    narrower[layer] -= 1
    step = current - resource(_with_widths(net, narrower), kind)
    if step <= 0:
        return None
    keep = filters - math.ceil((current - budget) / step)
    if keep < min_filters:
        return None
    pruned = prune_layer(net, layer, keep)
    while resource(pruned, kind) > budget:  # never taken for these nets (linear costs)
        if keep <= min_filters:
            return None
        keep -= 1
        pruned = prune_layer(net, layer, keep)
    return pruned


def width_scaled(net: PrunableNet, budget: float, kind: str = "macs") -> PrunableNet:
    """The width-multiplier baseline: every layer of ``net``'s structure scaled by one
    factor, the largest (to 1e-3) whose resource fits ``budget``; fresh weights."""
    low, high = 0.0, 1.0
    for _ in range(12):
        middle = (low + high) / 2
        widths = [max(1, round(w * middle)) for w in net.widths]
        if resource(_with_widths(net, widths), kind) <= budget:
            low = middle
        else:
            high = middle
    widths = [max(1, round(w * low)) for w in net.widths]
    return build_prunable(**{**net.spec, "widths": widths})


def _check_layer(net: PrunableNet, layer: int) -> int:
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < net.num_layers:
        raise ValueError(f"{net.name} has prunable layers 0..{net.num_layers - 1}; got {layer!r}")
    return layer
