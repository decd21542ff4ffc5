"""What every method's runner shares: run config -> search space, aggregation, checkpoints.

A *runner* (``methods/<method>/runner.py``) turns the parsed run config into the method's
space and strategy, calls ``strategy.start`` and writes the run's artifacts; the ServerApp
(``server_app.py``) only picks the runner of run config ``method``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flwr.serverapp import Grid

from .checkpoints import Checkpointer, Resume, read_resume
from .config import RunSettings, space_kwargs
from .data import dataset_info
from .federation.aggregation import Aggregation
from .federation.base import NodeProfile
from .search_spaces import SearchSpace, build_space
from .search_spaces.prunable import PrunableNet
from .seeding import seed_torch

__all__ = [
    "Runner",
    "aggregation_of",
    "build_supernet",
    "check_partitions",
    "checkpointer",
    "describe_space",
    "resume_checkpoint",
]

#: a method's runner: (grid, settings, output directory, checkpointer) -> result document
Runner = Callable[[Grid, RunSettings, Path, Checkpointer | None], dict[str, Any]]


def build_supernet(settings: RunSettings) -> SearchSpace:
    """The run's search space, initialised from the run seed."""
    seed_torch(settings.seed, "init")
    return build_space(**space_kwargs(settings.space, dataset_info(settings.data)))


def check_partitions(settings: RunSettings, profiles: Sequence[NodeProfile]) -> None:
    counts = {p.num_partitions for p in profiles}
    if len(counts) != 1:
        raise ValueError(f"nodes disagree on num-partitions: {sorted(counts)}")
    settings.data.check_partitionable(counts.pop())


def aggregation_of(settings: RunSettings) -> Aggregation:
    """The run's choice of aggregation (run config ``aggregation``, ``aggregation-trim``)."""
    return Aggregation(settings.aggregation, settings.aggregation_trim)


def describe_space(space: SearchSpace) -> dict[str, Any]:
    return {
        "spec": space.spec,
        "choices": [{"name": c.name, "options": list(c.options)} for c in space.choices],
        "total-size": space.total_size,
        "fixed-flops": space.fixed_cost.flops,
        "min-flops": space.min_flops(),
        "max-flops": space.max_flops(),
        "flops-convention": "FLOPs = 2 x MACs per sample (torch.utils.flop_counter)",
    }


def checkpointer(
    progress: Checkpointer | None,
    settings: RunSettings,
    out_dir: Path,
    space: dict[str, Any],
    **stage_files: str,
) -> Checkpointer:
    """The run's ``Checkpointer`` (a new one if the caller gave none), set to ``space``."""
    if progress is None:
        progress = Checkpointer(
            out_dir, method=settings.method, seed=settings.seed, every=settings.checkpoint_every
        )
    progress.space = dict(space)
    progress.stage_files.update(stage_files)
    return progress


def resume_checkpoint(settings: RunSettings, space: SearchSpace | PrunableNet) -> Resume | None:
    """The checkpoint of run config ``resume-from`` (``None``: none given), checked
    against this run's method, seed and space."""
    if not settings.resume_from:
        return None
    return read_resume(
        settings.resume_from,
        method=settings.method,
        seed=settings.seed,
        reference=space.state_dict(),
        space=space.spec,
    )
