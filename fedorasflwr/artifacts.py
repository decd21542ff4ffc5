"""What a run leaves behind: ``result.json``, checkpoints and plots, in one
directory per run under the configured output directory."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord

from .plots import plot_history, plot_points  # the plots live in plots.py; kept importable here

__all__ = [
    "check_state",
    "check_weights",
    "load_checkpoint",
    "plain",
    "plot_history",
    "plot_points",
    "run_directory",
    "save_checkpoint",
    "write_json",
]


def run_directory(base: Path, method: str, run_id: int) -> Path:
    """Create ``<base>/<method>-<UTC time>-run<id>`` and return it."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path = Path(base) / f"{method}-{stamp}-run{run_id}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def plain(value: Any) -> Any:
    """``value`` as plain Python: dataclasses and mappings as dicts, tuples as lists,
    numpy scalars as numbers, paths as strings (tensors and other values as they are).
    A dataclass field whose metadata says ``document=False`` is left out."""
    if is_dataclass(value) and not isinstance(value, type):
        hidden = [f.name for f in fields(value) if f.metadata.get("document", True) is False]
        if not hidden:
            return plain(asdict(value))
        return {
            f.name: plain(getattr(value, f.name)) for f in fields(value) if f.name not in hidden
        }
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return value


def write_json(path: Path, content: Any) -> Path:
    """Write ``content`` (dataclasses, numpy scalars and tuples allowed) as indented JSON,
    atomically: a reader sees the previous file or the new one, never half of one."""
    text = json.dumps(plain(content), indent=2, allow_nan=False)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
    return path


def save_checkpoint(
    path: Path, *, space_spec: Mapping[str, Any], arrays: ArrayRecord, stage: str, **extra: Any
) -> Path:
    """Save a ``state_dict`` with what rebuilds its module (``build_space(**space_spec)``)
    and the ``stage`` that produced it."""
    torch.save(
        {
            "space": dict(space_spec),
            "state_dict": arrays.to_torch_state_dict(),
            "stage": stage,
            **plain(extra),
        },
        path,
    )
    return path


REQUIRED_ENTRIES = ("space", "state_dict", "stage")


def load_checkpoint(
    path: Path | str,
    *,
    reference: Mapping[str, torch.Tensor] | None = None,
    space: Mapping[str, Any] | None = None,
    key: str | None = None,
) -> dict[str, Any]:
    """Read a checkpoint of ``save_checkpoint`` (``torch.load(weights_only=True)``) and
    check it: a dict with ``space``, ``state_dict`` (named tensors, all finite) and
    ``stage``; with ``space``, of that space; with ``reference`` (e.g. the space's own
    ``state_dict()``), the same keys, shapes and dtypes.

    Raises
    ------
    ValueError
        Naming the file (and the run-config ``key`` it came from) and what is wrong.
    """
    where = f"checkpoint {str(path)!r}" if key is None else f"run config {key!r} = {str(path)!r}"
    try:
        content = torch.load(Path(path), map_location="cpu", weights_only=True)
    except FileNotFoundError as exc:
        raise ValueError(f"{where}: cannot load it, no such file") from exc
    except Exception as exc:  # noqa: BLE001 - a corrupt file makes the unpickler raise anything
        kind = "empty" if _is_empty(path) else "not a loadable checkpoint"
        raise ValueError(f"{where}: cannot load it, {kind} ({type(exc).__name__}: {exc})") from exc
    if not isinstance(content, dict):
        raise ValueError(f"{where}: holds a {type(content).__name__}, not a dict of entries")
    missing = [name for name in REQUIRED_ENTRIES if name not in content]
    if missing:
        raise ValueError(f"{where}: lacks the entries {missing} (has {sorted(map(str, content))})")
    state = content["state_dict"]
    if not isinstance(content["space"], dict) or not isinstance(content["stage"], str):
        raise ValueError(f"{where}: 'space' must be a dict and 'stage' a string")
    if (
        not isinstance(state, dict)
        or not state
        or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())
    ):
        raise ValueError(f"{where}: 'state_dict' is not a non-empty dict of named tensors")
    check_weights(where, state)
    if space is not None and dict(content["space"]) != dict(space):
        raise ValueError(
            f"{where}: holds weights of the space {content['space']}, this run's is {dict(space)}"
        )
    if reference is not None:
        check_weights(where, state, reference)
    return content


def check_weights(
    where: str,
    state: Mapping[str, torch.Tensor],
    reference: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """Raise a ``ValueError`` starting with ``where`` if ``state`` holds a non-finite
    weight or (given ``reference``) does not fit it (``check_state``)."""
    broken = [k for k, v in state.items() if v.is_floating_point() and not v.isfinite().all()]
    if broken:
        raise ValueError(f"{where}: non-finite (NaN or inf) weights in {_few(broken)}")
    if reference is not None:
        reason = check_state(state, reference)
        if reason is not None:
            raise ValueError(f"{where}: its weights do not fit the space: {reason}")


def check_state(
    state: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]
) -> str | None:
    """What keeps ``state`` from loading where ``reference`` is (missing or unexpected
    keys, shapes, dtypes), or ``None``."""
    missing, extra = set(reference) - set(state), set(state) - set(reference)
    if missing or extra:
        return f"missing keys {_few(missing)}, unexpected keys {_few(extra)}"
    for name, tensor in state.items():
        expected = reference[name]
        if tensor.shape != expected.shape:
            return f"{name!r} has shape {tuple(tensor.shape)}, expected {tuple(expected.shape)}"
        if tensor.dtype != expected.dtype:
            return f"{name!r} is {tensor.dtype}, expected {expected.dtype}"
    return None


def _few(names: Any) -> str:
    names = sorted(names)
    return str(names[:3])[:-1] + (f", ... {len(names)} in all]" if len(names) > 3 else "]")


def _is_empty(path: Path | str) -> bool:
    try:
        return Path(path).stat().st_size == 0
    except OSError:
        return False
