"""Runnable trials of the reliability catalogue, shared by ``tests/reliability`` and
``benchmarks/faults.py``: each returns one row per fault tried, saying how it was handled."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Message

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.federation.replies import content_bytes
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.packing import unpack_content
from fedorasflwr.server_app import runner
from tests.reliability.catalog import (
    PROFILE_FAULTS,
    REPLY_FAULTS,
    SEMANTIC,
    bad_configs,
    profile_fault,
    reply_fault,
)
from tests.reliability.conftest import NoTrainingGrid, TrainingStartedError
from tests.runconfig import (
    pyproject_run_config,
    tiny_decnas,
    tiny_fdnas,
    tiny_fednas,
    tiny_fedoras,
)

__all__ = ["BASELINES", "METHODS", "config_trial", "profile_trial", "reply_trial", "run_config_for"]

KINDS = list(REPLY_FAULTS)
METHODS = ("fedoras", "fdnas", "decnas", "dpfnas", "fednas")
#: the width-scaling baselines: their reply trial too (``run_config_for``)
BASELINES = ("heterofl", "fjord")
NODES = len(KINDS) + 3  # one node per fault kind, three honest ones


def run_config_for(method: str, cache: Path | str) -> dict[str, Any]:
    """A tiny run config of ``method`` in which every node trains every round."""
    if method == "fedoras":
        return tiny_fedoras(
            cache,
            **{
                "fedoras.stop-after": "supernet",
                "fedoras.clients-per-round": NODES,
                "fedoras.rounds": 2,  # a stale reply re-sends an earlier round's update
            },
        )
    if method == "fdnas":
        return tiny_fdnas(
            cache,
            **{
                "fdnas.final-rounds": 0,
                "fdnas.clients-per-round": NODES,
                "fdnas.rounds": 2,  # a stale reply re-sends an earlier round's update
            },
        )
    if method == "decnas":
        return tiny_decnas(cache, **{"decnas.num-groups": 3})
    if method == "dpfnas":
        return {
            **pyproject_run_config(),
            "method": "dpfnas",
            "data.cache-dir": str(cache),
            "onnx": False,
            "data.partitioner": "iid",
            "space.name": "darts",
            "space.width": 0.25,
            "space.layers-per-block": 2,
            "dpfnas.mode": "fnas",  # no noise: the two runs must agree to the bit
            "dpfnas.iterations": 1,
            "dpfnas.batch-size": 8,
            "dpfnas.eval-every": 0,
            "dpfnas.final-rounds": 0,
        }
    if method == "fednas":
        return tiny_fednas(
            cache,
            **{
                "fednas.final-rounds": 0,
                "fednas.rounds": 2,  # a stale reply re-sends an earlier round's update
            },
        )
    if method in BASELINES:
        return {
            **pyproject_run_config(),
            "method": method,
            "data.cache-dir": str(cache),
            "onnx": False,
            f"{method}.rounds": 2,  # a stale reply re-sends an earlier round's update
            f"{method}.batch-size": 64,
        }
    raise ValueError(method)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _run(
    method: str, config: dict[str, Any], faults, out_dir: Path, nodes: int = NODES, on_grid=None
):
    settings = parse_run_config(config)
    grid = InProcessGrid(client_app, config, nodes, faults=faults)
    if on_grid is not None:
        on_grid(grid)
    out_dir.mkdir(parents=True, exist_ok=True)
    return grid, runner(method)(grid, settings, out_dir)


def comparable(document: dict[str, Any]) -> Any:
    """A result document without wall times, file names, the ledger (which by design
    differs between a dropped reply and a missing one) and the ONNX check (the weights
    themselves are compared by ``same_weights``)."""
    drop = {"ledger", "files", "onnx"}

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: clean(v)
                for k, v in value.items()
                if str(k) not in drop and "seconds" not in str(k)
            }
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return json.loads(json.dumps(clean(document), default=str))


def same_weights(first: Path, second: Path) -> bool:
    """Whether the two run directories hold the same weight files, equal to the bit."""
    import torch

    names = sorted(p.relative_to(first) for p in first.rglob("*.pt"))
    if names != sorted(p.relative_to(second) for p in second.rglob("*.pt")):
        return False
    for name in names:
        a = torch.load(first / name, weights_only=True)["state_dict"]
        b = torch.load(second / name, weights_only=True)["state_dict"]
        if a.keys() != b.keys() or not all(torch.equal(a[k], b[k]) for k in a):
            return False
    return True


def reply_trial(
    method: str, cache: Path | str, out_dir: Path, smaller: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One run of ``method`` in which node i sends the i-th kind of bad reply, and one in
    which those replies are never sent.  Per kind: whether a WARNING named the node and
    whether its replies were booked as rejected or failed; plus whether the two runs'
    results and every weight file they wrote are identical to the bit (the bad replies
    corrupted nothing), and how many replies of the honest nodes were dropped (none may be:
    e.g. the size bound, ``REPLY_MARGIN``, must leave every honest reply through) and the
    most bytes an honest reply carried beyond what its node was sent (``honest-excess``).
    ``smaller``: run-config overrides over ``run_config_for``'s (a smoke run's)."""
    config = {**run_config_for(method, cache), **(smaller or {})}
    handler = _Records()
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addHandler(handler)
    excess: list[int] = []  # honest replies: content bytes beyond what their node was sent
    grids: list[InProcessGrid] = []

    def measured(reply: Message) -> Message:
        if not reply.has_error():  # the grid's last message sent is this reply's instruction
            sent = content_bytes(unpack_content(grids[0].sent[-1].content))  # as the server
            excess.append(content_bytes(reply.content) - sent)
        return reply

    try:
        faults = {pid: reply_fault(kind) for pid, kind in enumerate(KINDS)}
        faults |= {pid: measured for pid in range(len(KINDS), NODES)}
        grid, attacked = _run(method, config, faults, out_dir / "attacked", on_grid=grids.append)
    finally:
        flwr_logger.removeHandler(handler)
    quiet_faults = {pid: reply_fault(kind, silent=True) for pid, kind in enumerate(KINDS)}
    _, quiet = _run(method, config, quiet_faults, out_dir / "quiet")
    identical = comparable(attacked) == comparable(quiet) and same_weights(
        out_dir / "attacked", out_dir / "quiet"
    )
    stages = attacked.get("ledger", {})
    rows = []
    for pid, kind in enumerate(KINDS):
        node = grid.node_of_partition[pid]
        booked = sum(
            stage["nodes"].get(str(node), {}).get(what, 0)
            for stage in stages.values()
            for what in ("rejected", "failed")
        )
        rows.append(
            {
                "method": method,
                "kind": kind,
                "node": node,
                "logged": any(f"node {node}" in line for line in handler.lines),
                "booked": booked,
                "corrupted-nothing": identical,
            }
        )
    honest = set(grid.contexts) - {grid.node_of_partition[pid] for pid in range(len(KINDS))}
    honest_dropped = sum(
        stage["nodes"].get(str(node), {}).get(what, 0)
        for stage in stages.values()
        for node in honest
        for what in ("rejected", "failed")
    )
    return {
        "rows": rows,
        "identical": identical,
        "honest-dropped": honest_dropped,
        "honest-excess": max(excess),
    }


def profile_trial(
    method: str, cache: Path | str, out_dir: Path, smaller: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One run of ``method`` in which node i sends the i-th kind of bad profile
    (``PROFILE_FAULTS``), and one in which those nodes send no profile at all. Per kind:
    whether a WARNING named the node, whether it was booked as rejected, and whether the
    run was lost (it raised); plus whether the two runs' results and weight files are
    identical to the bit (the bad profiles reshaped nothing)."""
    kinds = list(PROFILE_FAULTS)
    nodes = len(kinds) + 3  # three honest nodes besides
    config = {**run_config_for(method, cache), **(smaller or {})}
    handler = _Records()
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addHandler(handler)
    faults = {pid: profile_fault(kind) for pid, kind in enumerate(kinds)}
    grid = InProcessGrid(client_app, config, nodes, faults=faults)
    lost = ""
    try:
        (out_dir / "attacked").mkdir(parents=True, exist_ok=True)
        attacked = runner(method)(grid, parse_run_config(config), out_dir / "attacked")
    except Exception as exc:  # noqa: BLE001 - a lost run is what this trial counts
        attacked, lost = {}, f"{type(exc).__name__}: {exc}"
    finally:
        flwr_logger.removeHandler(handler)
    quiet_faults = {pid: profile_fault(kind, silent=True) for pid, kind in enumerate(kinds)}
    _, quiet = _run(method, config, quiet_faults, out_dir / "quiet", nodes)
    identical = (
        not lost
        and comparable(attacked) == comparable(quiet)
        and same_weights(out_dir / "attacked", out_dir / "quiet")
    )
    profile = attacked.get("ledger", {}).get("profile", {}).get("nodes", {})
    rows = []
    for pid, kind in enumerate(kinds):
        node = grid.node_of_partition[pid]
        rows.append(
            {
                "method": method,
                "kind": kind,
                "node": node,
                "logged": any(f"node {node}" in line for line in handler.lines),
                "booked": profile.get(str(node), {}).get("rejected", 0),
                "lost": lost,
                "corrupted-nothing": identical,
            }
        )
    return {"rows": rows, "identical": identical, "lost": lost}


def config_trial(cache: Path | str, out_dir: Path) -> list[dict[str, Any]]:
    """Every bad config of the catalogue: refused with a ValueError naming its key, before
    any training (the semantic ones go through the method's runner on a grid that stops
    at the first training instruction)."""
    defaults = pyproject_run_config()
    rows = []
    for index, bad in enumerate(bad_configs(defaults)):
        config = {**defaults, "data.cache-dir": str(cache), **bad.overrides}
        outcome, message = "accepted", ""
        try:
            settings = parse_run_config(config)
            if bad in SEMANTIC:
                grid = NoTrainingGrid(client_app, config, 6)
                runner(settings.method)(grid, settings, out_dir / str(index))
        except ValueError as exc:
            outcome, message = "refused", str(exc)
        except TrainingStartedError:
            outcome = "training started"
        except Exception as exc:  # noqa: BLE001 - an unclean refusal is what we look for
            outcome, message = f"unclean {type(exc).__name__}", str(exc)
        rows.append(
            {
                "label": bad.label,
                "key": bad.key,
                "outcome": outcome,
                "names-key": bad.key in message,
                "message": message.splitlines()[0] if message else "",
            }
        )
    return rows
