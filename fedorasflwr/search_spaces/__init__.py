"""Search spaces: supernets with labelled choices, per-option costs and keys.

``build_space(name, **kwargs)`` builds a registered space (``cnn_l``, ``cnn_s``,
``rnn``, ``mbconv``, ``darts``) or any ``SearchSpace`` subclass by its import path
(``"mypkg.space:MySpace"``); ``build_space(**space.spec)`` rebuilds the same structure.
``DifferentiableSpace`` (FDNAS / CFDNAS) and the ``DartsStyle`` API (DP-FNAS) are the
extensions those methods search; ``require_differentiable`` / ``require_darts_style`` check them,
and ``require_importable`` that the clients can import a model's class back from its spec.
``build_prunable(MyNet, input_shape=..., **kwargs)`` wraps any ``nn.Module`` class of
conv/linear layers for DecNAS (``"convnet"`` / ``"mobilenet"``: the built-ins);
``load_prunable(net.spec, state_dict)`` rebuilds one with its weights.
"""

from .base import (
    SPACES,
    Cost,
    LayerChoice,
    MixedOp,
    SampledPaths,
    SearchSpace,
    Subnet,
    Subspace,
    build_space,
    build_subnet,
    class_path,
    import_class,
    register_space,
    space_class,
)
from .cnn import CNNLargeSpace, CNNSmallSpace, cnn_l, cnn_s
from .darts import DartsSpace, DerivedNetwork, Genotype
from .darts_style import DartsStyle, build_derived_network, require_darts_style
from .differentiable import (
    DifferentiableSpace,
    GatedChoice,
    GatedMixedOp,
    require_differentiable,
)
from .importable import require_importable
from .mbconv import MBConvSpace, mbconv
from .prunable import PrunableNet, build_prunable, load_prunable
from .rnn import RNNSpace, rnn

__all__ = [
    "SPACES",
    "CNNLargeSpace",
    "CNNSmallSpace",
    "DartsSpace",
    "DartsStyle",
    "DerivedNetwork",
    "Genotype",
    "Cost",
    "DifferentiableSpace",
    "GatedChoice",
    "GatedMixedOp",
    "LayerChoice",
    "MBConvSpace",
    "MixedOp",
    "PrunableNet",
    "RNNSpace",
    "SampledPaths",
    "SearchSpace",
    "Subnet",
    "Subspace",
    "build_derived_network",
    "build_prunable",
    "build_space",
    "build_subnet",
    "class_path",
    "cnn_l",
    "cnn_s",
    "import_class",
    "load_prunable",
    "mbconv",
    "register_space",
    "require_darts_style",
    "require_differentiable",
    "require_importable",
    "rnn",
    "space_class",
]
