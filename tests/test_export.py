"""ONNX copies of final models: every kind of final model exports and matches PyTorch in
onnxruntime; subnets and MixedOp trace and export without warnings; a run writes them."""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime
import pytest
import torch
from torch import nn

from fedorasflwr.artifacts import load_checkpoint
from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.export import INPUT_NAME, OPSET, TOLERANCE, OnnxExports, export_onnx
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.search_spaces import DerivedNetwork, MixedOp, build_prunable, build_space
from fedorasflwr.server_app import runner
from tests.runconfig import tiny_decnas

# torch 2.14 deprecates torch.jit.* itself (FutureWarning "`torch.jit.trace` is deprecated");
# every other warning, TracerWarning included, is an error in these tests.
JIT_DEPRECATED = r"`torch\.jit\.\w+` is deprecated"


def _subnet(name: str, arch_of, **kwargs):
    torch.manual_seed(0)
    space = build_space(name, **kwargs)
    return space.subnet(arch_of(space))


def _cnn_s():
    return _subnet(
        "cnn_s",
        lambda s: tuple(i % n for i, n in enumerate(s.num_options())),
        num_classes=5,
        input_height=12,
        input_width=11,
        width=0.25,
    ), torch.randn(6, 1, 12, 11)


def _cnn_l():
    # odd input size: the reduction's residual pads by x.shape % 2
    return _subnet(
        "cnn_l",
        lambda s: (5, 7, 2),
        num_classes=4,
        input_height=9,
        input_width=9,
        width=0.1,
        layers_per_block=1,
    ), torch.randn(6, 3, 9, 9)


def _rnn():
    # lstm, gru skip, ligru, qrnn skip: every recurrent cell
    return _subnet("rnn", lambda s: (0, 1, 2, 3), vocab_size=11, seq_len=5, width=0.05), (
        torch.randint(0, 11, (6, 5))
    )


def _rnn_zero_identity():
    return _subnet("rnn", lambda s: (4, 6, 6, 7), vocab_size=11, seq_len=5, width=0.05), (
        torch.randint(0, 11, (6, 5))
    )


def _mbconv():
    torch.manual_seed(0)
    space = build_space("mbconv", num_classes=5, width=0.25, layers_per_stage=2)
    with torch.no_grad():  # a derived net as FDNAS makes it: argmax alpha per layer
        for alpha in space.arch_parameters():
            alpha.normal_()
    return space.subnet(space.derive()), torch.randn(6, 1, 28, 28)


def _darts():
    torch.manual_seed(0)
    space = build_space("darts", num_classes=5, input_height=12, input_width=12, channels=4)
    with torch.no_grad():
        space.net.alpha_normal.normal_()
        space.net.alpha_reduce.normal_()
    return DerivedNetwork(space.genotype(), **space.spec), torch.randn(6, 1, 12, 12)


def _prunable(name: str):
    def build():
        torch.manual_seed(0)
        net = build_prunable(
            name, num_classes=5, in_channels=1, input_height=16, input_width=16, width=0.1
        )
        return net, torch.randn(6, 1, 16, 16)

    return build


def _trained_bn(model: nn.Module, inputs: torch.Tensor) -> nn.Module:
    """Move BatchNorm running statistics off their initial values, so eval mode matters."""
    model.train()
    with torch.no_grad():
        model(inputs)
    return model.eval()


MODELS = {
    "cnn_s": _cnn_s,
    "cnn_l": _cnn_l,
    "rnn": _rnn,
    "rnn-zero-identity": _rnn_zero_identity,
    "mbconv-derived": _mbconv,
    "darts-derived": _darts,
    "decnas-convnet": _prunable("convnet"),
    "decnas-mobilenet": _prunable("mobilenet"),
}


@pytest.mark.parametrize("kind", list(MODELS))
def test_final_model_exports_and_matches_in_onnxruntime(kind, tmp_path):
    model, inputs = MODELS[kind]()
    model = _trained_bn(model, inputs)
    record = export_onnx(model, tmp_path / f"{kind}.onnx", inputs)
    assert record.valid, record.error
    assert record.file == f"{kind}.onnx" and (tmp_path / record.file).is_file()
    assert not list(tmp_path.glob("*.data"))  # weights inside the one file
    assert record.max_abs_diff is not None and record.max_abs_diff < TOLERANCE
    assert record.samples == len(inputs) and record.opset == OPSET
    # the batch dimension is dynamic: a batch size never seen at export runs too
    session = onnxruntime.InferenceSession(str(tmp_path / record.file))
    (spec,) = session.get_inputs()
    assert spec.name == INPUT_NAME and isinstance(spec.shape[0], str)
    odd = torch.cat([inputs, inputs[:3]])
    (logits,) = session.run(None, {INPUT_NAME: odd.numpy()})
    with torch.no_grad():
        expected = model(odd).numpy()
    assert logits.shape == expected.shape
    assert np.abs(logits - expected).max() < TOLERANCE


def test_the_exporters_op_table_is_built_once_and_the_files_are_the_same(tmp_path, monkeypatch):
    """``export._registry_once``: the second export reuses the first's table of torchlib ops
    (a call to build it counted), the files equal an export with a table of its own byte
    for byte, and the exporter's class is left as it was."""
    from torch.onnx._internal.exporter import _registration

    from fedorasflwr import export

    own = _registration.ONNXRegistry.__dict__["from_torchlib"]
    built: list[int] = []
    build = _registration.ONNXRegistry.from_torchlib

    def counted(opset_version: int = OPSET):
        built.append(opset_version)
        return build(opset_version=opset_version)

    monkeypatch.setattr(export, "_REGISTRIES", {})
    monkeypatch.setattr(_registration.ONNXRegistry, "from_torchlib", staticmethod(counted))
    model, inputs = _cnn_s()
    model = _trained_bn(model, inputs)
    for name in ("first", "second"):
        assert export_onnx(model, tmp_path / f"{name}.onnx", inputs).valid
    assert built == [OPSET]  # the second export built no table
    assert _registration.ONNXRegistry.__dict__["from_torchlib"] is not own  # ours, restored
    monkeypatch.undo()
    assert _registration.ONNXRegistry.__dict__["from_torchlib"] is own
    export._export_uncached(model.eval(), tmp_path / "fresh.onnx", inputs[:2])
    fresh = (tmp_path / "fresh.onnx").read_bytes()
    assert (tmp_path / "first.onnx").read_bytes() == fresh
    assert (tmp_path / "second.onnx").read_bytes() == fresh


def test_a_mismatch_marks_the_file_invalid(tmp_path):
    model, inputs = _cnn_s()
    record = export_onnx(model, tmp_path / "m.onnx", inputs, tolerance=-1.0)
    assert not record.valid and "differ" in record.error
    assert record.file == "m.invalid.onnx"
    assert not (tmp_path / "m.onnx").exists() and (tmp_path / "m.invalid.onnx").is_file()


class _DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # python branch on a value: torch.export refuses it
            return x
        return -x


def test_an_export_fault_is_recorded_not_raised(tmp_path, caplog):
    record = export_onnx(_DataDependent(), tmp_path / "bad.onnx", torch.randn(4, 3))
    assert not record.valid and record.file is None and record.error
    assert not list(tmp_path.iterdir())
    assert "ONNX export of bad.onnx failed" in caplog.text


def test_weights_that_do_not_fit_are_recorded_not_raised(tmp_path, caplog):
    exports = OnnxExports.__new__(OnnxExports)  # no data set needed for this path
    exports.out_dir, exports.records = tmp_path, {}
    exports.inputs, exports.source = torch.randn(4, 3), "synthetic"
    record = exports.add("m", nn.Linear(3, 2), {"weight": torch.zeros(5, 5)})
    assert not record.valid and record.file is None and "size mismatch" in record.error
    assert exports.files() == [] and exports.summary()["m.onnx"]["valid"] is False
    assert not list(tmp_path.iterdir()) and "do not fit" in caplog.text


@pytest.mark.parametrize("kind", ["cnn_s", "cnn_l", "rnn", "mbconv-derived"])
def test_subnet_traces_and_exports_without_warnings(kind):
    subnet, inputs = MODELS[kind]()
    subnet.eval()
    for mixed in (m for m in subnet.modules() if isinstance(m, MixedOp)):
        assert len(mixed.ops) == 1  # the chosen op only
    other = torch.cat([inputs, inputs[:1]])
    with torch.no_grad():
        expected = subnet(other)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=JIT_DEPRECATED, category=FutureWarning)
        traced = torch.jit.trace(subnet, inputs)
        batch = torch.export.Dim("batch", min=1)
        programs = [
            torch.export.export(subnet, (inputs,), dynamic_shapes=({0: batch},), strict=strict)
            for strict in (False, True)
        ]
    with torch.no_grad():
        torch.testing.assert_close(traced(other), expected)
        for program in programs:
            torch.testing.assert_close(program.module()(other), expected)


def test_mixed_op_scripts_traces_and_exports_without_warnings():
    torch.manual_seed(0)
    space = build_space("cnn_s", num_classes=3, input_height=8, input_width=8, width=0.25)
    mixed = space.net.get_submodule(space.choices[0].name).eval()
    x = torch.randn(2, space.net.stem.conv.out_channels, 8, 8)

    class Fixed(nn.Module):  # tracing and export take tensors; the option is fixed
        def __init__(self, option: int) -> None:
            super().__init__()
            self.mixed, self.option = mixed, option

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.mixed(x, self.option)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=JIT_DEPRECATED, category=FutureWarning)
        scripted = torch.jit.script(mixed)
        traced = torch.jit.trace(Fixed(4), x)
        program = torch.export.export(Fixed(4), (x,), strict=True)
    with torch.no_grad():
        for option in range(len(mixed.option_names)):  # scripting keeps every option
            torch.testing.assert_close(scripted(x, option), mixed(x, option))
        torch.testing.assert_close(traced(x), mixed(x, 4))
        torch.testing.assert_close(program.module()(x), mixed(x, 4))
    held = space.subnet((1,) * len(space.choices)).net.get_submodule(space.choices[0].name)
    with pytest.raises(ValueError, match=r"option 0 \(conv1x1\) is not held"):
        held(x, 0)


def test_a_run_writes_checked_onnx_files(data_cache, tmp_path):
    config = tiny_decnas(data_cache, onnx=True)  # the tiny configs write none
    settings = parse_run_config(config)
    grid = InProcessGrid(client_app, config, 6)
    document = runner("decnas")(grid, settings, tmp_path)
    checkpoints = sorted(p for p in document["files"] if p.endswith(".pt"))
    onnx_files = sorted(p for p in document["files"] if p.endswith(".onnx"))
    assert checkpoints and onnx_files == sorted(p.replace(".pt", ".onnx") for p in checkpoints)
    assert sorted(document["onnx"]) == onnx_files
    for name, entry in document["onnx"].items():
        assert entry["valid"] and entry["file"] == name, entry
        assert entry["inputs"] == "server-slice" and entry["samples"] > 1
        assert 0 <= entry["max-abs-diff"] < TOLERANCE
        # the file reproduces the checkpoint without this package's classes at run time
        checkpoint = load_checkpoint(tmp_path / name.replace(".onnx", ".pt"))
        net = build_prunable(**checkpoint["space"])
        net.load_state_dict(checkpoint["state_dict"])
        net.eval()
        x = torch.randn(3, *net.input_shape)
        session = onnxruntime.InferenceSession(str(tmp_path / name))
        (logits,) = session.run(None, {INPUT_NAME: x.numpy()})
        with torch.no_grad():
            assert np.abs(logits - net(x).numpy()).max() < TOLERANCE


def test_run_config_onnx_false_writes_checkpoints_only(data_cache, tmp_path):
    from flwr.app import ArrayRecord

    from fedorasflwr.runs import RunFiles

    settings = parse_run_config(tiny_decnas(data_cache, onnx=False))
    assert settings.onnx is False and parse_run_config({}).onnx is True
    with pytest.raises(ValueError, match=r"run config 'onnx' = 'no': expected a bool"):
        parse_run_config({"onnx": "no"})
    model = nn.Linear(3, 2)
    files = RunFiles(tmp_path, settings, {"name": "linear"}, None)
    files.save(
        "final", ArrayRecord(model.state_dict()), stage="final", builder="prunable", model=model
    )
    document = files.document()
    assert document == {"onnx": {}, "files": ["final.pt"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final.pt"]
