"""``load_model`` on crafted model files: a tensor that claims more than the file holds (a
10^12-element shape, a repeated view, a storage larger or smaller than its bytes), weights
of another shape or dtype than the architecture the file names, and a pickle payload: each
is refused at once with a ``ValueError`` naming the file and the entry, before any tensor
is materialised.

The files are written as ``torch.save`` writes them (its zip writer, ``data.pkl`` and one
``data/<key>`` record per storage), with a pickle whose tensor declarations we choose.  The
refusals run in one child process whose address space is capped a little above what it
holds after importing torch: an allocation the size of a declared tensor fails there, so a
refusal that comes only after trying one would show as an allocator error, not as the
message asserted here."""

from __future__ import annotations

import collections
import io
import json
import os
import pickle
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from fedorasflwr.search_spaces import build_prunable

ROOT = Path(__file__).resolve().parents[2]
#: how far above its size after importing torch the child's address space may grow
HEADROOM = 1 << 30
#: how long one refusal may take, seconds (a legitimate load of the tiny net takes ~0.1 s)
QUICK = 2.0
#: how much the child's peak resident memory may grow over all the cases, bytes
PEAK = 200 << 20
STORAGES = {torch.float32: torch.FloatStorage, torch.float64: torch.DoubleStorage}
STORAGES[torch.int64] = torch.LongStorage


@dataclass
class Declared:
    """A tensor as ``data.pkl`` declares it: its storage (record ``key``, element type,
    element count) and its view of it (size, strides, offset)."""

    key: str
    dtype: torch.dtype
    numel: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int = 0


class _Storage:
    def __init__(self, declared: Declared) -> None:
        self.declared = declared


class _Pickler(pickle.Pickler):
    """Pickles ``Declared`` as ``torch.save`` pickles a tensor: ``_rebuild_tensor_v2`` of a
    persistent ``("storage", type, key, location, numel)`` reference."""

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _Storage):
            d = obj.declared
            return ("storage", STORAGES[d.dtype], d.key, "cpu", d.numel)
        return None

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, Declared):
            hooks: collections.OrderedDict[Any, Any] = collections.OrderedDict()
            return (
                torch._utils._rebuild_tensor_v2,
                (_Storage(obj), obj.offset, obj.size, obj.stride, False, hooks),
            )
        return NotImplemented


def write_crafted(path: Path, content: Any, records: dict[str, bytes]) -> Path:
    """A file laid out as ``torch.save`` lays it out, holding ``content`` (``Declared``
    tensors) and ``records`` (storage key -> its bytes)."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=2).dump(content)
    writer = torch._C.PyTorchFileWriter(str(path))
    for name, value in (
        ("data.pkl", buffer.getvalue()),
        (".format_version", b"1"),
        (".storage_alignment", b"64"),
        ("byteorder", sys.byteorder.encode()),
        *((f"data/{key}", raw) for key, raw in records.items()),
    ):
        writer.write_record(name, value, len(value))
    writer.write_end_of_file()
    return path


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_prunable("convnet", num_classes=3, in_channels=1, input_height=8, input_width=8)


def model_file(path: Path, change: Any = None) -> Path:
    """The tiny ConvNet's model file (builder ``prunable``), its first conv weight's
    declaration and record passed through ``change(declared, raw) -> (declared, raw)``."""
    net = _net()
    state, records = {}, {}
    for index, (name, tensor) in enumerate(net.state_dict().items()):
        tensor = tensor.contiguous()
        key = str(index)
        state[name] = Declared(key, tensor.dtype, tensor.numel(), tensor.shape, tensor.stride())
        records[key] = tensor.numpy().tobytes()
        if name == TARGET and change is not None:
            state[name], records[key] = change(state[name], records[key])
    content = {"space": net.spec, "state_dict": state, "stage": "final", "builder": "prunable"}
    return write_crafted(path, content, records)


#: the entry the cases change: the first conv layer's weight, (filters, 1, 3, 3) float32
TARGET = next(k for k, v in _net().state_dict().items() if v.dim() == 4)
SHAPE = tuple(_net().state_dict()[TARGET].shape)
SIDE = 10**6


def _huge_storage(d: Declared, raw: bytes) -> tuple[Declared, bytes]:
    return Declared(d.key, d.dtype, SIDE * SIDE, (SIDE, SIDE), (SIDE, 1)), raw


def _huge_shape(d: Declared, raw: bytes) -> tuple[Declared, bytes]:
    return Declared(d.key, d.dtype, d.numel, (SIDE, SIDE), (SIDE, 1)), raw


def _repeated_view(d: Declared, raw: bytes) -> tuple[Declared, bytes]:
    return Declared(d.key, d.dtype, d.numel, (SIDE, SIDE), (0, 0)), raw


def _two_gib_storage(d: Declared, raw: bytes) -> tuple[Declared, bytes]:
    numel = (2 << 30) // 4
    return Declared(d.key, d.dtype, numel, (numel,), (1,)), raw


def _other_shape(d: Declared, raw: bytes) -> tuple[Declared, bytes]:
    size = (d.numel // 9, 9)  # the same bytes, as a matrix
    return Declared(d.key, d.dtype, d.numel, size, (9, 1)), raw


def _short_record(d: Declared, raw: bytes) -> tuple[Declared, bytes]:
    return d, raw[: len(raw) // 2]


def _short_storage(d: Declared, raw: bytes) -> tuple[Declared, bytes]:
    return Declared(d.key, d.dtype, d.numel // 2, d.size, d.stride), raw[: len(raw) // 2]


def _offset_past_end(d: Declared, raw: bytes) -> tuple[Declared, bytes]:
    return Declared(d.key, d.dtype, d.numel, d.size, d.stride, offset=d.numel), raw


def _float64(d: Declared, raw: bytes) -> tuple[Declared, bytes]:
    doubled = torch.frombuffer(bytearray(raw), dtype=torch.float32).double()
    return Declared(d.key, torch.float64, d.numel, d.size, d.stride), doubled.numpy().tobytes()


#: case -> (how the target entry is changed, what the refusal says besides the entry)
CASES = {
    "huge-storage": (_huge_storage, r"needs a storage of 4000000000000 bytes, the file holds"),
    "huge-shape": (_huge_shape, r"needs a storage of 4000000000000 bytes, the file holds"),
    "repeated-view": (_repeated_view, r"claims 1000000000000 elements \(strides \(0, 0\)\)"),
    "two-gib-storage": (_two_gib_storage, r"needs a storage of 2147483648 bytes"),
    "other-shape": (_other_shape, r"has shape \(\d+, 9\), expected " + re.escape(str(SHAPE))),
    "short-record": (_short_record, r"needs a storage of \d+ bytes, the file holds \d+ bytes"),
    "short-storage": (_short_storage, r"needs a storage of \d+ bytes, the file holds \d+ bytes"),
    "offset-past-end": (_offset_past_end, r"needs a storage of \d+ bytes"),
    "float64": (_float64, r"is torch\.float64, expected torch\.float32"),
}


def _child(paths: list[str]) -> dict[str, Any]:
    """Run in the child: cap the address space, load each file, report what happened."""
    import resource
    import time

    from fedorasflwr import load_model

    load_model(paths[0])  # the untouched file: warms every import and cache first
    size = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (size + HEADROOM, resource.RLIM_INFINITY))
    start_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    outcomes = {}
    for path in paths:
        began = time.perf_counter()
        try:
            load_model(path)
            outcome = {"refused": None}
        except Exception as exc:  # noqa: BLE001 - reported to the test, which judges it
            outcome = {"refused": f"{type(exc).__name__}: {exc}"}
        outcome["seconds"] = time.perf_counter() - began
        outcomes[path] = outcome
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"outcomes": outcomes, "peak-growth": peak - start_peak}


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("crafted")
    paths = [str(model_file(folder / "untouched.pt"))]
    paths += [str(model_file(folder / f"{case}.pt", change)) for case, (change, _) in CASES.items()]
    code = (
        "import json, sys; from tests.reliability.test_model_files_crafted import _child; "
        "print(json.dumps(_child(sys.argv[1:])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report["folder"] = folder
    return report


def test_the_untouched_file_written_the_same_way_loads_under_the_cap(refusals):
    """The crafting writes loadable files: what is refused below is what each case changed."""
    outcome = refusals["outcomes"][str(refusals["folder"] / "untouched.pt")]
    assert outcome["refused"] is None


@pytest.mark.parametrize("case", list(CASES))
def test_a_crafted_file_is_refused_at_once_naming_the_file_and_entry(refusals, case):
    path = str(refusals["folder"] / f"{case}.pt")
    outcome = refusals["outcomes"][path]
    message = outcome["refused"]
    assert message is not None and message.startswith("ValueError: "), message
    assert repr(path) in message and TARGET in message, message
    assert re.search(CASES[case][1], message), message
    assert "alloc" not in message.lower(), message  # refused, not failed allocating
    assert outcome["seconds"] < QUICK


def test_no_refusal_took_memory(refusals):
    assert refusals["peak-growth"] < PEAK


def test_a_tensor_outside_the_weights_is_held_to_its_storage_too(tmp_path):
    from fedorasflwr import load_model

    net = _net()
    state = {k: v.contiguous() for k, v in net.state_dict().items()}
    records = {str(i): v.numpy().tobytes() for i, v in enumerate(state.values())}
    declared = {
        k: Declared(str(i), v.dtype, v.numel(), v.shape, v.stride())
        for i, (k, v) in enumerate(state.items())
    }
    history = [{"loss": Declared("extra", torch.float32, SIDE * SIDE, (SIDE, SIDE), (SIDE, 1))}]
    records["extra"] = b"\0" * 16
    content = {
        "space": net.spec,
        "state_dict": declared,
        "stage": "final",
        "builder": "prunable",
        "history": history,
    }
    path = write_crafted(tmp_path / "history.pt", content, records)
    with pytest.raises(ValueError, match=r"entry history\[0\]\['loss'\].*4000000000000 bytes"):
        load_model(path)


class _Payload:
    """Unpickled by a plain ``pickle.load``, it would write ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def test_a_pickle_payload_never_runs(tmp_path):
    from fedorasflwr import load_model

    marker = tmp_path / "ran"
    content = {"space": {"name": "convnet"}, "state_dict": {}, "stage": _Payload(marker)}
    path = write_crafted(tmp_path / "payload.pt", content, {})
    with pytest.raises(ValueError, match=r"payload\.pt.*not a loadable checkpoint"):
        load_model(path)
    assert not marker.exists()
