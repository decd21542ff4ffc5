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
from fedorasflwr.config import (
    RESUME_SAFE_KEYS,
    bound_settings,
    parse_run_config,
    resume_safe_keys,
)
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


def checkpoint(tmp_path: Path, space, settings=None, step: int = 2, **snapshot) -> Path:
    writer = Checkpointer(
        tmp_path, method="fedoras", seed=3, space=space.spec, every=2, settings=settings
    )
    writer(
        Snapshot(
            stage="supernet",
            step=step,
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


# --- a checkpoint is bound to the settings that made it --------------------------------


def fedoras_settings(**overrides) -> dict:
    """The bound settings of a FedorAS run of the app's run config (seed 3) with ``overrides``."""
    settings = parse_run_config({**pyproject_run_config(), "seed": 3, **overrides})
    return bound_settings(settings.method, settings.values)


def resume_with(path: Path, space, settings, **checks):
    return read_resume(
        str(path),
        method="fedoras",
        seed=3,
        reference=space.state_dict(),
        space=space.spec,
        settings=settings,
        **checks,
    )


def test_a_resume_with_other_settings_is_refused_naming_every_key_and_both_values(space, tmp_path):
    path = checkpoint(tmp_path, space, settings=fedoras_settings())
    changed = {
        "fedoras.lr": 0.5,
        "data.partitioner": "iid",
        "fedoras.clients-per-round": 3,
        "data.seed": 11,
    }
    before = parse_run_config({**pyproject_run_config(), "seed": 3}).values
    with pytest.raises(ValueError, match="other settings") as error:
        resume_with(path, space, fedoras_settings(**changed))
    message = str(error.value)
    assert str(path) in message
    for key, value in changed.items():
        assert f"{key!r} = {before[key]!r} there, {value!r} here" in message
    assert "'seed'" not in message.split("may change")[1]  # only the keys that differ


def test_a_resume_may_change_the_safe_keys_and_other_methods_tables(space, tmp_path):
    path = checkpoint(tmp_path, space, settings=fedoras_settings())
    safe = {
        "output-dir": str(tmp_path / "elsewhere"),
        "checkpoint-every": 5,
        "device": "cpu",
        "reply-timeout": 30.0,
        "min-nodes": 1,
        "onnx": False,
        "data.cache-dir": str(tmp_path / "cache"),
        "fedoras.stop-after": "search",
        "dpfnas.noise-weights": 4.0,  # DP-FNAS's table: no part of a FedorAS state
    }
    assert {k for k in safe if not k.startswith("dpfnas.")} <= resume_safe_keys("fedoras")
    assert "fedoras.stop-after" not in RESUME_SAFE_KEYS  # FedorAS's own (its settings class)
    resume = resume_with(path, space, fedoras_settings(**safe))
    assert resume.step == 2


def test_a_checkpoint_without_its_settings_is_refused(space, tmp_path):
    path = checkpoint(tmp_path, space, settings=fedoras_settings())
    content = torch.load(path, weights_only=True)
    del content["settings"]
    with pytest.raises(ValueError, match="'settings' = None"):
        resume_with(write(tmp_path, content), space, fedoras_settings())
    with pytest.raises(ValueError, match="'format' = 1.*records no run settings"):
        resume_with(write(tmp_path, {**content, "format": 1}), space, fedoras_settings())


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"step": 4}, "'step' = 4 of stage 'supernet', which has 3 rounds; allowed: 0..3"),
        ({"step": -1}, "'step' = -1, expected an integer >= 0"),
        ({"step": 1.5}, "'step' = 1.5, expected an integer >= 0"),
        ({"stage": "warmup"}, "'stage' = 'warmup' is not a stage of fedoras"),
        ({"stage-done": "yes"}, "'stage-done' = 'yes', expected true or false"),
    ],
)
def test_a_step_or_stage_out_of_range_is_refused(space, tmp_path, change, fragment):
    path = checkpoint(tmp_path, space)
    content = {**torch.load(path, weights_only=True), **change}
    stages = {"supernet": 3, "search": None, "finetune": None}
    with pytest.raises(ValueError, match=fragment.replace("(", "\\(").replace(")", "\\)")):
        resume_with(write(tmp_path, content), space, None, stages=stages)
    assert resume_with(path, space, None, stages=stages).step == 2


def ledger_of(stage: str = "supernet") -> dict:
    ledger = Ledger()
    ledger.sent(stage, 5, 100)
    ledger.received(stage, 5, 80, train_flops=7)
    return ledger.summary()


@pytest.mark.parametrize(
    ("corrupt", "fragment"),
    [
        (lambda led: led["supernet"]["nodes"]["5"].update(bytes_up=-80), "'bytes_up'\\] = -80"),
        (lambda led: led["supernet"]["totals"].update(messages=-1), "'messages'\\] = -1"),
        (lambda led: led["supernet"]["nodes"]["5"].update(replies=1.5), "'replies'\\] = 1.5"),
        (lambda led: led["supernet"]["nodes"]["5"].update(failed=True), "'failed'\\] = True"),
        (lambda led: led["supernet"]["nodes"]["5"].update(stolen=1), "unknown counter 'stolen'"),
        (lambda led: led["supernet"].update(seconds=-2.0), "'seconds'\\] = -2.0"),
        (lambda led: led["supernet"]["nodes"].update(x={}), "node id 'x'"),
    ],
)
def test_a_ledger_with_negative_or_foreign_counters_is_refused(space, tmp_path, corrupt, fragment):
    path = checkpoint(tmp_path, space)
    content = torch.load(path, weights_only=True)
    content["ledger"] = ledger_of()
    assert resume_with(write(tmp_path, content, "good.pt"), space, None).ledger
    corrupt(content["ledger"])
    with pytest.raises(ValueError, match="'ledger' .*" + fragment) as error:
        resume_with(write(tmp_path, content), space, None)
    assert "bad.pt" in str(error.value)
    with pytest.raises(ValueError, match="ledger to restore"):
        Ledger().restore(content["ledger"])


@pytest.mark.parametrize(
    "key",
    [
        "fedoras.rounds",
        "fedoras.finetune-rounds",
        "fdnas.rounds",
        "fdnas.cluster-rounds",
        "dpfnas.iterations",
    ],
)
def test_zero_rounds_of_a_stage_that_must_run_are_refused(key):
    with pytest.raises(ValueError, match=f"run config '{key}' = 0: allowed: >= 1"):
        parse_run_config({**pyproject_run_config(), key: 0})


def test_a_checkpoint_is_written_every_round_by_default():
    base = {k: v for k, v in pyproject_run_config().items() if k != "checkpoint-every"}
    assert parse_run_config(base).checkpoint_every == 1
    assert pyproject_run_config()["checkpoint-every"] == 1


@pytest.mark.parametrize(
    "settings", [{1: "x"}, {"fedoras.lr": torch.zeros(2)}, {"seed": None}], ids=str
)
def test_settings_of_another_type_are_refused_naming_the_field(space, tmp_path, settings):
    # a corrupt 'settings' (a non-text key, a tensor, None) is a ValueError naming it,
    # not a TypeError / RuntimeError from comparing it
    path = checkpoint(tmp_path, space, settings=fedoras_settings())
    content = {**torch.load(path, weights_only=True), "settings": settings}
    with pytest.raises(ValueError, match="'settings' = .*expected a dict of run-config keys"):
        resume_with(write(tmp_path, content), space, fedoras_settings())


def test_the_global_test_set_binds_a_checkpoint_only_when_on(space, tmp_path):
    off = fedoras_settings()
    # off, the data is what it was before the keys existed: a checkpoint written then resumes
    assert not {"data.global-test", "data.global-test-fraction"} & set(off)
    assert fedoras_settings(**{"data.global-test-fraction": 0.3}) == off
    on = fedoras_settings(**{"data.global-test": True})
    assert on["data.global-test"] is True and on["data.global-test-fraction"] == 0.1
    path = checkpoint(tmp_path, space, settings=off)
    with pytest.raises(ValueError, match=r"'data.global-test' = '\(absent\)' there, True here"):
        resume_with(path, space, on)


@pytest.mark.parametrize("method", ["heterofl", "fjord"])
def test_the_lr_probe_off_binds_as_before_the_key_existed(method):
    """A width-baseline checkpoint written before ``<method>.lr-probe`` trained at lr as
    given: a resume with the probe off binds without the key (and resumes it), one with the
    probe on (the default) binds it, so that checkpoint is refused naming the key."""
    base = {**pyproject_run_config(), "method": method}
    off = parse_run_config({**base, f"{method}.lr-probe": False})
    on = parse_run_config(base)
    assert f"{method}.lr-probe" not in bound_settings(method, off.values)
    assert bound_settings(method, on.values)[f"{method}.lr-probe"] is True
