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
``width``      ``width_net(space, space.get("width", 1.0))``: the width         HeteroFL/FjORD
               baselines' fixed ConvNet (``space["name"]`` =                   ``checkpoint.pt``
               ``"widths-convnet"``)
=============  ==============================================================  ===============

Before any tensor is materialised, the file is read as it declares itself
(``artifacts.declared_checkpoint``: shapes, dtypes and storages, on the meta device) and
checked twice: every tensor's storage against the bytes the file holds for it, and every
``state_dict`` entry against the module its entries name, built on the meta device (same
keys, shapes and dtypes).  A file that claims more than it holds, or weights of another
architecture, is refused before a byte of it is allocated.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .artifacts import check_state, load_checkpoint
from .search_spaces import build_space
from .search_spaces.base import space_class
from .search_spaces.darts_style import build_derived_network
from .search_spaces.prunable import load_prunable, meta_prunable
from .search_spaces.widths import width_net

__all__ = ["BUILDER", "BUILDERS", "WIDTHS_NET", "builder_of", "load_model"]

#: the entry of a model file that names how its module is rebuilt
BUILDER = "builder"
SPACE, SUBNET, DERIVED, PRUNABLE, WIDTH = "space", "subnet", "derived", "prunable", "width"
#: what ``builder`` may be
BUILDERS = (SPACE, SUBNET, DERIVED, PRUNABLE, WIDTH)
#: ``space["name"]`` of the width baselines' fixed ConvNet (``search_spaces.widths``)
WIDTHS_NET = "widths-convnet"
#: the entry each builder needs besides ``space`` and ``state_dict``
NEEDS = {SUBNET: "arch", DERIVED: "genotype"}


def load_model(path: Path | str) -> nn.Module:
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
    materialised: a crafted file allocates nothing.  A space or model class
    of your own (an import path in ``space["name"]``) is imported only from a package this
    process has already loaded (``search_spaces.build_space``): import your package before
    the call; a file never makes the process load a package it names.

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
        meta = _rebuilt(builder, declared, where, meta=True)
        _check_fit(where, builder, declared["state_dict"], meta)

    content = load_checkpoint(path, expect=fits)
    builder = _builder_needs(content, where)
    model = _rebuilt(builder, content, where, meta=False)
    _check_fit(where, builder, content["state_dict"], model)
    model.load_state_dict(content["state_dict"], strict=True)
    return model.eval()


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


def _with_head(spec: dict[str, Any]) -> dict[str, Any]:
    """A ``cnn_s`` / ``cnn_l`` spec written before the head was a choice (fedorasflwr
    < 0.3.0) names no head: those nets averaged the last feature map (``head="gap"``)."""
    if spec.get("name") in ("cnn_s", "cnn_l") and "head" not in spec:
        return {**spec, "head": "gap"}
    return spec


def _build(builder: str, spec: dict[str, Any], content: Mapping[str, Any]) -> nn.Module:
    if builder == PRUNABLE:
        return load_prunable(spec, content["state_dict"])
    if builder == DERIVED:
        return build_derived_network(spec, str(content["genotype"]))
    if builder == WIDTH:
        image = {k: v for k, v in spec.items() if k not in ("name", "width")}
        return width_net(image, spec.get("width", 1.0))
    space = build_space(**_with_head(spec))
    if builder == SUBNET:
        return space.subnet([int(v) for v in content["arch"]])
    return space
