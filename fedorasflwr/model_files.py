"""Model files read back: ``load_model(path)`` rebuilds any ``.pt`` file a run writes.

Every model file is an ``artifacts.save_checkpoint`` dict (``space``: what rebuilds the
module, ``state_dict``, ``stage``, and entries of its own); ``checkpoint.pt`` and FedorAS's
``supernet.pt`` are ``checkpoints.Checkpointer`` dicts of the same entries.  Its
``builder`` entry says how the module is rebuilt from ``space`` (a file written before
the entry existed is read by the same rules from what it holds):

=============  ==============================================================  ===============
``builder``    rebuilt as                                                      files
=============  ==============================================================  ===============
``space``      ``build_space(**space)``: the whole supernet                    ``supernet.pt``,
                                                                               ``checkpoint.pt``
``subnet``     ``build_space(**space).subnet(arch)``: one path, standalone     FedorAS
                                                                               ``tier-<k>*.pt``,
                                                                               FDNAS ``<net>.pt``
``derived``    ``build_derived_network(space, genotype)``: a DARTS genotype    DP-FNAS
                                                                               ``derived.pt``
``prunable``   ``load_prunable(space, state_dict)``: a pruned conv/linear net  DecNAS
                                                                               ``gm-<t>*.pt``,
                                                                               HeteroFL/FjORD
                                                                               ``tier-<t>.pt``
``width``      ``width_net(space, space.get("width", 1.0), space.get("head",   HeteroFL/FjORD
               "flatten"))``: the width baselines' fixed ConvNet               ``checkpoint.pt``
               (``space["name"]`` = ``"widths-convnet"``)
=============  ==============================================================  ===============

Before any tensor is materialised, the file is read as it declares itself
(``artifacts.declared_checkpoint``: shapes, dtypes and storages, on the meta device) and
checked twice: every tensor's storage against the bytes the file holds for it, and every
``state_dict`` entry against the module its entries name, built on the meta device (same
keys, shapes and dtypes).  A file that claims more than it holds, or weights of another
architecture, is refused before a byte of it is allocated.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord
from torch import nn

from .artifacts import check_state, load_checkpoint, save_checkpoint
from .search_spaces import build_space
from .search_spaces.base import SearchSpace, Subnet, space_class
from .search_spaces.cnn import as_written
from .search_spaces.darts_style import build_derived_network
from .search_spaces.prunable import PrunableNet, load_prunable, meta_prunable
from .search_spaces.widths import width_net

__all__ = ["BUILDER", "BUILDERS", "WIDTHS_NET", "builder_of", "load_model", "save_model"]

#: the entry of a model file that names how its module is rebuilt
BUILDER = "builder"
SPACE, SUBNET, DERIVED, PRUNABLE, WIDTH = "space", "subnet", "derived", "prunable", "width"
#: what ``builder`` may be
BUILDERS = (SPACE, SUBNET, DERIVED, PRUNABLE, WIDTH)
#: ``space["name"]`` of the width baselines' fixed ConvNet (``search_spaces.widths``)
WIDTHS_NET = "widths-convnet"
#: the entry each builder needs besides ``space`` and ``state_dict``
NEEDS = {SUBNET: "arch", DERIVED: "genotype"}


def save_model(
    path: Path | str,
    module: nn.Module,
    *,
    space: SearchSpace | Mapping[str, Any] | None = None,
    genotype: Any = None,
    stage: str = "final",
    **extra: Any,
) -> Path:
    """Write ``module`` as a model file `load_model` reads back into the same module.

    What ``module`` may be, and the file's ``builder``:

    - a search space (``SearchSpace``, e.g. FedorAS's supernet): ``"space"``;
    - one path of it, ``space.subnet(arch)`` (``Subnet``): ``"subnet"``, with its ``arch``;
    - a pruned conv/linear net (``PrunableNet``, DecNAS's ``GM_t``; ``build_prunable`` wraps
      any model of yours): ``"prunable"``;
    - a derived DARTS network (``space.derived_network(genotype)``): ``"derived"``; pass its
      ``space`` (the space or its ``spec``) and ``genotype`` (``space.genotype()`` or its
      ``to_text()``), which the network does not carry.

    Before anything is written the module is rebuilt from what the file will hold, on the
    meta device (no weights), and its ``state_dict`` checked against it: a module whose
    class ``load_model`` could not import (defined inside a function, a path that imports
    another class) or whose weights the rebuilt module would not take is refused here, not
    when the file is read. The file is written atomically (a reader sees the previous file
    or the new one). ``stage`` and ``extra`` (plain values: numbers, strings, lists) are kept
    in the file for you.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    TypeError
        ``module`` is none of the kinds above.
    ValueError
        The module cannot be rebuilt from the file (naming why).
    """
    path = Path(path)
    entries: dict[str, Any] = {}
    if isinstance(module, SearchSpace):
        builder, spec = SPACE, module.spec
    elif isinstance(module, Subnet):
        builder, spec = SUBNET, module.spec
        entries["arch"] = [int(v) for v in module.arch]
    elif isinstance(module, PrunableNet):
        builder, spec = PRUNABLE, module.spec
    elif genotype is not None and space is not None:
        builder = DERIVED
        spec = space.spec if isinstance(space, SearchSpace) else dict(space)
        to_text = getattr(genotype, "to_text", None)  # a Genotype, or its text
        entries["genotype"] = str(to_text() if callable(to_text) else genotype)
    else:
        raise TypeError(
            f"save_model: a {type(module).__module__}.{type(module).__qualname__} is not a "
            "module load_model rebuilds; pass a SearchSpace, one of its subnet(arch), a "
            "PrunableNet (build_prunable(model, input_shape) wraps a conv/linear model of "
            "yours) or a derived DARTS network with space= and genotype="
        )
    if genotype is not None and builder != DERIVED:
        raise ValueError(f"save_model: genotype= is for a derived DARTS network, not a {builder}")
    clash = sorted(set(extra) & {"space", "state_dict", "stage", BUILDER, *entries})
    if clash:
        raise ValueError(f"save_model: {clash} are entries save_model writes itself")
    where = f"save_model {str(path)!r}"
    state = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    content = {"space": dict(spec), "state_dict": state, BUILDER: builder, **entries}
    _check_fit(where, builder, state, _rebuilt(builder, content, where, meta=True))
    temporary = path.with_name(f".{path.name}.tmp")
    save_checkpoint(
        temporary,
        space_spec=spec,
        arrays=ArrayRecord(state),
        stage=stage,
        **{BUILDER: builder},
        **entries,
        **extra,
    )
    os.replace(temporary, path)
    return path


def load_model(path: Path | str, *, import_packages: bool = True) -> nn.Module:
    """The module a model file of this package holds, its weights loaded, on the CPU, in
    eval mode: ``load_model("outputs/.../tier-1.pt")(batch)`` gives the logits.

    Reads any ``.pt`` a run writes: FedorAS ``tier-<k>.pt`` / ``tier-<k>-random-init.pt``
    and ``supernet.pt``; FDNAS / CFDNAS ``fdnas.pt``, ``cluster-<tag>.pt`` and
    ``supernet.pt``; DP-FNAS / FedNAS ``derived.pt`` and ``supernet.pt``; DecNAS ``gm-<t>.pt``
    and ``gm-<t>-tuned.pt``; HeteroFL / FjORD ``tier-<t>.pt`` (a prunable ConvNet at the
    tier's width; files of runs before these names, ``gm<t>*.pt`` and ``tier<t>.pt``,
    too); every method's ``checkpoint.pt`` (HeteroFL / FjORD's: the full-width
    ConvNet of ``search_spaces.widths.width_net``).  A supernet comes back as its
    search space: FedorAS's and FDNAS's run one path, ``model(batch, arch)``; DP-FNAS's
    the mixed DARTS network, ``model(batch)``.  The file is read with
    ``torch.load(weights_only=True)``: it runs no code of its own; and what it declares
    (every tensor's shape, dtype and storage) is checked against the bytes it holds and
    against the module it names, built on the meta device, before any tensor is
    materialised: a crafted file allocates nothing.  A file of your own model
    (`save_model`) names its class by import path (``"pkg.module:Class"`` in
    ``space["name"]``): with ``import_packages`` (the default) its top-level package is
    imported when it is importable here (installed, or on ``sys.path``) and not loaded yet;
    with ``import_packages=False`` only packages this process has already imported are
    used (``search_spaces.build_space``), so a file never makes the process import a
    package it names.

    Raises
    ------
    ValueError
        Naming the file and what is wrong: missing, empty or corrupt, not a model file of
        this package (an ONNX file, a data cache, a dict without ``space``,
        ``state_dict`` and ``stage``), an unknown ``builder``, an entry it needs missing,
        a tensor that claims more than the file holds for it, or weights (an entry's name,
        shape or dtype) that do not fit the module they describe.
    """
    path = Path(path)
    where = f"model file {str(path)!r}"
    if path.suffix == ".onnx":
        raise ValueError(
            f"{where}: an ONNX file; run it with onnxruntime "
            "(onnxruntime.InferenceSession(path)), load_model reads the .pt beside it"
        )

    def fits(declared: dict[str, Any]) -> None:
        builder = _builder_needs(declared, where)
        if import_packages:
            _import_package_of(declared["space"], where)
        meta = _rebuilt(builder, declared, where, meta=True)
        _check_fit(where, builder, declared["state_dict"], meta)

    content = load_checkpoint(path, expect=fits)
    builder = _builder_needs(content, where)
    model = _rebuilt(builder, content, where, meta=False)
    _check_fit(where, builder, content["state_dict"], model)
    model.load_state_dict(content["state_dict"], strict=True)
    return model.eval()


def _import_package_of(spec: Mapping[str, Any], where: str) -> None:
    """Import the top-level package of the import path in ``spec["name"]`` (a class of the
    user's own, ``"pkg.module:Class"``) when it is importable and not loaded yet, so
    ``search_spaces.base.import_class`` may import its module."""
    name = spec.get("name") if isinstance(spec, Mapping) else None
    if not isinstance(name, str) or ":" not in name:
        return
    package = name.partition(":")[0].split(".")[0]
    if not package.isidentifier() or package in sys.modules:
        return
    if importlib.util.find_spec(package) is None:
        raise ValueError(
            f"{where}: its model class {name!r} is in package {package!r}, which is not "
            "importable here: install it, or put its directory on sys.path"
        )
    try:
        importlib.import_module(package)
    except Exception as error:  # the package's own import failed: say so, and where
        raise ValueError(
            f"{where}: importing {package!r} (the package of its model class {name!r}) "
            f"failed: {type(error).__name__}: {error}"
        ) from error


def builder_of(content: Mapping[str, Any], where: str = "model file") -> str:
    """How a model file's module is rebuilt: its ``builder`` entry, or for a file without
    one (written before it existed, and ``checkpoint.pt``) what its entries imply: an
    ``arch`` makes a subnet, a final-stage ``genotype`` a derived DARTS network,
    ``space["name"]`` = ``WIDTHS_NET`` the width baselines' ConvNet, another that is no
    search space a prunable net, anything else the space."""
    if BUILDER in content:
        builder = content[BUILDER]
        if builder not in BUILDERS:
            raise ValueError(
                f"{where}: {BUILDER!r} = {builder!r} is not a kind this version rebuilds; "
                f"allowed: {', '.join(BUILDERS)}"
            )
        return str(builder)
    if "arch" in content:
        return SUBNET
    if "genotype" in content and content.get("stage") == "final":
        return DERIVED
    if content["space"].get("name") == WIDTHS_NET:
        return WIDTH
    try:
        space_class(str(content["space"].get("name", "")))
    except ValueError:
        return PRUNABLE
    return SPACE


def _builder_needs(content: Mapping[str, Any], where: str) -> str:
    """``builder_of(content)``, the entry it needs checked present."""
    builder = builder_of(content, where)
    needed = NEEDS.get(builder)
    if needed is not None and needed not in content:
        raise ValueError(
            f"{where}: a {builder!r} file without the entry {needed!r} that rebuilds it "
            f"(has {sorted(map(str, content))})"
        )
    return builder


def _rebuilt(builder: str, content: Mapping[str, Any], where: str, *, meta: bool) -> nn.Module:
    """The module ``content`` describes: on the meta device (shapes and dtypes, no storage:
    what the file must declare), else on the CPU (a prunable net holding the weights)."""
    spec = dict(content["space"])
    # building initialises weights: the caller's random streams are left as they were
    with torch.random.fork_rng(devices=[]):
        try:
            if not meta:
                return _build(builder, spec, content)
            if builder == PRUNABLE:
                return meta_prunable(spec)
            with torch.device("meta"):
                return _build(builder, spec, content)
        except RuntimeError as exc:  # load_prunable's strict load
            raise ValueError(
                f"{where}: its weights do not fit its {builder!r} module: {exc}"
            ) from exc
        except (ValueError, TypeError, ImportError, AttributeError, KeyError) as exc:
            raise ValueError(
                f"{where}: cannot rebuild its {builder!r} module from space {spec}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc


def _check_fit(where: str, builder: str, state: Mapping[str, Any], model: nn.Module) -> None:
    reason = check_state(state, model.state_dict())
    if reason is not None:
        raise ValueError(f"{where}: its weights do not fit its {builder!r} module: {reason}")


def _build(builder: str, spec: dict[str, Any], content: Mapping[str, Any]) -> nn.Module:
    if builder == PRUNABLE:
        return load_prunable(spec, content["state_dict"])
    if builder == DERIVED:
        return build_derived_network(as_written(spec), str(content["genotype"]))
    if builder == WIDTH:
        image = {k: v for k, v in spec.items() if k not in ("name", "width", "head")}
        return width_net(image, spec.get("width", 1.0), spec.get("head", "flatten"))
    space = build_space(**as_written(spec))
    if builder == SUBNET:
        return space.subnet([int(v) for v in content["arch"]])
    return space
