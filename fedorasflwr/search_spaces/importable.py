"""The check every strategy makes at construction: can the clients rebuild the model?

A client never receives a model's code, only its ``spec``: a built-in's short name or the
import path of its class (``"pkg.module:Class"``) and the constructor's arguments.  A class
defined inside a function, or one whose path does not import back to it, would fail on
every client in the first round; :func:`require_importable` refuses it on the server,
before any message is sent.
"""

from __future__ import annotations

from logging import WARNING
from typing import Any

from flwr.supercore import log
from torch import nn

from .base import SPACES, SearchSpace, class_path, importable_path
from .prunable import PrunableNet
from .prunable_nets import PRUNABLE_NETS

__all__ = ["require_importable"]


def require_importable(model: Any, method: str) -> None:
    """Raise ``ValueError`` naming the class and what to do when ``method``'s clients
    could not rebuild ``model`` (a ``SearchSpace`` or a ``PrunableNet``) from its
    ``spec["name"]``; warn when the class lives in the script being run (``__main__``),
    which only clients in the server's own process (``InProcessGrid``) can import."""
    if isinstance(model, PrunableNet):
        cls, name, builtins, base = type(model.model), model.name, PRUNABLE_NETS, nn.Module
    elif isinstance(model, SearchSpace):
        cls, name, builtins, base = type(model), str(model.spec["name"]), SPACES, SearchSpace
    else:
        raise ValueError(
            f"{method} needs a SearchSpace or a PrunableNet, got {type(model).__name__}"
        )
    if builtins.get(name) is cls:
        return
    try:
        path = importable_path(cls, base)
    except ValueError as err:
        raise ValueError(f"{method}: the clients cannot import {class_path(cls)}: {err}") from err
    if path != name:
        raise ValueError(
            f"{method}: spec['name'] = {name!r} does not name the model's class {path!r}: "
            "the clients would build another model; leave 'name' to the base class"
        )
    if cls.__module__ == "__main__":
        log(
            WARNING,
            "%s: %s is defined in the script being run (__main__): only clients in this "
            "process can import it; move it to a module of your app for any other engine",
            method,
            path,
        )
