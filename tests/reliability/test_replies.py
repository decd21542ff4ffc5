"""Every kind of malformed reply in the catalogue, sent by a different node in the same
run of each method, is dropped with a log line naming the node, and corrupts nothing:
the run's result equals, to the bit, the run in which those nodes never answered."""

from __future__ import annotations

import json
import logging

import pytest

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.server_app import RUNNERS
from tests.reliability.catalog import REPLY_FAULTS, reply_fault
from tests.runconfig import pyproject_run_config, tiny_decnas, tiny_fdnas, tiny_fedoras

KINDS = list(REPLY_FAULTS)


def _configs(cache):
    """Per method: a tiny run config and its node count (every node trains every round)."""
    n = len(KINDS) + 3  # one node per fault kind, three honest ones
    return {
        "fedoras": (
            tiny_fedoras(
                cache,
                **{
                    "fedoras.stop-after": "supernet",
                    "fedoras.clients-per-round": n,
                    "fedoras.rounds": 1,
                },
            ),
            n,
        ),
        "fdnas": (tiny_fdnas(cache, **{"fdnas.final-rounds": 0, "fdnas.clients-per-round": n}), n),
        "decnas": (tiny_decnas(cache, **{"decnas.num-groups": 3}), n),
        "dpfnas": (
            {
                **pyproject_run_config(),
                "method": "dpfnas",
                "data.cache-dir": str(cache),
                "data.partitioner": "iid",
                "space.name": "darts",
                "space.width": 0.25,
                "space.layers-per-block": 2,
                "dpfnas.mode": "fnas",
                "dpfnas.iterations": 1,
                "dpfnas.batch-size": 8,
                "dpfnas.eval-every": 0,
                "dpfnas.final-rounds": 0,
            },
            n,
        ),
    }


def _run(method, config, nodes, faults, out_dir):
    settings = parse_run_config(config)
    grid = InProcessGrid(client_app, config, nodes, faults=faults)
    out_dir.mkdir(parents=True)
    document = RUNNERS[method](grid, settings, out_dir)
    return grid, document


def _comparable(document):
    """The result document without wall times, file names and the ledger (which by
    design differs: rejected vs failed replies)."""
    drop = {"seconds", "ledger", "files", "wall-seconds"}

    def clean(value):
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


@pytest.mark.parametrize("method", ["fedoras", "fdnas", "decnas", "dpfnas"])
def test_each_malformed_reply_is_dropped_and_changes_nothing(method, data_cache, tmp_path, caplog):
    config, nodes = _configs(data_cache)[method]
    faulty = {pid: reply_fault(kind) for pid, kind in enumerate(KINDS)}
    caplog.set_level(logging.WARNING)
    grid, attacked = _run(method, config, nodes, faulty, tmp_path / "attacked")
    log = "\n".join(r.getMessage() for r in caplog.records)
    for pid, kind in enumerate(KINDS):
        node = grid.node_of_partition[pid]
        assert f"node {node}" in log, f"{kind}: no log line names node {node}"
    quiet_faults = {pid: reply_fault(kind, silent=True) for pid, kind in enumerate(KINDS)}
    _, quiet = _run(method, config, nodes, quiet_faults, tmp_path / "quiet")
    assert _comparable(attacked) == _comparable(quiet)
