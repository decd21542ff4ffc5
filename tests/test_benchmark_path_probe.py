"""``benchmarks/path_probe.py --quick`` (issue 40): the server's lr probe on one seeded
``cnn_s`` path with each reduction, at FedorAS's quick-preset recipe on MNIST-5k. Each row
starts at the configured rate, halves only past the bound, and keeps the last rate tried;
so does FedorAS's own Stage-1 probe of the quick preset's supernet (a random path per step),
one row per reduction."""

from __future__ import annotations

import math

import pytest

from tests.test_benchmarks import run_quick


@pytest.mark.slow
def test_path_probe_quick_probes_the_same_path_with_each_reduction():
    saved = run_quick("path_probe")
    rows = {row["reduction"]: row for row in saved["rows"] if row["path"] != "sampled"}
    stage1 = {row["reduction"]: row for row in saved["rows"] if row["path"] == "sampled"}
    assert set(rows) == set(stage1) == {"conv1x1-avgpool", "maxpool-conv1x1"}
    assert len(saved["rows"]) == 4
    paper, pooled = rows["conv1x1-avgpool"], rows["maxpool-conv1x1"]
    assert paper["ops"] == pooled["ops"] and paper["macs"] > pooled["macs"]
    bound = 2 * math.log(10)  # twice an untrained net's loss on 10 classes
    for row in [*rows.values(), *stage1.values()]:
        assert row["bound"] == pytest.approx(bound)
        tried = row["tried"]
        assert tried[0][0] == row["configured"] == 0.1 and row["kept"] == tried[-1][0]
        assert [lr for lr, _ in tried] == [0.1 / 2**k for k in range(len(tried))]
        assert all(loss > bound for _, loss in tried[:-1])  # halved only past the bound
        assert tried[-1][1] <= bound or len(tried) == 6  # kept within it, or the last resort
        name = "stage1_kept" if row["path"] == "sampled" else "smallest_kept"
        assert saved["headline"][f"mnist5k_{row['reduction']}_{name}"] == row["kept"]
