"""What every method's runner shares: run config -> search space, aggregation, checkpoints.

A *runner* (``methods/<method>/runner.py``) turns the parsed run config into the method's
space and strategy, calls ``strategy.start`` and writes the run's artifacts; the ServerApp
(``server_app.py``) only picks the runner of run config ``method``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from logging import INFO
from pathlib import Path
from typing import Any, TypeVar

from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp import Grid
from flwr.supercore import log
from torch import nn
from torch.utils.data import TensorDataset

from .arrays import record_of, state_dict_of
from .artifacts import save_checkpoint
from .checkpoints import Checkpointer, Resume, read_resume
from .config import RunSettings, TrainingRecipe, bound_settings, space_kwargs
from .costs import COST_CONVENTION, flops_to_macs
from .data import dataset_info, load_global_test, load_server_data
from .export import OnnxExports
from .federation.base import FederatedNASStrategy, NodeProfile
from .latency import LatencyTable, table_document
from .model_files import BUILDER, BUILDERS
from .search_spaces import SearchSpace, build_space
from .search_spaces.prunable import PrunableNet
from .seeding import seed_torch, stream_words
from .training import (
    LrProbe,
    evaluate,
    ordered_loader,
    probe_lr,
    refresh_batchnorm,
    torch_device,
)

__all__ = [
    "FinalModel",
    "GlobalTest",
    "GlobalTestScore",
    "calibrated",
    "chance_accuracy",
    "RunFiles",
    "Runner",
    "build_supernet",
    "check_partitions",
    "checkpointer",
    "describe_space",
    "global_test",
    "latency_document",
    "probed_recipe",
    "resume_checkpoint",
    "start",
    "strategy_options",
]

R = TypeVar("R")

#: a method's runner: (grid, settings, output directory, checkpointer) -> result document
Runner = Callable[[Grid, RunSettings, Path, Checkpointer | None], dict[str, Any]]


def build_supernet(settings: RunSettings) -> SearchSpace:
    """The run's search space, initialised from the run seed."""
    seed_torch(settings.seed, "init")
    return build_space(**space_kwargs(settings.space, dataset_info(settings.data)))


def chance_accuracy(settings: RunSettings) -> float:
    """The accuracy of a guess (1 / the dataset's classes): the chance line of the plots."""
    return 1.0 / dataset_info(settings.data).num_classes


@dataclass(frozen=True)
class GlobalTestScore:
    """A model on the global test set: its accuracy and the set's samples (text: the
    accuracy over every predicted position, the count in windows), and the weights and
    buffers that scored it (``arrays``: BatchNorm statistics as re-estimated; ``None`` when
    the caller kept the module)."""

    accuracy: float
    count: int
    arrays: ArrayRecord | None = None


def calibrated(
    net: nn.Module, arrays: ArrayRecord, calibration: TensorDataset | None
) -> ArrayRecord:
    """``net`` with ``arrays`` loaded and its BatchNorm statistics re-estimated for these
    weights on ``calibration`` (``training.refresh_batchnorm``; ``None`` or empty: the
    statistics ``arrays`` carry); ``net`` ends on the CPU in eval mode, and its state (every
    weight and buffer, in the module's dtypes) is returned: what a run scores and exports."""
    net.load_state_dict(state_dict_of(arrays))
    if calibration is not None and len(calibration):
        refresh_batchnorm(net, calibration)
    net.cpu().eval()
    return record_of(net.state_dict())


@dataclass(frozen=True)
class GlobalTest:
    """The server's global test set (run config ``data.global-test``) and what a model's
    BatchNorm statistics are re-estimated on before it is scored there: the server's
    validation slice (``calibration``; ``None`` when ``data.server-fraction`` is 0, and the
    model is scored with the statistics it carries). Server-side only: no client is asked.
    """

    data: TensorDataset
    calibration: TensorDataset | None

    def score(self, net: nn.Module, arrays: ArrayRecord) -> GlobalTestScore:
        """``net`` with ``arrays`` loaded, its BatchNorm statistics first re-estimated for
        these weights on ``calibration`` (``calibrated``), scored on the global test set
        (``evaluate``); the score holds the state it scored (``arrays``)."""
        state = calibrated(net, arrays, self.calibration)
        return GlobalTestScore(self.evaluate(net).accuracy, len(self.data), state)

    def evaluate(self, net: nn.Module) -> GlobalTestScore:
        """``net`` as it is, in eval mode, on the global test set (in order, batches of 256,
        on ``training.torch_device()``); ``net`` ends on the CPU."""
        device = torch_device()
        result = evaluate(net.to(device).eval(), ordered_loader(self.data), device)
        net.cpu()
        return GlobalTestScore(result.accuracy, len(self.data))


@dataclass(frozen=True)
class FinalModel:
    """A final model as its run wrote it (``RunFiles.save_final``): ``arrays``, the weights
    and buffers in ``<name>.pt`` and ``<name>.onnx``, and their ``score`` on the global test
    set (``None`` without ``data.global-test``)."""

    arrays: ArrayRecord
    score: GlobalTestScore | None


def global_test(settings: RunSettings) -> GlobalTest | None:
    """The run's ``GlobalTest`` with ``data.global-test`` = true (loaded, cached and checked
    as the server slice is: ``data.load_global_test``), else ``None``."""
    if not settings.data.global_test:
        return None
    server = load_server_data(settings.data)
    return GlobalTest(load_global_test(settings.data), server if len(server) else None)


def probed_recipe(
    settings: RunSettings,
    recipe: TrainingRecipe,
    net: nn.Module,
    stage: str,
    grad_clip: float = 0.0,
    server: TensorDataset | None = None,
) -> tuple[TrainingRecipe, LrProbe | None]:
    """``recipe`` with its ``lr`` lowered by `training.probe_lr` where the first SGD steps
    of ``net`` (the stage's initial model; left untouched) at it throw the loss far above
    an untrained net's on the server's slice, and what the probe found; ``recipe`` as it
    is and ``None`` where the server holds no slice (``data.server-fraction`` 0).
    ``grad_clip``: the stage's max gradient norm (0: off), applied to the probe's steps;
    ``server``: the server's slice where the caller has loaded it (default: loaded here).

    The probe runs on the server, on its own slice: no client data is read. Same seed,
    same choice; a resumed run probes again and finds the same rate."""
    server = load_server_data(settings.data) if server is None else server
    if len(server) == 0:
        log(INFO, "[%s] lr %g unprobed: no server slice (data.server-fraction 0)", stage, recipe.lr)
        return recipe, None
    initial = copy.deepcopy(net).cpu()
    probe = probe_lr(
        lambda: copy.deepcopy(initial),
        server,
        {**recipe.client_config(), "grad-clip": grad_clip},
        stream_words(settings.seed, "lr-probe", stage),
        num_classes=dataset_info(settings.data).num_classes,
    )
    tried = ", ".join(f"{lr:g}: {loss:.2f}" for lr, loss in probe.tried)
    log(
        INFO,
        "[%s] lr %g (configured %g; highest loss in %d probe steps, bound %.2f: %s)",
        stage,
        probe.lr,
        probe.configured,
        probe.steps,
        probe.bound,
        tried,
    )
    return replace(recipe, lr=probe.lr), probe


def check_partitions(settings: RunSettings, profiles: Sequence[NodeProfile]) -> None:
    counts = {p.num_partitions for p in profiles}
    if len(counts) != 1:
        raise ValueError(f"nodes disagree on num-partitions: {sorted(counts)}")
    settings.data.check_partitionable(counts.pop())


def describe_space(space: SearchSpace) -> dict[str, Any]:
    return {
        "spec": space.spec,
        "choices": [{"name": c.name, "options": list(c.options)} for c in space.choices],
        "total-size": space.total_size,
        "fixed-flops": space.fixed_cost.flops,
        "fixed-macs": flops_to_macs(space.fixed_cost.flops),
        "min-flops": space.min_flops(),
        "min-macs": flops_to_macs(space.min_flops()),
        "max-flops": space.max_flops(),
        "max-macs": flops_to_macs(space.max_flops()),
        "flops-convention": COST_CONVENTION,
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
        progress = Checkpointer.for_run(out_dir, settings)
    progress.space = dict(space)
    progress.stage_files.update(stage_files)
    return progress


def resume_checkpoint(
    settings: RunSettings,
    space: SearchSpace | PrunableNet | None,
    stages: dict[str, int | None],
) -> Resume | None:
    """The checkpoint of run config ``resume-from`` (``None``: none given), checked
    against this run's method, seed, settings (``config.bound_settings``) and space
    (``None``: the strategy checks the weights itself), its stage one of ``stages`` and
    its step within that stage's rounds (``None``: not bounded by rounds)."""
    if not settings.resume_from:
        return None
    return read_resume(
        settings.resume_from,
        method=settings.method,
        seed=settings.seed,
        reference=None if space is None else space.state_dict(),
        space=None if space is None else space.spec,
        settings=bound_settings(settings.method, settings.values),
        stages=stages,
    )


def latency_document(
    profiles: dict[int, NodeProfile], tables: dict[int, LatencyTable]
) -> dict[str, Any]:
    """``result.json``'s ``latency-tables``: per node (by partition id), its declared
    device class and budget and its table (``latency.table_document``)."""
    nodes = []
    for node_id, table in sorted(tables.items()):
        profile = profiles.get(node_id)
        nodes.append(
            {
                "node-id": node_id,
                "partition-id": -1 if profile is None else profile.partition_id,
                "device-class": "" if profile is None else profile.device_class,
                "latency-budget-ms": 0.0 if profile is None else profile.latency_budget_ms,
                **table_document(table),
            }
        )
    return {"nodes": sorted(nodes, key=lambda n: n["partition-id"])}


def strategy_options(settings: RunSettings, resume: Resume | None) -> dict[str, Any]:
    """The constructor arguments every strategy takes from the run config."""
    return {
        "seed": settings.seed,
        "validate_profiles": lambda profiles: check_partitions(settings, profiles),
        "resume": resume,
        "min_nodes": settings.min_nodes,
    }


def start(
    strategy: FederatedNASStrategy[R],
    grid: Grid,
    settings: RunSettings,
    run: RunFiles,
    initial: ArrayRecord,
    num_rounds: int,
    *,
    evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    **stage_files: str,
) -> R:
    """Set the run's checkpointer on ``strategy`` and ``start`` it as Flower does
    (``num_rounds``: the main stage's; every step's timeout: ``reply-timeout``); the
    strategy's aggregation comes from its settings."""
    strategy.on_progress = checkpointer(
        run.progress, settings, run.out_dir, run.space_spec, **stage_files
    )
    return strategy.start(
        grid,
        initial,
        num_rounds=num_rounds,
        timeout=settings.reply_timeout,
        evaluate_fn=evaluate_fn,
    )


class RunFiles:
    """What a run writes besides ``result.json``: checkpoint files, each final model also
    as ONNX (``export.OnnxExports``), plots; ``document()`` lists them for the result."""

    def __init__(
        self,
        out_dir: Path,
        settings: RunSettings,
        space_spec: dict[str, Any],
        progress: Checkpointer | None,
    ) -> None:
        self.out_dir = out_dir
        self.space_spec = dict(space_spec)
        self.progress = progress
        # run config ``onnx = false``: no ONNX copies (a sweep or benchmark that needs none)
        self.onnx = OnnxExports(out_dir, settings.data) if settings.onnx else None
        self.written: list[Path] = []
        self.settings = settings

    @cached_property
    def global_test(self) -> GlobalTest | None:
        """The run's global test set (``global_test``), loaded on first use."""
        return global_test(self.settings)

    @cached_property
    def calibration(self) -> TensorDataset | None:
        """What every final model's BatchNorm statistics are re-estimated on before it is
        scored and written: the server's validation slice (``None``: the run holds none)."""
        if self.global_test is not None:
            return self.global_test.calibration
        server = load_server_data(self.settings.data)
        return server if len(server) else None

    def save_final(
        self,
        name: str,
        model: nn.Module,
        arrays: ArrayRecord,
        *,
        stage: str,
        builder: str,
        space_spec: dict[str, Any] | None = None,
        **extra: Any,
    ) -> FinalModel:
        """A final model, scored as exported: ``model`` with ``arrays``, its BatchNorm
        statistics re-estimated on the server's slice (``calibrated``; none: as it comes),
        scored on the global test set (with ``data.global-test``) and written as
        ``<name>.pt`` and ``<name>.onnx`` (``save``) with exactly the state it was scored
        with; ``FinalModel`` holds that state and the score."""
        state = calibrated(model, arrays, self.calibration)
        held = self.global_test
        score = None if held is None else replace(held.evaluate(model), arrays=state)
        self.save(
            name, state, stage=stage, builder=builder, model=model, space_spec=space_spec, **extra
        )
        return FinalModel(state, score)

    def save(
        self,
        name: str,
        arrays: ArrayRecord,
        *,
        stage: str,
        builder: str,
        model: nn.Module | None = None,
        space_spec: dict[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        """Write ``<name>.pt`` (``artifacts.save_checkpoint``) with its ``builder``, how
        ``model_files.load_model`` rebuilds it (``model_files.BUILDERS``); with ``model``,
        also ``<name>.onnx`` of ``model`` loaded with ``arrays``."""
        if builder not in BUILDERS:
            raise ValueError(f"builder {builder!r} of {name}.pt; allowed: {', '.join(BUILDERS)}")
        spec = self.space_spec if space_spec is None else space_spec
        self.add(
            save_checkpoint(
                self.out_dir / f"{name}.pt",
                space_spec=spec,
                arrays=arrays,
                stage=stage,
                **{BUILDER: builder},
                **extra,
            )
        )
        if model is not None and self.onnx is not None:
            self.onnx.add(name, model, arrays)

    def add(self, *paths: Path | None) -> None:
        """Files written by other means (plots; ``None``: a plot with nothing to show)."""
        self.written.extend(p for p in paths if p is not None)

    def document(self) -> dict[str, Any]:
        """The result document's ``onnx`` and ``files`` entries."""
        return {
            "onnx": {} if self.onnx is None else self.onnx.summary(),
            "files": [p.name for p in self.written]
            + ([] if self.onnx is None else self.onnx.files()),
        }
