"""``benchmarks/scale.py --quick`` as a smoke test: it finishes, every stand-in reply passes
the server's checks, and the per-round figures are the server's, at every size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.test_benchmarks import ROOT, run_quick


@pytest.mark.slow
def test_scale_quick_measures_every_method_at_every_size_with_valid_standins():
    saved = run_quick("scale")
    rows = saved["server"]
    assert [(r["method"], r["nodes"]) for r in rows] == [
        (m, n) for m in ("fedoras", "decnas", "fdnas") for n in saved["sizes"]
    ]
    for row in rows:
        # the stand-ins' replies are valid: none refused by the checks, none failed
        assert row["rejected"] == 0 and row["failed"] == 0, row
        # every node was profiled once (plus the round messages)
        assert row["standin-calls"] >= row["nodes"] + sum(row["messages-per-round"])
        assert row["profile-s"] > 0 and all(s > 0 for s in row["round-s"])
        assert row["rss-peak-mb"] >= row["rss-setup-mb"] > 0
    for method in ("fedoras", "fdnas"):  # 10 clients per round, whatever the nodes
        assert all(m == 10 for r in rows if r["method"] == method for m in r["messages-per-round"])
    decnas = [r for r in rows if r["method"] == "decnas"]  # every client of the groups in use
    assert decnas[-1]["messages-per-round"][0] > decnas[0]["messages-per-round"][0]
    head = saved["headline"]
    assert head["replies_refused"] == 0
    cost = saved["decnas-cost"][0]
    assert cost["groups"] == 15
    decnas_row, naive_row = cost["rows"]["decnas"], cost["rows"]["naive"]
    # the naive design trains every candidate on every client for max(rounds) rounds
    assert naive_row["rounds"] == 10 * naive_row["iterations"]
    assert naive_row["tune-messages"] > decnas_row["tune-messages"]
    assert head["decnas_uplink_x"] == pytest.approx(
        naive_row["uplink-bytes"] / decnas_row["uplink-bytes"], rel=1e-9
    )
    assert head["decnas_uplink_x"] > 1 and head["decnas_flops_x"] > 1


def test_inprocess_grid_gives_every_node_its_own_id_beyond_997_nodes():
    from flwr.clientapp import ClientApp

    from fedorasflwr.inprocess import InProcessGrid

    grid = InProcessGrid(ClientApp(), {}, 2_500)
    ids = list(grid.get_node_ids())
    assert len(ids) == len(set(ids)) == 2_500
    assert sorted(grid.node_of_partition) == list(range(2_500))
    # the first 997 keep the ids they had before (not in partition order)
    small = InProcessGrid(ClientApp(), {}, 50).node_of_partition
    assert small == {pid: 10_000 + (pid * 7919) % 997 for pid in range(50)}
    assert list(small.values()) != sorted(small.values())


def test_a_failed_engine_part_exits_non_zero_and_records_why(monkeypatch, tmp_path, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import common
    import scale

    def no_superlink(quick, nodes):
        raise RuntimeError("Failed to start local SuperLink within 15s")

    monkeypatch.setattr(common, "RESULTS", tmp_path)  # not over the recorded results
    monkeypatch.setattr(scale, "engine_round", no_superlink)
    assert scale.main(["--quick", "--parts", "engine", "--engine-nodes", "2"]) == 1
    saved = json.loads((tmp_path / "scale.engine.quick.json").read_text())
    assert "Failed to start local SuperLink" in saved["engine"]["failed"]
    assert "FAILED" in capsys.readouterr().err


def test_the_run_memory_counts_the_runs_own_processes_not_the_machine(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import scale

    # a child in a session of its own (as the launcher starts Flower's processes) holding
    # 200 MB, and its own child: both are the run's; nothing else on the machine is
    code = (
        "import subprocess, sys, time; b = bytearray(200 * 2**20); "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
        "time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        with scale.MemoryPeak() as memory:
            while time.monotonic() < deadline:
                pids = scale.run_processes(os.getpid())
                if child.pid in pids and len(pids) >= 2 and memory.processes_peak_mb > 200:
                    break
                time.sleep(0.2)
        assert child.pid in pids and len(pids) >= 2, pids
        assert os.getpid() not in pids
        assert 200 < memory.run_mb < 1000, memory.run_mb  # the 200 MB child, two interpreters
    finally:
        os.killpg(child.pid, 9)
        child.wait()
