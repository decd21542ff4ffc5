"""Resuming: a checkpoint continues only the configuration that made it (issue 31, item 3).

Through the ServerApp's ``main`` on a grid that fails at the first training instruction:
a resume whose run config differs from the checkpoint's in a key that is not on the safe
list (``config.RESUME_SAFE_KEYS``), or whose file holds a step beyond the stage's
rounds, an unknown stage or a ledger with negative counters, is refused before any
training with a ``ValueError`` naming the file and the key or field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import ArrayRecord

from fedorasflwr.checkpoints import Checkpointer, Snapshot
from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import bound_settings, parse_run_config
from fedorasflwr.ledger import Ledger
from fedorasflwr.runs import build_supernet
from tests.reliability.conftest import NoTrainingGrid
from tests.runconfig import tiny_fedoras
from tests.strategies.test_dpfnas_strategy import tiny_dpfnas
from tests.test_checkpoints import result_of, run_main

STAGE = {"fedoras": "supernet", "dpfnas": "search"}


def written(config: dict[str, Any], out: Path) -> Path:
    """A checkpoint after one round of the run of ``config``, as its run writes it."""
    out.mkdir(parents=True, exist_ok=True)
    settings = parse_run_config(config)
    space = build_supernet(settings)
    ledger = Ledger()
    ledger.sent(STAGE[settings.method], 1, 10)
    Checkpointer(
        out,
        method=settings.method,
        seed=settings.seed,
        space=space.spec,
        every=1,
        settings=bound_settings(settings.method, settings.values),
    )(Snapshot(STAGE[settings.method], 1, ArrayRecord(space.state_dict()), ledger, history=[]))
    return out / "checkpoint.pt"


def refused(config: dict[str, Any], path: Path, tmp_path: Path, fragment: str) -> None:
    config = {**config, "output-dir": str(tmp_path / "out"), "resume-from": str(path)}
    with pytest.raises(ValueError, match=fragment) as error:
        run_main(NoTrainingGrid(client_app, config, 2), config)
    assert str(path) in str(error.value)
    (run_dir,) = (tmp_path / "out").iterdir()
    assert result_of(run_dir)["status"]["finished"] is False


def base(method: str, data_cache) -> dict[str, Any]:
    if method == "dpfnas":
        return tiny_dpfnas(data_cache, **{"dpfnas.iterations": 3})
    return tiny_fedoras(data_cache, **{"fedoras.rounds": 3})


@pytest.mark.parametrize(
    ("method", "change"),
    [
        ("fedoras", {"fedoras.lr": 0.5}),
        ("fedoras", {"data.partitioner": "dirichlet"}),
        ("fedoras", {"fedoras.clients-per-round": 3}),
        ("fedoras", {"data.seed": 9}),
        ("fedoras", {"aggregation": "median", "fedoras.rounds": 4}),
        ("dpfnas", {"dpfnas.noise-weights": 4.0}),
        ("dpfnas", {"dpfnas.batch-size": 16, "dpfnas.accountant": "prv"}),
    ],
    ids=lambda v: ",".join(v) if isinstance(v, dict) else v,
)
def test_a_resume_with_other_settings_is_refused_before_training(
    data_cache, tmp_path, method, change
):
    config = base(method, data_cache)
    path = written(config, tmp_path / "written")
    before = parse_run_config(config).values
    fragment = "other settings.*" + ".*".join(
        f"'{key}' = {before[key]!r} there, {value!r} here" for key, value in sorted(change.items())
    )
    refused({**config, **change}, path, tmp_path, fragment)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"step": 7}, "'step' = 7 of stage 'supernet', which has 3 rounds"),
        ({"stage": "pretraining"}, "'stage' = 'pretraining' is not a stage of fedoras"),
        ({"ledger": {"supernet": {"nodes": {"1": {"messages": -1}}}}}, "'messages'\\] = -1"),
        ({"format": 1}, "'format' = 1"),
    ],
    ids=["step-beyond-rounds", "unknown-stage", "negative-ledger", "no-settings"],
)
def test_a_checkpoint_out_of_range_is_refused_before_training(
    data_cache, tmp_path, change, fragment
):
    config = base("fedoras", data_cache)
    path = written(config, tmp_path / "written")
    torch.save({**torch.load(path, weights_only=True), **change}, path)
    refused(config, path, tmp_path, fragment)
