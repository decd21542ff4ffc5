"""Checkpoints and resuming, end to end through the ServerApp's ``main`` on the
in-process grid: a run stopped after round k and resumed from its checkpoint ends
where the run never stopped ends; a run failing in a later stage keeps what it
finished and a ``result.json`` saying where it stopped."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import Context, Message, RecordDict

from fedorasflwr.artifacts import load_checkpoint
from fedorasflwr.client_app import app as client_app
from fedorasflwr.federation.base import StageFailedError
from fedorasflwr.inprocess import InProcessGrid, error_reply
from fedorasflwr.methods.decnas.messages import DECNAS_TUNE
from fedorasflwr.methods.dpfnas.contract import DPFNAS_WEIGHTS
from fedorasflwr.methods.fdnas.messages import FDNAS_SEARCH
from fedorasflwr.methods.fedoras.messages import FEDORAS_PATHS, FEDORAS_SUPERNET
from fedorasflwr.protocol import CONFIG
from fedorasflwr.server_app import main
from tests.runconfig import FEW_ROWS, tiny_decnas, tiny_fdnas, tiny_fedoras
from tests.strategies.test_dpfnas_strategy import tiny_dpfnas

NUM_NODES = 12


class SuperLinkGoneError(ConnectionError):
    """What the test raises in place of a SuperLink that went away."""


class StoppingGrid(InProcessGrid):
    """An in-process grid that dies when asked to send ``message_type`` of round ``stop``."""

    def __init__(self, *args: Any, message_type: str, stop: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.message_type, self.stop = message_type, stop

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        messages = list(messages)
        for message in messages:
            config = message.content.config_records.get(CONFIG, {})
            if (
                message.metadata.message_type == self.message_type
                and config.get("server-round") == self.stop
            ):
                raise SuperLinkGoneError(f"stopped before round {self.stop}")
        return super().send_and_receive(messages, timeout=timeout)


def run_main(grid: InProcessGrid, config: dict[str, Any]) -> Path:
    """Run the ServerApp's ``main``; the run directory it wrote (even when it raised)."""
    context = Context(run_id=7, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    try:
        main(grid, context)
    finally:
        (run_dir,) = Path(config["output-dir"]).iterdir()
    return run_dir


def result_of(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "result.json").read_text())


def without_seconds(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in h.items() if k != "seconds"} for h in history]


def assert_same_weights(a: Path, b: Path) -> None:
    first, second = load_checkpoint(a)["state_dict"], load_checkpoint(b)["state_dict"]
    assert first.keys() == second.keys()
    for key, tensor in first.items():
        assert tensor.dtype == second[key].dtype
        assert torch.equal(tensor, second[key]), key


def stage_totals(result: dict[str, Any], stage: str) -> dict[str, int]:
    return result["ledger"][stage]["totals"]


# --- FedorAS Stage 1 ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def fedoras_runs(data_cache, tmp_path_factory):
    """One 3-round Stage 1 never interrupted; one stopped before round 3 (checkpoint
    every round); and that one resumed from its checkpoint."""
    base = tiny_fedoras(
        data_cache,
        **{
            "fedoras.rounds": 3,
            "fedoras.stop-after": "supernet",
            "checkpoint-every": 1,
            "fedoras.lr-probe": True,  # a resumed run keeps the rate the probe chose
        },
        **FEW_ROWS,  # a resume equals the run never stopped at any data size
    )
    root = tmp_path_factory.mktemp("fedoras")

    def config(name: str, **extra: Any) -> dict[str, Any]:
        return {**base, "output-dir": str(root / name), **extra}

    whole = run_main(InProcessGrid(client_app, config("whole"), NUM_NODES), config("whole"))
    stopped_config = config("stopped")
    grid = StoppingGrid(
        client_app, stopped_config, NUM_NODES, message_type=FEDORAS_SUPERNET, stop=3
    )
    with pytest.raises(SuperLinkGoneError):
        run_main(grid, stopped_config)
    (stopped,) = (root / "stopped").iterdir()
    resumed_config = config("resumed", **{"resume-from": str(stopped / "checkpoint.pt")})
    resumed = run_main(InProcessGrid(client_app, resumed_config, NUM_NODES), resumed_config)
    return whole, stopped, resumed


def test_a_stopped_stage1_keeps_its_checkpoint_and_says_where_it_stopped(fedoras_runs):
    _, stopped, _ = fedoras_runs
    status = result_of(stopped)["status"]
    assert status["finished"] is False
    assert (status["stage"], status["step"], status["stage_done"]) == ("supernet", 2, False)
    assert status["checkpoint"] == "checkpoint.pt"
    assert "SuperLinkGoneError" in status["error"]
    checkpoint = load_checkpoint(stopped / "checkpoint.pt")
    assert (checkpoint["stage"], checkpoint["step"]) == ("supernet", 2)
    assert [h["round"] for h in checkpoint["history"]] == [0, 1, 2]
    assert not (stopped / "supernet.pt").exists()  # Stage 1 never ended
    assert not list(stopped.glob(".*.tmp"))


def test_a_resumed_stage1_equals_the_uninterrupted_one(fedoras_runs):
    whole, _, resumed = fedoras_runs
    assert_same_weights(whole / "supernet.pt", resumed / "supernet.pt")
    first, second = result_of(whole), result_of(resumed)
    assert second["status"]["finished"] is True
    assert second["resumed_from"].endswith("checkpoint.pt")
    assert [h["round"] for h in second["history"]] == [0, 1, 2, 3]
    assert without_seconds(second["history"]) == without_seconds(first["history"])
    assert first["tiers"] == second["tiers"]
    assert stage_totals(second, "supernet") == stage_totals(first, "supernet")
    # the resumed run profiled the nodes again: that traffic is counted, not hidden
    assert stage_totals(second, "profile")["messages"] == 2 * NUM_NODES
    # Stage 1's lr probe (issue 40) ran on the server's slice before round 1, from the
    # configured rate down; the resumed run probed the same initial supernet and kept the same
    probe = first["lr_probe"]
    assert second["lr_probe"] == probe
    assert probe["configured"] == probe["tried"][0]["lr"] == 0.05 and probe["steps"] == 48
    assert probe["lr"] == probe["tried"][-1]["lr"]
    assert probe["tried"][-1]["max_loss"] <= probe["bound"] or probe["lr"] == 0.05 / 32


def test_a_resumed_stage1_sends_only_the_rounds_left(data_cache, fedoras_runs, tmp_path):
    _, stopped, _ = fedoras_runs
    config = tiny_fedoras(
        data_cache,
        **{
            "fedoras.rounds": 3,
            "fedoras.stop-after": "supernet",
            "fedoras.lr-probe": True,  # as the stopped run (fedoras_runs)
            "output-dir": str(tmp_path / "out"),
            "resume-from": str(stopped / "checkpoint.pt"),
        },
        **FEW_ROWS,
    )
    grid = InProcessGrid(client_app, config, NUM_NODES)
    run_main(grid, config)
    rounds = {
        m.content.config_records[CONFIG]["server-round"]
        for m in grid.sent
        if m.metadata.message_type == FEDORAS_SUPERNET
    }
    assert rounds == {3}


def test_a_search_failure_keeps_the_supernet_and_says_it_stopped_in_the_search(
    data_cache, tmp_path
):
    config = tiny_fedoras(
        data_cache,
        **{
            "fedoras.stop-after": "search",
            "fedoras.search-scoring": "federated",
            "output-dir": str(tmp_path / "out"),
        },
    )

    def refuse_search(reply: Message) -> Message:
        if reply.metadata.message_type == FEDORAS_PATHS:
            return error_reply(reply, "scoring crashed")
        return reply

    faults = {pid: refuse_search for pid in range(NUM_NODES)}
    grid = InProcessGrid(client_app, config, NUM_NODES, faults=faults)
    with pytest.raises(StageFailedError):
        run_main(grid, config)
    (run_dir,) = (tmp_path / "out").iterdir()
    supernet = load_checkpoint(run_dir / "supernet.pt")
    assert (supernet["stage"], supernet["step"], supernet["stage-done"]) == ("supernet", 2, True)
    result = result_of(run_dir)
    assert result["status"]["finished"] is False
    assert result["status"]["stage"] == "search"
    assert "StageFailedError" in result["status"]["error"]
    assert "scoring crashed" in result["status"]["error"]
    assert [h["round"] for h in result["history"]] == [0, 1, 2]
    assert result["ledger"]["supernet"]["totals"]["messages"] == 2 * 6


# --- DP-FNAS -------------------------------------------------------------------------------


def dpfnas_runs(base: dict[str, Any], root: Path, stop: int) -> tuple[Path, Path, Path]:
    def config(name: str, **extra: Any) -> dict[str, Any]:
        return {**base, "output-dir": str(root / name), **extra}

    whole = run_main(InProcessGrid(client_app, config("whole"), 2), config("whole"))
    grid = StoppingGrid(client_app, config("stopped"), 2, message_type=DPFNAS_WEIGHTS, stop=stop)
    with pytest.raises(SuperLinkGoneError):
        run_main(grid, config("stopped"))
    (stopped,) = (root / "stopped").iterdir()
    resumed_config = config("resumed", **{"resume-from": str(stopped / "checkpoint.pt")})
    resumed = run_main(InProcessGrid(client_app, resumed_config, 2), resumed_config)
    return whole, stopped, resumed


def test_a_resumed_dpfnas_search_equals_the_uninterrupted_one(data_cache, tmp_path):
    """Mode ``fnas`` (no noise, so every step is deterministic whatever the noise source),
    second-order architecture gradients and server momentum on both W and A: after a
    stop before iteration 3, the resumed run's supernet, derived network, history and
    ledger of the search equal the uninterrupted run's bit for bit."""
    base = tiny_dpfnas(
        data_cache,
        **{
            "dpfnas.mode": "fnas",
            "dpfnas.iterations": 3,
            "dpfnas.order": 2,
            "checkpoint-every": 2,
            "space.layers-per-block": 1,  # one cell: the second-order gradient dominates
        },
        **FEW_ROWS,
    )
    whole, stopped, resumed = dpfnas_runs(base, tmp_path, stop=3)
    assert result_of(stopped)["status"]["step"] == 2
    assert_same_weights(whole / "supernet.pt", resumed / "supernet.pt")
    assert_same_weights(whole / "derived.pt", resumed / "derived.pt")
    first, second = result_of(whole), result_of(resumed)
    assert without_seconds(second["history"]) == without_seconds(first["history"])
    assert second["genotype"] == first["genotype"]
    for stage in ("weights", "arch"):
        assert stage_totals(second, stage) == stage_totals(first, stage)
    assert second["privacy"] == first["privacy"]


def test_a_resumed_private_search_spends_the_same_epsilon(data_cache, tmp_path):
    """Mode ``dpfnas`` (noised): the noise may come from a source the server cannot
    regenerate, so only the accounting is compared: the accountant's steps per party and
    mechanism carry over, and the resumed run reports the epsilon (per iteration and per
    party) of the run never stopped."""
    base = tiny_dpfnas(
        data_cache,
        **{
            "dpfnas.iterations": 3,
            "dpfnas.final-rounds": 0,
            "checkpoint-every": 1,
            "space.layers-per-block": 1,
        },
        **FEW_ROWS,
    )
    whole, stopped, resumed = dpfnas_runs(base, tmp_path, stop=2)
    saved = load_checkpoint(stopped / "checkpoint.pt")["progress"]["steps"]
    assert {pid: steps for pid, steps in saved.items()} == {
        "0": {"weights": 1, "arch": 1},
        "1": {"weights": 1, "arch": 1},
    }
    first, second = result_of(whole), result_of(resumed)
    assert [h["epsilon"] for h in second["history"][1:]] == [
        h["epsilon"] for h in first["history"][1:]
    ]
    assert second["privacy"] == first["privacy"]
    assert all(p["weights"]["steps"] == 3 for p in second["privacy"])


# --- FDNAS and DecNAS ------------------------------------------------------------------------


def stopped_and_resumed(
    base: dict[str, Any], root: Path, num_nodes: int, message_type: str, stop: int
) -> tuple[Path, Path, Path]:
    """The run never stopped, the run stopped at ``message_type`` of round ``stop``, and
    that run resumed from its checkpoint."""

    def config(name: str, **extra: Any) -> dict[str, Any]:
        return {**base, "output-dir": str(root / name), **extra}

    whole = run_main(InProcessGrid(client_app, config("whole"), num_nodes), config("whole"))
    grid = StoppingGrid(
        client_app, config("stopped"), num_nodes, message_type=message_type, stop=stop
    )
    with pytest.raises(SuperLinkGoneError):
        run_main(grid, config("stopped"))
    (stopped,) = (root / "stopped").iterdir()
    resumed_config = config("resumed", **{"resume-from": str(stopped / "checkpoint.pt")})
    resumed = run_main(InProcessGrid(client_app, resumed_config, num_nodes), resumed_config)
    return whole, stopped, resumed


def test_a_resumed_fdnas_search_equals_the_uninterrupted_one(data_cache, tmp_path):
    base = tiny_fdnas(data_cache, **{"fdnas.rounds": 2, "checkpoint-every": 1, **FEW_ROWS})
    whole, stopped, resumed = stopped_and_resumed(base, tmp_path, 10, FDNAS_SEARCH, stop=2)
    assert result_of(stopped)["status"] | {"error": None} == {
        "state": "failed",
        "finished": False,
        "stage": "search",
        "step": 1,
        "stage_done": False,
        "checkpoint": "checkpoint.pt",
        "error": None,
    }
    for name in ("supernet.pt", "fdnas.pt"):
        assert_same_weights(whole / name, resumed / name)
    first, second = result_of(whole), result_of(resumed)
    assert without_seconds(second["search_history"]) == without_seconds(first["search_history"])
    assert second["nets"] == first["nets"]
    assert stage_totals(second, "search") == stage_totals(first, "search")


def test_a_resumed_decnas_continues_after_its_last_global_model(data_cache, tmp_path):
    base = tiny_decnas(
        data_cache, **{"decnas.max-iterations": 2, "checkpoint-every": 1, **FEW_ROWS}
    )
    whole, stopped, resumed = stopped_and_resumed(base, tmp_path, 6, DECNAS_TUNE, stop=2001)
    checkpoint = load_checkpoint(stopped / "checkpoint.pt")
    assert (checkpoint["stage"], checkpoint["step"]) == ("iterations", 1)
    assert [m["iteration"] for m in checkpoint["progress"]["frontier"]] == [0, 1]
    assert checkpoint["space"] == checkpoint["progress"]["frontier"][-1]["spec"]
    first, second = result_of(whole), result_of(resumed)
    assert [m["iteration"] for m in second["frontier"]] == [0, 1, 2]
    for name in ("gm-1.pt", "gm-2.pt", "gm-2-tuned.pt"):
        assert_same_weights(whole / name, resumed / name)
    assert second["frontier"] == first["frontier"]
    assert second["history"] == first["history"]
    assert second["groups"] == first["groups"]


def test_a_resume_with_other_tiers_is_refused_before_training(data_cache, fedoras_runs, tmp_path):
    """Other tiers and another learning rate: the checkpoint is bound to its run config, so
    the resume is refused naming both keys with both values (``stop-after`` and
    ``checkpoint-every`` differ too, and may)."""
    _, stopped, _ = fedoras_runs
    config = tiny_fedoras(
        data_cache,
        **{
            "fedoras.rounds": 3,
            "fedoras.num-tiers": 3,
            "fedoras.lr": 0.5,
            "fedoras.lr-probe": True,  # as the stopped run (fedoras_runs)
            "output-dir": str(tmp_path / "out"),
            "resume-from": str(stopped / "checkpoint.pt"),
        },
        **FEW_ROWS,
    )
    grid = InProcessGrid(client_app, config, NUM_NODES)
    fragment = "resume-from.*other settings.*'fedoras.lr' = 0.05 there, 0.5 here"
    with pytest.raises(ValueError, match=fragment + "; 'fedoras.num-tiers' = 4 there, 3 here$"):
        run_main(grid, config)
    assert not [m for m in grid.sent if m.metadata.message_type == FEDORAS_SUPERNET]
    (run_dir,) = (tmp_path / "out").iterdir()
    assert "'fedoras.num-tiers' = 4 there" in result_of(run_dir)["status"]["error"]


# --- FedNAS --------------------------------------------------------------------------------


def test_a_resumed_fednas_search_equals_the_uninterrupted_one(data_cache, tmp_path):
    """After a stop before search round 3 the resumed run's supernet, derived network,
    history (alpha entropies included) and test accuracy equal the uninterrupted run's."""
    from fedorasflwr.methods.fednas.messages import FEDNAS_SEARCH
    from tests.runconfig import tiny_fednas

    base = tiny_fednas(data_cache, **{"fednas.rounds": 3, "checkpoint-every": 1, **FEW_ROWS})

    def config(name: str, **extra: Any) -> dict[str, Any]:
        return {**base, "output-dir": str(tmp_path / name), **extra}

    whole = run_main(InProcessGrid(client_app, config("whole"), 2), config("whole"))
    grid = StoppingGrid(client_app, config("stopped"), 2, message_type=FEDNAS_SEARCH, stop=3)
    with pytest.raises(SuperLinkGoneError):
        run_main(grid, config("stopped"))
    (stopped,) = (tmp_path / "stopped").iterdir()
    assert result_of(stopped)["status"]["step"] == 2
    resumed_config = config("resumed", **{"resume-from": str(stopped / "checkpoint.pt")})
    grid = InProcessGrid(client_app, resumed_config, 2)
    resumed = run_main(grid, resumed_config)
    rounds = {
        m.content.config_records[CONFIG]["server-round"]
        for m in grid.sent
        if m.metadata.message_type == FEDNAS_SEARCH
    }
    assert rounds == {3}
    assert_same_weights(whole / "supernet.pt", resumed / "supernet.pt")
    assert_same_weights(whole / "derived.pt", resumed / "derived.pt")
    first, second = result_of(whole), result_of(resumed)
    assert without_seconds(second["history"]) == without_seconds(first["history"])
    assert second["genotype"] == first["genotype"]
    assert second["test_accuracy"] == first["test_accuracy"]
