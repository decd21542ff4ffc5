"""What a run leaves behind: ``result.json``, checkpoints and plots, in one
directory per run under the configured output directory."""

from __future__ import annotations

import io
import json
import os
import struct
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord

from .arrays import state_dict_of
from .plots import plot_history, plot_points  # the plots live in plots.py; kept importable here
from .search_spaces.cnn import as_written

__all__ = [
    "check_state",
    "check_storages",
    "check_weights",
    "declared_checkpoint",
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
            "state_dict": state_dict_of(arrays),
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
    expect: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Read a checkpoint of ``save_checkpoint`` (``torch.load(weights_only=True)``: it runs
    no code of its own) and check it: a dict with ``space``, ``state_dict`` (named tensors,
    all finite) and ``stage``; with ``space``, of that space; with ``reference`` (e.g. the
    space's own ``state_dict()``), the same keys, shapes and dtypes.

    The file is first read as declared (``declared_checkpoint``: every tensor's shape,
    dtype and storage, no data): what it declares is checked against the bytes it holds,
    against ``reference`` and by ``expect`` before any tensor is materialised, so a file
    that claims more than it holds allocates nothing.

    Parameters
    ----------
    expect : callable, optional
        Called with the declared content (tensors on the meta device) once the checks
        above pass; raises ``ValueError`` for what it refuses (``model_files.load_model``:
        the shapes and dtypes of the architecture the file names).

    Raises
    ------
    ValueError
        Naming the file (and the run-config ``key`` it came from) and what is wrong.
    """
    where = f"checkpoint {str(path)!r}" if key is None else f"run config {key!r} = {str(path)!r}"
    raw = _read(path, where)
    declared = declared_checkpoint(raw, where)
    # a file of an earlier version names fewer of a space's choices: read with their values then
    if space is not None and as_written(declared["space"]) != dict(space):
        raise ValueError(
            f"{where}: holds weights of the space {declared['space']}, this run's is {dict(space)}"
        )
    if reference is not None:
        reason = check_state(declared["state_dict"], reference)
        if reason is not None:
            raise ValueError(f"{where}: its weights do not fit the space: {reason}")
    if expect is not None:
        expect(declared)
    content = _unpickle(raw, where, "cpu")
    _check_entries(where, content)
    check_weights(where, content["state_dict"])
    return content


def declared_checkpoint(raw: bytes, where: str = "checkpoint") -> dict[str, Any]:
    """A checkpoint file's content (``raw``: its bytes) as it declares it: its tensors on
    the meta device (shape, dtype, strides, no data), its other entries as they are;
    checked as ``load_checkpoint`` checks it (entries, and every tensor's storage against
    the file, ``check_storages``).

    Raises
    ------
    ValueError
        Starting with ``where``: not a ``torch.save`` file, an entry missing, or a tensor
        that claims more than the file holds for it.
    """
    declared = _unpickle(raw, where, "meta")
    _check_entries(where, declared)
    check_storages(where, declared, raw)
    return declared


def check_storages(where: str, content: Any, raw: bytes) -> None:
    """Raise a ``ValueError`` starting with ``where`` unless every tensor of ``content``
    (as ``torch.load(map_location="meta")`` declares it from the file ``raw``) views a
    storage of the file's own size: a ``data/<key>`` record of the ``torch.save`` zip of
    exactly the storage's bytes, and no more elements than that storage holds (a view that
    repeats elements, e.g. stride 0, is refused)."""
    records = _storage_records(raw, where)
    for name, tensor in _tensors(content):
        storage = tensor.untyped_storage()
        claimed = storage.nbytes()
        offset = getattr(storage, "_checkpoint_offset", None)
        held = records.get(offset) if isinstance(offset, int) else None
        declared = f"entry {name} (shape {tuple(tensor.shape)}, {tensor.dtype})"
        if held is None:
            raise ValueError(f"{where}: {declared}: its storage is no record of the file")
        if claimed != held:
            raise ValueError(
                f"{where}: {declared} needs a storage of {claimed} bytes, "
                f"the file holds {held} bytes for it"
            )
        if tensor.numel() * tensor.element_size() > claimed or any(s < 0 for s in tensor.stride()):
            raise ValueError(
                f"{where}: {declared} claims {tensor.numel()} elements (strides "
                f"{tensor.stride()}) over a storage of {claimed} bytes"
            )


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


def _read(path: Path | str, where: str) -> bytes:
    """The file's bytes, read once: both passes of ``load_checkpoint`` see the same file."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise ValueError(f"{where}: cannot load it, no such file") from exc
    except OSError as exc:
        raise ValueError(f"{where}: cannot read it ({type(exc).__name__}: {exc})") from exc
    if not raw:
        raise ValueError(f"{where}: cannot load it, empty")
    return raw


def _unpickle(raw: bytes, where: str, location: str) -> Any:
    try:
        return torch.load(io.BytesIO(raw), map_location=location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a corrupt file makes the unpickler raise anything
        raise ValueError(
            f"{where}: cannot load it, not a loadable checkpoint ({type(exc).__name__}: {exc})"
        ) from exc


def _check_entries(where: str, content: Any) -> None:
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


def _storage_records(raw: bytes, where: str) -> dict[int, int]:
    """Where each ``data/<key>`` record's bytes start in the zip -> how many there are."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(raw))
        entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ValueError(
            f"{where}: cannot load it, not a torch.save zip archive ({type(exc).__name__}: {exc})"
        ) from exc
    records = {}
    for entry in entries:
        _root, _, inside = entry.filename.partition("/")
        if not inside.startswith("data/") or entry.compress_type:
            continue
        header = raw[entry.header_offset : entry.header_offset + _LOCAL_HEADER]
        if len(header) < _LOCAL_HEADER:
            continue
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        records[entry.header_offset + _LOCAL_HEADER + name_length + extra_length] = entry.file_size
    return records


#: the fixed part of a zip local file header (then its name and extra field, then data)
_LOCAL_HEADER = 30


def _tensors(content: Any) -> list[tuple[str, torch.Tensor]]:
    """Every tensor in ``content`` (dicts, lists, tuples), named by its path of entries."""
    found, stack = [], [("", content)]
    while stack:
        name, value = stack.pop()
        if isinstance(value, torch.Tensor):
            found.append((name or "(the whole file)", value))
        elif isinstance(value, Mapping):
            stack.extend((f"{name}[{k!r}]" if name else str(k), v) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((f"{name}[{i}]", v) for i, v in enumerate(value))
    return found[::-1]
