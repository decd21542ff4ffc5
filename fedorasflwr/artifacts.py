"""What a run leaves behind: ``result.json``, checkpoints and plots, in one
directory per run under the configured output directory."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord

__all__ = [
    "load_checkpoint",
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


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return _plain(asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return value


def write_json(path: Path, content: Any) -> Path:
    """Write ``content`` (dataclasses, numpy scalars and tuples allowed) as indented JSON."""
    path.write_text(json.dumps(_plain(content), indent=2, allow_nan=False))
    return path


def save_checkpoint(
    path: Path, *, space_spec: Mapping[str, Any], arrays: ArrayRecord, **extra: Any
) -> Path:
    """Save a ``state_dict`` with what rebuilds its module (``build_space(**space_spec)``)."""
    torch.save(
        {"space": dict(space_spec), "state_dict": arrays.to_torch_state_dict(), **_plain(extra)},
        path,
    )
    return path


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Inverse of ``save_checkpoint``."""
    return torch.load(path, map_location="cpu", weights_only=True)


def plot_history(
    path: Path, history: Sequence[Mapping[str, Any]], key: str, *, title: str, ylabel: str
) -> Path | None:
    """Line plot of ``key`` over rounds; ``None`` if no round has it."""
    points = [(h["round"], h[key]) for h in history if key in h]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(*zip(*points, strict=True), marker="o")
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_points(
    path: Path,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
) -> Path | None:
    """One marked line per named series of ``(x, y)`` points (e.g. accuracy against MACs);
    ``None`` if no series has a point."""
    series = {name: sorted(points) for name, points in series.items() if points}
    if not series:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, points in series.items():
        ax.plot(*zip(*points, strict=True), marker="o", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
