"""``fedorasflwr.load_model`` on files it cannot rebuild: refused naming the path and the
reason. The files every method's runner writes, loaded back, are checked on tiny runs in
``tests/test_exported_scores.py`` (one run per method serves both)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import ArrayRecord

from fedorasflwr import load_model
from fedorasflwr.artifacts import load_checkpoint, save_checkpoint
from fedorasflwr.model_files import builder_of
from fedorasflwr.search_spaces import SearchSpace, build_prunable, build_space
from tests.test_exported_scores import _same_outputs


def _tiny_space() -> SearchSpace:
    torch.manual_seed(0)
    return build_space("cnn_s", num_classes=3, input_height=8, input_width=8, width=0.25)


def _subnet_file(path: Path, **entries: Any) -> Path:
    space = _tiny_space()
    arch = tuple(0 for _ in space.num_options())
    content = {"arch": list(arch), "builder": "subnet", **entries}
    arrays = ArrayRecord(space.subnet(arch).state_dict())
    return save_checkpoint(path, space_spec=space.spec, arrays=arrays, stage="finetune", **content)


def test_a_file_without_a_builder_entry_is_read_by_its_entries(tmp_path):
    space = _tiny_space()
    arch = tuple(n - 1 for n in space.num_options())
    old = save_checkpoint(
        tmp_path / "tier-1.pt",
        space_spec=space.spec,
        arrays=ArrayRecord(space.subnet(arch).state_dict()),
        stage="finetune",
        arch=list(arch),
    )
    assert builder_of(load_checkpoint(old)) == "subnet"
    x = torch.randn(5, *space.input_shape)
    _same_outputs(load_model(old), space.subnet(arch).eval(), x)
    net = build_prunable("convnet", num_classes=3, in_channels=1, input_height=8, input_width=8)
    gm = save_checkpoint(
        tmp_path / "gm0.pt", space_spec=net.spec, arrays=ArrayRecord(net.state_dict()), stage="x"
    )
    assert builder_of(load_checkpoint(gm)) == "prunable"
    _same_outputs(load_model(str(gm)), net.eval(), torch.randn(5, 1, 8, 8))


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: p, "no such file"),
        (lambda p: (p.write_bytes(b""), p)[1], "empty"),
        (lambda p: (p.write_bytes(b"\x80\x02not torch"), p)[1], "not a loadable checkpoint"),
        (lambda p: (torch.save({"x": torch.ones(1)}, p), p)[1], r"lacks the entries"),
        (
            lambda p: (torch.save({"cls": torch.nn.Linear(2, 2)}, p), p)[1],
            "not a loadable checkpoint",  # a pickled module: weights_only refuses it
        ),
        (lambda p: _subnet_file(p, builder="zzz"), r"'builder' = 'zzz'.*allowed: space, subnet"),
        (lambda p: _subnet_file(p, arch=[1, 1, 1, 1]), "weights do not fit its 'subnet'"),
        (lambda p: _subnet_file(p, arch=[1, 1, 1]), "cannot rebuild.*needs 4 option indices"),
        (
            lambda p: save_checkpoint(
                p,
                space_spec={"name": "nowhere"},
                arrays=ArrayRecord({"w": torch.ones(1)}),
                stage="final",
                builder="space",
            ),
            "cannot rebuild its 'space' module.*unknown search space 'nowhere'",
        ),
        (
            lambda p: save_checkpoint(
                p,
                space_spec=_tiny_space().spec,
                arrays=ArrayRecord(_tiny_space().state_dict()),
                stage="final",
                builder="derived",
            ),
            "without the entry 'genotype'",
        ),
        (lambda p: (p.with_suffix(".onnx").write_bytes(b"x"), p.with_suffix(".onnx"))[1], "ONNX"),
    ],
)
def test_a_file_it_cannot_rebuild_is_refused_naming_the_path_and_why(tmp_path, make, reason):
    path = make(tmp_path / "model.pt")
    with pytest.raises(ValueError, match=reason) as failure:
        load_model(path)
    assert str(path) in str(failure.value)


def test_prunable_weights_of_other_widths_are_refused(tmp_path):
    net = build_prunable("convnet", num_classes=3, in_channels=1, input_height=8, input_width=8)
    smaller = build_prunable(**{**net.spec, "widths": [w - 1 for w in net.widths]})
    path = save_checkpoint(
        tmp_path / "gm1.pt",
        space_spec=net.spec,
        arrays=ArrayRecord(smaller.state_dict()),
        stage="iterations",
        builder="prunable",
    )
    with pytest.raises(ValueError, match=r"gm1\.pt.*weights do not fit its 'prunable' module"):
        load_model(path)
