"""ONNX copies of a run's final models, checked against PyTorch with onnxruntime.

Every final model a run writes as ``<name>.pt`` (a ``state_dict`` that needs this
package to rebuild) is also written as ``<name>.onnx``: the module in eval mode,
exported with ``torch.onnx.export`` (the ``torch.export``-based exporter, opset
:data:`OPSET`), input ``"input"`` with a dynamic batch dimension, output
``"logits"``, weights inside the file.  The file is then loaded with onnxruntime
and run on a batch of the run's inputs (the server slice; synthetic inputs of the
dataset's shape when the run has none); the largest absolute difference from the
PyTorch logits is recorded.  Above :data:`TOLERANCE` the file is renamed
``<name>.invalid.onnx`` and the record says ``"valid": false``, with an ERROR log:
a run never leaves a wrong ``<name>.onnx`` behind, and never loses its other
results to an export fault.  Sequence models keep the run's ``seq_len`` fixed (the
recurrent cells' time loop is unrolled); only the batch dimension is dynamic.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord
from torch import Tensor, nn

from .arrays import state_dict_of
from .data import DataSpec, dataset_info, load_server_data
from .seeding import torch_stream

__all__ = [
    "INPUT_NAME",
    "OPSET",
    "OUTPUT_NAME",
    "TOLERANCE",
    "OnnxExport",
    "OnnxExports",
    "example_inputs",
    "export_onnx",
]

_LOG = logging.getLogger(__name__)

OPSET = 23
"""ONNX opset of the exported files (onnxruntime >= 1.22 runs it)."""
TOLERANCE = 1e-4
"""Largest accepted absolute difference between onnxruntime's and PyTorch's logits."""
INPUT_NAME = "input"
OUTPUT_NAME = "logits"
SAMPLES = 32
"""Inputs in the comparison batch."""


@dataclass(frozen=True)
class OnnxExport:
    """What one export left behind and how it compared with PyTorch.

    Attributes
    ----------
    file : str
        Name of the file written (``<name>.onnx``, or ``<name>.invalid.onnx``), or
        ``None`` when the export itself failed.
    valid : bool
        The file exists and its logits are within ``tolerance`` of PyTorch's.
    max_abs_diff : float or None
        Largest absolute difference of the logits on the comparison batch.
    tolerance : float
    samples : int
        Size of the comparison batch.
    inputs : str
        ``"server-slice"`` or ``"synthetic"``.
    opset : int
    error : str or None
        Why the export or the check failed.
    """

    file: str | None
    valid: bool
    max_abs_diff: float | None
    tolerance: float
    samples: int
    inputs: str
    opset: int
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        """The ``result.json`` entry."""
        return {
            "file": self.file,
            "valid": self.valid,
            "max-abs-diff": self.max_abs_diff,
            "tolerance": self.tolerance,
            "samples": self.samples,
            "inputs": self.inputs,
            "opset": self.opset,
            "error": self.error,
        }


def example_inputs(spec: DataSpec, count: int = SAMPLES) -> tuple[Tensor, str]:
    """A batch of the run's inputs: the first ``count`` of the server slice, or, when the
    run holds none back, ``count`` seeded synthetic inputs of the dataset's shape."""
    server = load_server_data(spec)
    if len(server):
        return server.tensors[0][:count].clone(), "server-slice"
    info = dataset_info(spec)
    generator = torch_stream(spec.seed, "export-inputs")
    shape = (count, *info.input_shape)
    if info.kind == "text":
        return torch.randint(0, info.num_classes, shape, generator=generator), "synthetic"
    return torch.randn(shape, generator=generator), "synthetic"


#: per process, the exporter's table of torchlib ops for each opset (see `_registry_once`)
_REGISTRIES: dict[int, Any] = {}
_REGISTRY_LOCK = threading.Lock()


@contextlib.contextmanager
def _registry_once() -> Iterator[None]:
    """``torch.onnx.export`` builds its registry of torchlib ops afresh on every call: 1.5
    to 3.5 CPU-s of each export of a small net, and a run exports a model per tier. With no
    custom translation table (this module passes none) nothing changes the registry during
    an export, so within this block the one built for an opset is handed out again; the
    files are byte for byte those of a fresh registry (tests/test_export.py). Where torch
    moved that internal, exports build it as before."""
    try:
        from torch.onnx._internal.exporter import _registration

        registry_class = _registration.ONNXRegistry
        own = registry_class.__dict__["from_torchlib"]  # the classmethod itself
        build = registry_class.from_torchlib
    except (ImportError, AttributeError, KeyError):
        yield
        return

    def cached(opset_version: int = OPSET) -> Any:
        if opset_version not in _REGISTRIES:
            _REGISTRIES[opset_version] = build(opset_version=opset_version)
        return _REGISTRIES[opset_version]

    with _REGISTRY_LOCK:
        registry_class.from_torchlib = staticmethod(cached)
        try:
            yield
        finally:
            registry_class.from_torchlib = own


def _export(model: nn.Module, path: Path, inputs: Tensor) -> None:
    with _registry_once():
        _export_uncached(model, path, inputs)


def _export_uncached(model: nn.Module, path: Path, inputs: Tensor) -> None:
    batch = torch.export.Dim("batch", min=1)
    torch.onnx.export(
        model,
        (inputs,),
        path,
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        opset_version=OPSET,
        dynamic_shapes=({0: batch},),
        external_data=False,  # one self-contained file per model
        # onnxruntime optimises the graph when it loads it; the exporter's own pass
        # takes about three times the translation on unrolled recurrent graphs
        optimize=False,
        verbose=False,
        dynamo=True,
    )


def _max_abs_diff(model: nn.Module, path: Path, inputs: Tensor) -> float:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (onnx_logits,) = session.run([OUTPUT_NAME], {INPUT_NAME: inputs.numpy()})
    with torch.no_grad():
        torch_logits = model(inputs).numpy()
    if onnx_logits.shape != torch_logits.shape:
        raise ValueError(f"logits shape {onnx_logits.shape}, PyTorch's {torch_logits.shape}")
    return float(np.max(np.abs(onnx_logits.astype(np.float64) - torch_logits)))


def export_onnx(
    model: nn.Module,
    path: Path,
    inputs: Tensor,
    *,
    source: str = "synthetic",
    tolerance: float = TOLERANCE,
) -> OnnxExport:
    """Write ``model`` (put in eval mode) to ``path`` as ONNX and compare onnxruntime's
    logits with PyTorch's on ``inputs`` (at least 2 samples, so the batch dimension is
    exported as dynamic; the comparison runs on all of them).

    Never raises for a model that fails to export or to match: the returned record
    says ``valid=False`` with the reason (logged at ERROR), and a file that does not
    match is renamed ``<stem>.invalid.onnx``.
    """
    path = Path(path)
    model.eval()
    trace_inputs = inputs[:2] if len(inputs) > 2 else inputs
    record = {
        "tolerance": tolerance,
        "samples": len(inputs),
        "inputs": source,
        "opset": OPSET,
    }
    try:
        _export(model, path, trace_inputs)
        diff = _max_abs_diff(model, path, inputs)
    except Exception as exc:  # noqa: BLE001 - any exporter/runtime fault is recorded
        _LOG.error("ONNX export of %s failed: %s", path.name, exc)
        path.unlink(missing_ok=True)
        return OnnxExport(None, False, None, **record, error=f"{type(exc).__name__}: {exc}")
    if not diff <= tolerance:  # also catches NaN
        invalid = path.with_name(f"{path.stem}.invalid.onnx")
        path.replace(invalid)
        message = f"onnxruntime logits differ from PyTorch's by {diff:.3g} > {tolerance:g}"
        _LOG.error("ONNX export %s: %s; renamed to %s", path.name, message, invalid.name)
        return OnnxExport(invalid.name, False, diff, **record, error=message)
    _LOG.info("ONNX export %s: max abs diff %.3g", path.name, diff)
    return OnnxExport(path.name, True, diff, **record)


class OnnxExports:
    """The ONNX copies of one run's final models, next to their ``.pt`` checkpoints.

    ``exports.add(name, module, arrays)`` loads ``arrays`` into ``module`` and writes
    ``<out_dir>/<name>.onnx``; ``summary()`` is the result document's ``"onnx"``
    entry (file name -> comparison) and ``files()`` the names written.
    """

    def __init__(self, out_dir: Path, spec: DataSpec) -> None:
        self.out_dir = Path(out_dir)
        self.inputs, self.source = example_inputs(spec)
        self.records: dict[str, OnnxExport] = {}

    def add(
        self, name: str, module: nn.Module, arrays: ArrayRecord | Mapping[str, Tensor]
    ) -> OnnxExport:
        """Load the final weights into ``module`` and export it as ``<name>.onnx``."""
        state = state_dict_of(arrays) if isinstance(arrays, ArrayRecord) else arrays
        try:
            module.load_state_dict(state)
        except RuntimeError as exc:  # a bug, but the run's other results are kept
            _LOG.error("ONNX export of %s.onnx: the weights do not fit: %s", name, exc)
            record = OnnxExport(
                None, False, None, TOLERANCE, len(self.inputs), self.source, OPSET, str(exc)
            )
        else:
            path = self.out_dir / f"{name}.onnx"
            record = export_onnx(module, path, self.inputs, source=self.source)
        self.records[name] = record
        return record

    def files(self) -> list[str]:
        """Names of the ONNX files written (valid or marked invalid)."""
        return [r.file for r in self.records.values() if r.file is not None]

    def summary(self) -> dict[str, dict[str, Any]]:
        """``{"<name>.onnx": {"valid", "max-abs-diff", ...}}`` for ``result.json``."""
        return {f"{name}.onnx": r.summary() for name, r in self.records.items()}
