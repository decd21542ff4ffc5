"""Checkpoint files: every bad file is a ``ValueError`` naming the file and what is wrong;
writes are atomic; the resume keys parse and are validated."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord

from fedorasflwr.artifacts import load_checkpoint, save_checkpoint
from fedorasflwr.checkpoints import CHECKPOINT_FILE, Checkpointer, Snapshot, read_resume
from fedorasflwr.config import parse_run_config
from fedorasflwr.ledger import Ledger
from fedorasflwr.search_spaces import build_space
from tests.runconfig import pyproject_run_config

SPEC = {
    "name": "cnn_s",
    "num_classes": 10,
    "in_channels": 1,
    "input_height": 28,
    "input_width": 28,
    "width": 0.25,
}


@pytest.fixture(scope="module")
def space():
    torch.manual_seed(0)
    return build_space(**SPEC)


def write(tmp_path: Path, content: object, name: str = "bad.pt") -> Path:
    path = tmp_path / name
    torch.save(content, path)
    return path


def good(space) -> dict:
    return {
        "space": dict(space.spec),
        "state_dict": {k: v.clone() for k, v in space.state_dict().items()},
        "stage": "supernet",
    }


def assert_rejected(path: Path, space, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment) as error:
        load_checkpoint(path, reference=space.state_dict(), space=space.spec)
    assert str(path) in str(error.value)


def test_a_good_checkpoint_loads(space, tmp_path):
    path = save_checkpoint(
        tmp_path / "ok.pt", space_spec=space.spec, arrays=ArrayRecord(space.state_dict()), stage="x"
    )
    content = load_checkpoint(path, reference=space.state_dict(), space=space.spec)
    assert content["stage"] == "x"


def test_a_missing_file(space, tmp_path):
    assert_rejected(tmp_path / "nothing.pt", space, "cannot load it, no such file")


def test_an_empty_file(space, tmp_path):
    path = tmp_path / "empty.pt"
    path.write_bytes(b"")
    assert_rejected(path, space, "cannot load it, empty")


def test_a_file_that_is_not_a_checkpoint(space, tmp_path):
    path = tmp_path / "garbage.pt"
    path.write_bytes(b"this is not a pickle at all" * 10)
    assert_rejected(path, space, "cannot load it, not a loadable checkpoint")


def test_a_pickle_weights_only_refuses(space, tmp_path):
    path = write(tmp_path, {"space": {}, "state_dict": {}, "stage": Path("/")})
    assert_rejected(path, space, "cannot load it")


def test_not_a_dict(space, tmp_path):
    assert_rejected(write(tmp_path, [1, 2, 3]), space, "holds a list, not a dict")


@pytest.mark.parametrize("entry", ["state_dict", "stage", "space"])
def test_a_missing_entry(space, tmp_path, entry):
    content = good(space)
    del content[entry]
    assert_rejected(write(tmp_path, content), space, f"lacks the entries \\['{entry}'\\]")


def test_a_state_dict_that_is_not_tensors(space, tmp_path):
    content = {**good(space), "state_dict": {"a": 1.0}}
    assert_rejected(write(tmp_path, content), space, "not a non-empty dict of named tensors")


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_weights(space, tmp_path, value):
    content = good(space)
    key = next(k for k, v in content["state_dict"].items() if v.is_floating_point())
    content["state_dict"][key].view(-1)[0] = value
    assert_rejected(write(tmp_path, content), space, f"non-finite .*{key}")


def test_float64_weights_where_the_space_is_float32(space, tmp_path):
    content = good(space)
    key = next(k for k, v in content["state_dict"].items() if v.dtype == torch.float32)
    content["state_dict"][key] = content["state_dict"][key].double()
    assert_rejected(write(tmp_path, content), space, f"'{key}' is torch.float64, expected")


def test_missing_and_unexpected_keys(space, tmp_path):
    content = good(space)
    key = next(iter(content["state_dict"]))
    content["state_dict"]["extra.weight"] = content["state_dict"].pop(key)
    assert_rejected(write(tmp_path, content), space, "missing keys .*unexpected keys")


def test_a_wrong_shape(space, tmp_path):
    content = good(space)
    key = next(k for k, v in content["state_dict"].items() if v.dim() > 1)
    content["state_dict"][key] = torch.zeros(3, 3)
    assert_rejected(write(tmp_path, content), space, f"'{key}' has shape \\(3, 3\\)")


def test_another_space(space, tmp_path):
    content = {**good(space), "space": {**SPEC, "width": 0.5}}
    assert_rejected(write(tmp_path, content), space, "holds weights of the space")


def checkpoint(tmp_path: Path, space, **snapshot) -> Path:
    writer = Checkpointer(tmp_path, method="fedoras", seed=3, space=space.spec, every=2)
    writer(
        Snapshot(
            stage="supernet",
            step=2,
            arrays=ArrayRecord(space.state_dict()),
            ledger=Ledger(),
            history=[{"round": 0}],
            **snapshot,
        )
    )
    return tmp_path / CHECKPOINT_FILE


def test_a_checkpoint_is_written_atomically_and_resumes(space, tmp_path):
    path = checkpoint(tmp_path, space, progress={"tiers": [1.5]})
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_FILE, "result.json"]
    resume = read_resume(
        str(path), method="fedoras", seed=3, reference=space.state_dict(), space=space.spec
    )
    assert (resume.stage, resume.step, resume.within("supernet")) == ("supernet", 2, True)
    assert resume.progress == {"tiers": [1.5]}
    for key, tensor in space.state_dict().items():
        assert torch.equal(torch.from_numpy(resume.arrays[key].numpy()), tensor)


def test_checkpoints_are_due_every_n_steps_and_at_stage_ends(space, tmp_path):
    writer = Checkpointer(tmp_path, method="fedoras", seed=3, space=space.spec, every=3)
    arrays = ArrayRecord(space.state_dict())

    def due(step: int, done: bool = False, with_arrays: bool = True) -> bool:
        return writer.due(
            Snapshot("s", step, arrays if with_arrays else None, Ledger(), stage_done=done)
        )

    assert [due(s) for s in range(7)] == [False, False, False, True, False, False, True]
    assert due(4, done=True) and not due(3, with_arrays=False)
    writer.every = 0
    assert not due(3) and due(5, done=True)


@pytest.mark.parametrize(
    ("method", "seed", "fragment"),
    [("dpfnas", 3, "method 'fedoras'"), ("fedoras", 4, "seed 3")],
)
def test_a_checkpoint_of_another_method_or_seed_is_refused(space, tmp_path, method, seed, fragment):
    path = checkpoint(tmp_path, space)
    with pytest.raises(ValueError, match=fragment):
        read_resume(
            str(path), method=method, seed=seed, reference=space.state_dict(), space=space.spec
        )


def test_an_old_stage1_file_resumes_as_a_finished_stage1(space, tmp_path):
    path = save_checkpoint(
        tmp_path / "supernet.pt",
        space_spec=space.spec,
        arrays=ArrayRecord(space.state_dict()),
        stage="supernet",
    )
    resume = read_resume(
        str(path), method="fedoras", seed=0, reference=space.state_dict(), space=space.spec
    )
    assert resume.past("supernet")
    with pytest.raises(ValueError, match="old-format"):
        read_resume(
            str(path), method="dpfnas", seed=0, reference=space.state_dict(), space=space.spec
        )


def test_resume_keys_parse():
    base = pyproject_run_config()
    assert parse_run_config(base).resume_from == ""
    assert parse_run_config({**base, "resume-from": "a.pt"}).resume_from == "a.pt"
    assert parse_run_config({**base, "fedoras.resume-from": "b.pt"}).resume_from == "b.pt"
    assert parse_run_config({**base, "checkpoint-every": 5}).checkpoint_every == 5
    with pytest.raises(ValueError, match="'fedoras.resume-from'.*'resume-from'"):
        parse_run_config({**base, "resume-from": "a.pt", "fedoras.resume-from": "b.pt"})
    with pytest.raises(ValueError, match="'checkpoint-every' = -1"):
        parse_run_config({**base, "checkpoint-every": -1})
