"""What a prunable net's ``spec`` holds and how it is checked: the model class (a built-in's
short name or an import path), its keyword arguments (values a ``ConfigRecord`` can carry)
and one sample's input shape."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from torch import nn

from .base import import_class, importable_path, positive_int
from .prunable_nets import PRUNABLE_NETS

__all__ = ["frozen", "input_shape", "model_class", "model_kwargs"]


def model_class(name: str | type[nn.Module]) -> tuple[str, type[nn.Module]]:
    """The spec name and the class: a built-in's short name, else the import path."""
    if isinstance(name, type):
        if not issubclass(name, nn.Module):
            raise ValueError(f"{name!r} is not an nn.Module subclass")
        short = next((key for key, cls in PRUNABLE_NETS.items() if cls is name), None)
        if short is not None:
            return short, name
        return importable_path(name, nn.Module), name
    if not isinstance(name, str):
        raise ValueError(
            f"build_prunable takes the model's class and its arguments, got {name!r}: "
            "clients build the model themselves from them"
        )
    if name in PRUNABLE_NETS:
        return name, PRUNABLE_NETS[name]
    if ":" in name:
        return name, import_class(name, nn.Module)
    raise ValueError(
        f"unknown prunable net {name!r}; valid: {', '.join(PRUNABLE_NETS)}, or the import "
        "path of an nn.Module class ('pkg.module:Class')"
    )


def model_kwargs(name: str, cls: type[nn.Module], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` checked against ``cls``'s signature, as ConfigRecord values."""
    parameters = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    unknown = sorted(set(kwargs) - set(parameters))
    if unknown and not takes_any:
        raise ValueError(
            f"prunable net {name!r} got unknown argument(s) {unknown}; "
            f"valid: {', '.join(parameters)}"
        )
    return {key: _config_value(name, key, value) for key, value in kwargs.items()}


def _config_value(name: str, key: str, value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool | int | float | str | bytes):
        return value
    if isinstance(value, list | tuple):
        items = [v.item() if isinstance(v, np.generic) else v for v in value]
        kinds = {type(v) for v in items}
        if len(kinds) <= 1 and kinds <= {bool, int, float, str, bytes}:
            return items
    raise ValueError(
        f"prunable net {name!r}: argument {key!r} = {value!r} cannot travel to clients "
        "(a number, string, bytes or a list of one of those)"
    )


def input_shape(input_shape: Sequence[int] | None, kwargs: Mapping[str, Any]) -> tuple[int, ...]:
    image = [kwargs.get(k) for k in ("in_channels", "input_height", "input_width")]
    implied = tuple(image) if all(v is not None for v in image) else None
    if input_shape is None:
        if implied is None:
            raise ValueError(
                "input_shape (one sample's shape, e.g. (3, 32, 32)) is needed unless the "
                "model takes in_channels, input_height and input_width"
            )
        input_shape = implied
    if isinstance(input_shape, str | bytes) or not isinstance(input_shape, Sequence):
        raise ValueError(f"input_shape must be a sequence of integers, got {input_shape!r}")
    shape = tuple(positive_int("input_shape", d) for d in input_shape)
    if not shape or (implied is not None and shape != implied):
        raise ValueError(f"input_shape {list(shape)} does not match the image arguments {implied}")
    return shape


def frozen(value: Any) -> Any:
    """A hashable memo key of a spec or of its arguments (lists become tuples)."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(frozen(v) for v in value)
    return value
