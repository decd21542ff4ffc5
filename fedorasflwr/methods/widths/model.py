"""A width-scalable model of the user's own for HeteroFL / FjORD: the factory travels by
its import path, as DecNAS's model classes do.

A client never receives code, only a message: the strategy sends the factory's path
(``"pkg.module:make_net"``, message key ``model-fn``) and each client imports it back
(:func:`import_factory`) from a package its process has already loaded, then builds
``model_fn(width)`` at its tier's width.  :func:`factory_path` refuses, on the server and
before any message, a factory the clients could not import.
"""

from __future__ import annotations

from collections.abc import Mapping
from logging import WARNING
from typing import Any

import torch
from flwr.supercore import log

from ...search_spaces.base import import_object
from ...search_spaces.widths import ModelFn

__all__ = ["MODEL_FN", "factory_path", "import_factory", "input_of_profiles"]

#: the message config key naming the factory's import path (absent: the built-in ConvNet)
MODEL_FN = "model-fn"

#: the dtype a profile's ``sample-dtype`` kind stands for when the model's input is derived
KIND_DTYPES = {
    "float": torch.float32,
    "int": torch.long,
    "bool": torch.bool,
    "complex": torch.complex64,
}


def factory_path(model_fn: Any, method: str) -> str:
    """``"module:qualname"`` of ``model_fn``, checked to import back to it.

    Raises ``ValueError`` naming the factory and what to do when the clients could not
    import it: not callable, a lambda, a function or class defined inside a function, a
    ``functools.partial`` or another object without a name of its own, or a path that
    imports something else.  A factory of the script being run (``__main__``) is only
    warned about: clients in the server's own process (``InProcessGrid``) can import it."""
    if not callable(model_fn):
        raise ValueError(
            f"{method}: model_fn must be a callable model_fn(width) -> nn.Module, got "
            f"{type(model_fn).__name__}"
        )
    module = getattr(model_fn, "__module__", None)
    qualname = getattr(model_fn, "__qualname__", None)
    hint = (
        "define model_fn as a function (or class) at the top level of a module the "
        "ClientApp imports (e.g. a module of your app's package): the clients import it "
        "back by its path"
    )
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise ValueError(f"{method}: model_fn {model_fn!r} has no import path; {hint}")
    path = f"{module}:{qualname}"
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(
            f"{method}: model_fn {path!r} is a lambda or defined inside a function; {hint}"
        )
    try:
        found = import_factory(path)
    except ValueError as err:
        raise ValueError(f"{method}: the clients cannot import model_fn {path!r}: {err}") from err
    if found is not model_fn:
        raise ValueError(f"{method}: {path!r} imports another object than model_fn; {hint}")
    if module == "__main__":
        log(
            WARNING,
            "%s: model_fn %s is defined in the script being run (__main__): only clients in "
            "this process can import it; move it to a module of your app for any other engine",
            method,
            path,
        )
    return path


def import_factory(path: str) -> ModelFn:
    """The callable at ``path`` (``"pkg.module:make_net"``), imported as a client does.

    Raises ``ValueError`` naming the path and what went wrong: a malformed path, a module
    whose top-level package this process has not loaded (the path arrives in a message,
    so the sender cannot make a node import a package of its choosing), a module that does
    not import, a missing attribute, one defined inside a function, or one not callable."""
    obj = import_object(path, "make_net")
    if not callable(obj):
        raise ValueError(f"{path!r} is a {type(obj).__name__}, not a callable model_fn(width)")
    return obj


def input_of_profiles(
    profiles: Mapping[int, Any], method: str
) -> tuple[tuple[int, ...], torch.dtype]:
    """One sample's shape and dtype, as the profiled nodes declare them (``sample-shape``,
    ``sample-dtype``): what the costs of a model given without ``input_shape`` are
    measured on.  Raises ``ValueError`` when no node declares them, or when nodes declare
    different ones (naming the partitions), asking for ``input_shape``."""
    declared: dict[tuple[tuple[int, ...], str], list[int]] = {}
    for profile in profiles.values():
        if profile.sample_shape is not None and profile.sample_dtype:
            key = (tuple(profile.sample_shape), profile.sample_dtype)
            declared.setdefault(key, []).append(profile.partition_id)
    if not declared:
        raise ValueError(
            f"{method}: no node declares its sample-shape / sample-dtype, so the model's "
            "input for its FLOP count is unknown; give input_shape=(...) (one sample, no "
            "batch dimension) to the strategy"
        )
    if len(declared) > 1:
        seen = "; ".join(
            f"{list(shape)} {kind} (partitions {sorted(ids)})"
            for (shape, kind), ids in sorted(declared.items())
        )
        raise ValueError(
            f"{method}: the nodes declare different samples: {seen}; give input_shape=(...) "
            "to the strategy (nodes declaring another shape are then refused at profiling)"
        )
    ((shape, kind),) = declared
    return shape, KIND_DTYPES[kind]
