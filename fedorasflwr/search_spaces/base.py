"""Supernet machinery shared by every search space: choices, costs, keys, sampling.

A search space is an ``nn.Module`` whose ``forward(x, arch)`` runs one path
(single-path one-shot, SPOS).  An architecture (a *path*) is a tuple of option
indices, one per searchable layer; a *subspace* keeps, per layer, a non-empty
sorted tuple of option indices (the paper's :math:`\\hat{\\mathcal{O}}_l`).

Cost convention (used by every report of this project): ``flops`` is
**2 x MACs** of one forward pass of **one** sample at ``input_shape``, exactly
as counted by :class:`torch.utils.flop_counter.FlopCounterMode`, which counts
matrix multiplications and convolutions (bias additions, normalisation,
activations, pooling and other element-wise operations are not counted);
``params`` counts parameters (not buffers).  The per-option table is measured
once at construction, so ``cost(arch)`` is an exact sum: fixed + options.
*Sizes* (``option_size``, ``fixed_size``, ``total_size``) count ``state_dict``
elements, parameters **and** buffers: what a message carrying them costs.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import math
import operator
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from . import cost_cache as _cost_cache
from . import sampling as _sampling
from .sampling import Subspace

__all__ = [
    "SPACES",
    "Cost",
    "LayerChoice",
    "MixedOp",
    "SampledPaths",
    "SearchSpace",
    "Subnet",
    "Subspace",
    "build_space",
    "build_subnet",
    "class_path",
    "import_class",
    "importable_path",
    "register_space",
    "space_class",
]


@dataclass(frozen=True)
class LayerChoice:
    """A labelled searchable layer: its name and its option names, in index order."""

    name: str
    options: tuple[str, ...]


@dataclass(frozen=True)
class Cost:
    """FLOPs (2 x MACs, one sample, ``FlopCounterMode``) and parameter count."""

    flops: int
    params: int

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(self.flops + other.flops, self.params + other.params)


class MixedOp(nn.Module):
    """One searchable layer: candidate modules keyed by option name; runs the chosen one.

    Option names may contain dots (``"dsconv3x3_e0.5"``); module keys cannot,
    so a dot becomes ``_`` in the ``state_dict`` key (``ops.dsconv3x3_e0_5.*``).
    """

    def __init__(self, options: Mapping[str, nn.Module]) -> None:
        super().__init__()
        if not options:
            raise ValueError("a searchable layer needs at least one option")
        self.option_names = tuple(options)
        self.option_keys = tuple(name.replace(".", "_") for name in self.option_names)
        if len(set(self.option_keys)) != len(self.option_keys):
            raise ValueError(f"option names collide as module keys: {self.option_names}")
        clashes = [k for k in self.option_keys if hasattr(nn.ModuleDict, k)]
        if clashes:
            raise ValueError(f"option names {clashes} clash with nn.Module attributes; rename them")
        self.ops = nn.ModuleDict(dict(zip(self.option_keys, options.values(), strict=True)))

    def forward(self, x: Tensor, option: int) -> Tensor:
        # A loop over the ModuleDict, not ``self.ops[key]``: TorchScript indexes a
        # ModuleDict only with literals, and a subnet's layer holds its chosen op only.
        key = self.option_keys[option]
        for name, op in self.ops.items():
            if name == key:
                return op(x)
        raise ValueError(f"option {option} ({key}) is not held by this layer")


class Subnet(nn.Module):
    """One path of a search space as a standalone network (the paper's extracted model).

    Its ``state_dict`` keys are the space's ``path_keys(arch)`` (same names), so
    ``space.load_state_dict(subnet.state_dict(), strict=False)`` writes it back.
    ``spec`` and ``arch`` rebuild it: ``build_space(**spec).subnet(arch)``.
    """

    def __init__(self, net: nn.Module, arch: tuple[int, ...], spec: dict[str, Any]) -> None:
        super().__init__()
        self.net = net
        self.arch = arch
        self.spec = dict(spec)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x, self.arch)


# Cost tables are a pure function of a space's structure (its spec), and measuring
# them costs ~0.1 s per build plus ~1 s for the first FlopCounterMode in a process.
# Clients rebuild the supernet for every message, so the immutable tables are
# memoised per spec (like functools.lru_cache, which can't key on the instance).
_MEASURED_COSTS: dict[tuple[Any, ...], tuple[tuple[tuple[Cost, ...], ...], Cost]] = {}
_MEASURED_COSTS_LIMIT = 32


class SearchSpace(nn.Module):
    """A supernet: ``forward(x, arch)`` plus the description of its choices and costs.

    Subclasses build a network module whose ``forward(x, arch)`` runs one path
    and whose searchable layers are :class:`MixedOp` modules registered in
    forward order, then call ``super().__init__(net, ...)``; the choices, keys
    and cost tables are derived here.  ``state_dict`` keys start with ``net.``.
    """

    name: ClassVar[str] = ""

    def __init__(
        self,
        net: nn.Module,
        *,
        input_shape: Sequence[int],
        input_dtype: torch.dtype,
        spec: Mapping[str, int | float | str],
    ) -> None:
        super().__init__()
        self.net = net
        self.input_shape = tuple(int(d) for d in input_shape)
        self.input_dtype = input_dtype
        self._spec: dict[str, int | float | str] = {"name": space_name(type(self)), **spec}
        mixed = [(path, m) for path, m in net.named_modules() if isinstance(m, MixedOp)]
        if not mixed:
            raise ValueError(f"{type(self).__name__} has no searchable layer (MixedOp)")
        self.choices = tuple(LayerChoice(path, m.option_names) for path, m in mixed)

        owners: dict[str, tuple[int, int]] = {}
        for layer, (path, m) in enumerate(mixed):
            for option, key in enumerate(m.option_keys):
                for k in m.ops[key].state_dict(prefix=f"net.{path}.ops.{key}."):
                    owners[k] = (layer, option)
        state = self.state_dict()
        self._key_owners = tuple((k, owners.get(k)) for k in state)
        self._op_keys = tuple(
            tuple(
                tuple(k for k, owner in self._key_owners if owner == (layer, option))
                for option in range(len(choice.options))
            )
            for layer, choice in enumerate(self.choices)
        )
        self._fixed_keys = tuple(k for k, owner in self._key_owners if owner is None)
        self._sizes = tuple(
            tuple(sum(state[k].numel() for k in keys) for keys in layer) for layer in self._op_keys
        )
        self._total_size = sum(v.numel() for v in state.values())
        self._fixed_size = sum(state[k].numel() for k in self._fixed_keys)
        memo_key = (type(self).__qualname__, tuple(sorted(self._spec.items())))
        measured = _MEASURED_COSTS.get(memo_key)
        if measured is None:
            measured = self._cached_or_measured_costs(memo_key, [m for _, m in mixed])
            if len(_MEASURED_COSTS) >= _MEASURED_COSTS_LIMIT:
                _MEASURED_COSTS.pop(next(iter(_MEASURED_COSTS)))
            _MEASURED_COSTS[memo_key] = measured
        self._costs, self._fixed_cost = measured
        self._flops = tuple(tuple(c.flops for c in layer) for layer in self._costs)

    # ----------------------------------------------------------------- costs
    def _cached_or_measured_costs(
        self, memo_key: tuple[Any, ...], mixed: list[MixedOp]
    ) -> tuple[tuple[tuple[Cost, ...], ...], Cost]:
        """The cost tables from the disk cache (:mod:`.cost_cache`), else measured and
        stored: a deployment ClientApp is a fresh process per message."""
        params = [[_num_params(m.ops[key]) for key in m.option_keys] for m in mixed]
        cached = _cost_cache.load_costs(memo_key, params, _num_params(self))
        if cached is not None:
            layers, fixed = cached
            return tuple(tuple(Cost(*c) for c in layer) for layer in layers), Cost(*fixed)
        costs, fixed_cost = self._measure_costs(mixed)
        tables = (
            tuple(tuple((c.flops, c.params) for c in layer) for layer in costs),
            (fixed_cost.flops, fixed_cost.params),
        )
        _cost_cache.store_costs(memo_key, tables)
        return costs, fixed_cost

    def _measure_costs(self, mixed: list[MixedOp]) -> tuple[tuple[tuple[Cost, ...], ...], Cost]:
        """Count each option on the input its layer sees, and the fixed rest by difference."""
        seen: dict[int, Tensor] = {}

        def record(layer: int) -> Callable[[nn.Module, tuple[Any, ...]], None]:
            def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
                seen[layer] = args[0]

            return hook

        was_training = self.training
        self.eval()  # batch-1 BN in train mode may fail and would move running stats
        hooks = [m.register_forward_pre_hook(record(layer)) for layer, m in enumerate(mixed)]
        x = torch.zeros((1, *self.input_shape), dtype=self.input_dtype)
        try:
            with torch.no_grad():
                path_flops = _count_flops(self.net, x, (0,) * len(mixed))
                costs = tuple(
                    tuple(
                        Cost(_count_flops(m.ops[key], seen[layer]), _num_params(m.ops[key]))
                        for key in m.option_keys
                    )
                    for layer, m in enumerate(mixed)
                )
        finally:
            for hook in hooks:
                hook.remove()
            self.train(was_training)
        option_params = sum(c.params for layer in costs for c in layer)
        fixed = Cost(
            path_flops - sum(layer[0].flops for layer in costs),
            _num_params(self) - option_params,
        )
        return costs, fixed

    def option_cost(self, layer: int, option: int) -> Cost:
        """FLOPs and parameters of one option (its share of any path through it)."""
        self._check_option(layer, option)
        return self._costs[layer][option]

    @property
    def fixed_cost(self) -> Cost:
        """FLOPs and parameters of the non-searchable parts (the lowest reachable cost)."""
        return self._fixed_cost

    def cost(self, arch: Sequence[int]) -> Cost:
        """Cost of a path: fixed cost plus its options' costs (equals ``subnet(arch)``'s)."""
        arch = self.validate_arch(arch)
        total = self._fixed_cost
        for layer, option in enumerate(arch):
            total = total + self._costs[layer][option]
        return total

    def option_size(self, layer: int, option: int) -> int:
        """``state_dict`` elements (parameters and buffers) owned by one option."""
        self._check_option(layer, option)
        return self._sizes[layer][option]

    @property
    def fixed_size(self) -> int:
        """``state_dict`` elements of the non-searchable parts (always sent)."""
        return self._fixed_size

    @property
    def total_size(self) -> int:
        """``state_dict`` elements of the whole supernet."""
        return self._total_size

    def subspace_size(self, subspace: Subspace) -> int:
        """``state_dict`` elements of ``subspace_keys(subspace)``."""
        kept = self.validate_subspace(subspace)
        return self._fixed_size + sum(
            self._sizes[i][o] for i, opts in enumerate(kept) for o in opts
        )

    def min_flops(self, subspace: Subspace | None = None) -> int:
        """FLOPs of the cheapest path (in ``subspace`` if given)."""
        kept = self._kept(subspace)
        return self._fixed_cost.flops + sum(min(self._flops[i][o] for o in k) for i, k in kept)

    def max_flops(self, subspace: Subspace | None = None) -> int:
        """FLOPs of the most expensive path (in ``subspace`` if given)."""
        kept = self._kept(subspace)
        return self._fixed_cost.flops + sum(max(self._flops[i][o] for o in k) for i, k in kept)

    # ------------------------------------------------------------------ keys
    def op_keys(self, layer: int, option: int) -> tuple[str, ...]:
        """``state_dict`` keys (parameters and buffers) of one option; ``()`` if none."""
        self._check_option(layer, option)
        return self._op_keys[layer][option]

    def fixed_keys(self) -> tuple[str, ...]:
        """Keys of the non-searchable parts; with all ``op_keys`` they partition the state."""
        return self._fixed_keys

    def path_keys(self, arch: Sequence[int]) -> tuple[str, ...]:
        """Fixed keys plus the path's option keys, in ``state_dict`` order."""
        arch = self.validate_arch(arch)
        return tuple(k for k, o in self._key_owners if o is None or arch[o[0]] == o[1])

    def subspace_keys(self, subspace: Subspace) -> tuple[str, ...]:
        """Fixed keys plus the kept options' keys, in ``state_dict`` order."""
        kept = [set(opts) for opts in self.validate_subspace(subspace)]
        return tuple(k for k, o in self._key_owners if o is None or o[1] in kept[o[0]])

    # ------------------------------------------------------------- structure
    @property
    def spec(self) -> dict[str, int | float | str]:
        """Flat constructor arguments plus ``"name"``: ``build_space(**spec)`` rebuilds it.

        ``"name"`` is the registered name of a built-in space, else the class's import path
        (``"mypkg.space:MySpace"``), which a client imports itself."""
        return dict(self._spec)

    def fresh(self) -> SearchSpace:
        """A newly initialised space of the same structure (the current RNG's weights)."""
        return type(self)(**{k: v for k, v in self._spec.items() if k != "name"})

    def num_options(self) -> tuple[int, ...]:
        """Number of options per searchable layer."""
        return tuple(len(c.options) for c in self.choices)

    def option_names(self, arch: Sequence[int]) -> list[str]:
        """The option names of a path, one per layer."""
        arch = self.validate_arch(arch)
        return [c.options[o] for c, o in zip(self.choices, arch, strict=True)]

    def arch_from_names(self, names: Sequence[str]) -> tuple[int, ...]:
        """Inverse of :meth:`option_names`."""
        if len(names) != len(self.choices):
            raise ValueError(f"expected {len(self.choices)} option names, got {len(names)}")
        arch = []
        for layer, (choice, name) in enumerate(zip(self.choices, names, strict=True)):
            if name not in choice.options:
                raise ValueError(
                    f"layer {layer} ({choice.name!r}) has no option {name!r}; "
                    f"valid: {', '.join(choice.options)}"
                )
            arch.append(choice.options.index(name))
        return tuple(arch)

    def validate_arch(self, arch: Sequence[int]) -> tuple[int, ...]:
        """Return ``arch`` as a tuple of ints, or raise ``ValueError`` saying what is wrong."""
        values = tuple(arch)
        if len(values) != len(self.choices):
            raise ValueError(
                f"{self.name} architecture needs {len(self.choices)} option indices "
                f"(one per layer), got {len(values)}: {values}"
            )
        out = []
        for layer, (choice, value) in enumerate(zip(self.choices, values, strict=True)):
            out.append(self._option_index(layer, choice, value))
        return tuple(out)

    def validate_subspace(self, subspace: Sequence[Sequence[int]]) -> Subspace:
        """Return ``subspace`` normalised (sorted, unique) or raise ``ValueError``."""
        layers = tuple(subspace)
        if len(layers) != len(self.choices):
            raise ValueError(
                f"{self.name} subspace needs {len(self.choices)} layers, got {len(layers)}"
            )
        out = []
        for layer, (choice, options) in enumerate(zip(self.choices, layers, strict=True)):
            kept = sorted({self._option_index(layer, choice, o) for o in options})
            if not kept:
                raise ValueError(f"subspace keeps no option in layer {layer} ({choice.name!r})")
            out.append(tuple(kept))
        return tuple(out)

    def full_subspace(self) -> Subspace:
        """The subspace keeping every option."""
        return tuple(tuple(range(n)) for n in self.num_options())

    def subspace_mask(self, subspace: Subspace) -> list[int]:
        """Flat 0/1 list, layer-major, 1 for kept options (travels in a ConfigRecord)."""
        kept = self.validate_subspace(subspace)
        return [
            int(o in opts)
            for opts, n in zip(kept, self.num_options(), strict=True)
            for o in range(n)
        ]

    def subspace_from_mask(self, mask: Sequence[int]) -> Subspace:
        """Inverse of :meth:`subspace_mask`."""
        values = list(mask)
        expected = sum(self.num_options())
        if len(values) != expected:
            raise ValueError(f"subspace mask needs {expected} entries, got {len(values)}")
        if any(v not in (0, 1) for v in values):
            raise ValueError(f"subspace mask entries must be 0 or 1, got {sorted(set(values))}")
        offsets = np.cumsum([0, *self.num_options()])
        return self.validate_subspace(
            [
                [o for o in range(end - start) if values[start + o]]
                for start, end in zip(offsets[:-1], offsets[1:], strict=True)
            ]
        )

    # ------------------------------------------------------------- sampling
    def sample_path(
        self,
        rng: np.random.Generator,
        max_flops: float | None = None,
        subspace: Subspace | None = None,
    ) -> tuple[int, ...]:
        """A path whose FLOPs stay within ``max_flops``: greedy uniform sampling (paper Eq. 3).

        Layers are visited in a random permutation, those whose kept options all
        cost FLOPs first; each picks uniformly among its kept options that keep
        ``fixed + chosen so far + option + cheapest of the unvisited layers``
        within the budget.  O(L), never resamples, always valid.  Without
        ``max_flops`` every layer is uniform over its kept options.  Raises
        ``ValueError`` if even the cheapest path exceeds ``max_flops``.
        """
        kept = self.full_subspace() if subspace is None else self.validate_subspace(subspace)
        return _sampling.sample_path(rng, self._flops, self._fixed_cost.flops, kept, max_flops)

    def sample_subspace(
        self, rng: np.random.Generator, max_size: float, max_flops: float | None = None
    ) -> Subspace:
        """A subspace of at most ``max_size`` elements by uniform removal (paper Eq. 1).

        Starting from every option, repeatedly remove one option drawn uniformly
        among the removable ones until ``fixed_size`` plus the kept options'
        sizes fit ``max_size``.  Removable: parametric (non-parametric options
        are always kept), not the last of its layer, the subspace still has a
        path within ``max_flops`` (if given), and ``max_size`` stays reachable
        (so the removal never dead-ends).  Raises ``ValueError`` with the
        smallest reachable size when ``max_size`` cannot be met.
        """
        return _sampling.sample_subspace(
            rng,
            self._flops,
            self._sizes,
            self._fixed_cost.flops,
            self._fixed_size,
            max_size,
            max_flops,
        )

    def min_subspace_size(self, max_flops: float | None = None) -> int:
        """Smallest subspace size that keeps a path within ``max_flops`` (budget check)."""
        return _sampling.min_subspace_size(
            self._flops, self._sizes, self._fixed_cost.flops, self._fixed_size, max_flops
        )

    # --------------------------------------------------------------- running
    def forward(self, x: Tensor, arch: Sequence[int]) -> Tensor:
        """Run one path: logits ``(B, C)`` for images, ``(B, T, V)`` for sequences."""
        return self.net(x, self.validate_arch(arch))

    def subnet(self, arch: Sequence[int]) -> Subnet:
        """A standalone copy (not views) of the path's modules and weights."""
        arch = self.validate_arch(arch)
        # Seeding deepcopy's memo with the options off the path skips copying them.
        memo: dict[int, Any] = {}
        for layer, choice in enumerate(self.choices):
            mixed = self.net.get_submodule(choice.name)
            for option, key in enumerate(mixed.option_keys):
                if option != arch[layer]:
                    memo[id(mixed.ops[key])] = None
        net = copy.deepcopy(self.net, memo)
        for choice in self.choices:
            ops = net.get_submodule(choice.name).ops
            for key in [k for k, m in ops.items() if m is None]:
                del ops[key]
        return Subnet(net, arch, self._spec)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, layers={len(self.choices)}, options={self.num_options()}"

    # --------------------------------------------------------------- helpers
    def _kept(self, subspace: Subspace | None) -> list[tuple[int, tuple[int, ...]]]:
        kept = self.full_subspace() if subspace is None else self.validate_subspace(subspace)
        return list(enumerate(kept))

    def _check_option(self, layer: int, option: int) -> None:
        if not 0 <= operator.index(layer) < len(self.choices):
            raise ValueError(f"layer {layer} out of range 0..{len(self.choices) - 1}")
        self._option_index(layer, self.choices[layer], option)

    @staticmethod
    def _option_index(layer: int, choice: LayerChoice, value: Any) -> int:
        try:
            if isinstance(value, bool):
                raise TypeError
            index = operator.index(value)
        except TypeError:
            raise ValueError(
                f"layer {layer} ({choice.name!r}): option must be an int, got {value!r}"
            ) from None
        if not 0 <= index < len(choice.options):
            valid = ", ".join(f"{i}={n}" for i, n in enumerate(choice.options))
            raise ValueError(
                f"layer {layer} ({choice.name!r}): option {index} out of range "
                f"0..{len(choice.options) - 1} ({valid})"
            )
        return index


class SampledPaths(nn.Module):
    """The supernet as Stage 1 trains it, as one net: each forward runs a fresh path drawn
    uniformly from the whole space (``SearchSpace.sample_path`` without a budget) by
    ``rng``. A copy (``copy.deepcopy``, which copies ``rng``'s state) replays the same paths, so
    `training.probe_lr` tries every rate on the same sequence of paths (issue 40: Stage 1's
    lr probe, ``methods.fedoras.runner.probed_supernet_recipe``)."""

    def __init__(self, space: SearchSpace, rng: np.random.Generator) -> None:
        super().__init__()
        self.space = space
        self.rng = rng

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.space(x, self.space.sample_path(self.rng))


def positive_int(name: str, value: Any) -> int:
    """``value`` as an int >= 1, or ``ValueError`` naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def image_spec(
    num_classes: Any, in_channels: Any, input_height: Any, input_width: Any
) -> dict[str, int]:
    """The validated input description every image space's ``spec`` starts with."""
    return {
        "num_classes": positive_int("num_classes", num_classes),
        "in_channels": positive_int("in_channels", in_channels),
        "input_height": positive_int("input_height", input_height),
        "input_width": positive_int("input_width", input_width),
    }


def positive_float(name: str, value: Any) -> float:
    """``value`` as a finite float > 0, or ``ValueError`` naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        raise ValueError(f"{name} must be a number > 0, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")
    return float(value)


def _count_flops(module: nn.Module, *args: Any) -> int:
    from torch.utils.flop_counter import FlopCounterMode  # imports triton: only when measuring

    with FlopCounterMode(display=False) as counter:
        module(*args)
    return int(counter.get_total_flops())


def _num_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


SPACES: dict[str, type[SearchSpace]] = {}
"""Registered search spaces by name (filled by :func:`register_space`)."""


def register_space(cls: type[SearchSpace]) -> type[SearchSpace]:
    """Class decorator adding a search space to :data:`SPACES` under ``cls.name``.

    Only needed for a short name in run configs: any space importable by its module path
    is rebuilt by clients without registering (:func:`build_space`)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a non-empty class attribute 'name'")
    if SPACES.get(cls.name, cls) is not cls:
        raise ValueError(f"search space name {cls.name!r} is already taken by {SPACES[cls.name]}")
    SPACES[cls.name] = cls
    return cls


def space_name(cls: type[SearchSpace]) -> str:
    """The ``"name"`` in a space's ``spec``: its registered name, else its import path."""
    return cls.name if cls.name and SPACES.get(cls.name) is cls else class_path(cls)


def class_path(cls: type) -> str:
    """``"module:QualName"``, the path :func:`import_class` imports ``cls`` back from."""
    return f"{cls.__module__}:{cls.__qualname__}"


def import_object(path: str, what: str = "Class") -> Any:
    """The object at ``path`` (``"pkg.module:Name"``), imported as a client imports it.

    Raises ``ValueError`` naming the path and what went wrong: a malformed path, a module
    whose top-level package this process has not loaded (a path arrives in a message, so
    the sender cannot make a node import a package of its choosing), a module that does not
    import, a missing attribute, or one defined inside a function. ``what`` names the
    object in the message about a malformed path (``'pkg.module:<what>'``)."""
    module_name, sep, qualname = str(path).partition(":")
    if not sep or not module_name or not qualname:
        raise ValueError(f"{path!r} is not an import path of the form 'pkg.module:{what}'")
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(
            f"{path!r} is defined inside a function; clients can only import one defined "
            "at the top level of a module"
        )
    package = module_name.split(".")[0]
    if package not in sys.modules:
        # The path comes in a message: a client imports only from packages its process
        # already loaded (fedorasflwr, the app's own package), never a new one the sender names.
        raise ValueError(
            f"cannot import module {module_name!r} of {path!r}: its package {package!r} is "
            "not loaded by this process (import it in your ServerApp / ClientApp module)"
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import module {module_name!r} of {path!r}: {err}") from err
    for part in qualname.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"module {module_name!r} has no {qualname!r} (from {path!r})")
        obj = getattr(obj, part)
    return obj


def import_class(path: str, base: type) -> type:
    """The class at ``path`` (``"pkg.module:Class"``), checked to subclass ``base``.

    Raises ``ValueError`` naming the path and what went wrong (`import_object`'s reasons),
    or that it is not a ``base``."""
    obj = import_object(path)
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise ValueError(f"{path!r} is not a subclass of {base.__module__}.{base.__qualname__}")
    return obj


def importable_path(cls: type, base: type) -> str:
    """``class_path(cls)``, checked to import back to ``cls`` (a subclass of ``base``).

    Clients rebuild a model from its class's import path, so a class they cannot import
    fails there, one round in, on every node.  Raises ``ValueError`` naming the class and
    what to do: a class defined inside a function, or a path that does not import (see
    :func:`import_class`) or imports another class."""
    path = class_path(cls)
    if "<locals>" in cls.__qualname__:
        raise ValueError(
            f"{cls.__qualname__} is defined inside a function ({path!r}): clients rebuild it "
            "by importing that path; define the class at the top level of a module the "
            "ClientApp imports (e.g. a module of your app's package)"
        )
    if import_class(path, base) is not cls:
        raise ValueError(
            f"{path!r} imports another class than {cls.__qualname__}: clients could not "
            "rebuild it; give the class a name of its own at the top level of its module"
        )
    return path


def space_class(name: str) -> type[SearchSpace]:
    """The class a space's ``spec["name"]`` names: a registered name or an import path."""
    if name in SPACES:
        return SPACES[name]
    if ":" in name:
        return import_class(name, SearchSpace)
    raise ValueError(
        f"unknown search space {name!r}; valid: {', '.join(sorted(SPACES))}, or the import "
        "path of a SearchSpace subclass ('pkg.module:Class')"
    )


def build_space(name: str, **kwargs: Any) -> SearchSpace:
    """Build a search space from its ``spec``: ``build_space(**space.spec)``.

    ``name`` is a registered name (``build_space("cnn_l", num_classes=10)``) or an import
    path (``build_space("mypkg.space:MySpace", width=2)``)."""
    cls = space_class(name)
    valid = list(inspect.signature(cls).parameters)
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise ValueError(
            f"search space {name!r} got unknown argument(s) {unknown}; valid: {', '.join(valid)}"
        )
    return cls(**kwargs)


#: per process, one built space per spec: the template ``build_subnet`` copies paths from
_TEMPLATES: dict[str, SearchSpace] = {}
_MAX_TEMPLATES = 8


def build_subnet(spec: Mapping[str, Any], arch: Sequence[int]) -> Subnet:
    """``build_space(**spec).subnet(arch)`` without building the whole space each time.

    A client extracts a path from a freshly built supernet for every Stage-3 or test
    message, and building the supernet initialises every option of every layer, while the
    path needs one option per layer, copied. The space is built once per spec and process
    and kept as a template that is never changed: :meth:`SearchSpace.subnet` copies the
    path's modules, so the caller gets a standalone net with the template's initial
    weights, to be overwritten by a full ``load_state_dict`` (as every caller does).
    Building draws from torch's global RNG, which no client loop uses (they draw from
    seeded generators), so the cache changes no result."""
    key = repr(sorted(spec.items()))
    template = _TEMPLATES.get(key)
    if template is None:
        if len(_TEMPLATES) >= _MAX_TEMPLATES:
            _TEMPLATES.pop(next(iter(_TEMPLATES)))
        template = _TEMPLATES[key] = build_space(**spec)
    return template.subnet(arch)
