"""DP-FNAS with latency as the resource (``dpfnas.resource = "latency"``): the genotype
derived within ``dpfnas.latency-budget-ms`` on the parties' latency tables, against a
hand-computed case, the checks before training, and one in-process run on injected tables."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord

import fedorasflwr.latency as latency
from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.latency import LatencyRequest, LatencyTable
from fedorasflwr.methods.dpfnas.budget import budgeted_genotype, cheapest_ms, genotype_ms
from fedorasflwr.methods.dpfnas.contract import DPFNAS_WEIGHTS
from fedorasflwr.methods.dpfnas.strategy import DPFNAS
from fedorasflwr.runs import build_supernet
from fedorasflwr.search_spaces.darts import EDGES, PRIMITIVES, derive_genotype
from tests.strategies.test_dpfnas_strategy import tiny_dpfnas

SEP5, DIL3 = PRIMITIVES.index("sep_conv_5x5"), PRIMITIVES.index("dil_conv_3x3")
#: injected table: milliseconds per DARTS option, the same on every edge
OPTION_MS = {
    "none": 0.01,
    "max_pool_3x3": 0.1,
    "avg_pool_3x3": 0.1,
    "skip_connect": 0.05,
    "sep_conv_3x3": 1.0,
    "sep_conv_5x5": 2.0,
    "dil_conv_3x3": 0.5,
    "dil_conv_5x5": 0.8,
}


def table_of(option_ms, fixed_ms=0.5, spec=None) -> LatencyTable:
    return LatencyTable(
        spec=spec or {"name": "darts"},
        device="cpu",
        threads=1,
        option_ms=tuple(tuple(row) for row in option_ms),
        fixed_ms=fixed_ms,
    )


def hand_case():
    """Three cells (normal, reduce, reduce); every edge prefers sep_conv_5x5, then
    dil_conv_3x3; every option takes 1 ms (none 0.1) but sep_conv_5x5 on the two input
    edges of node 0, 4 ms.  DARTS's genotype: inputs 0 and 1 of every node (ties keep
    the first), sep_conv_5x5 throughout: 0.5 + (2 x 4 + 6 x 1) x (1 + 2 cells) = 42.5 ms."""
    alpha = torch.zeros(EDGES, len(PRIMITIVES))
    alpha[:, SEP5], alpha[:, DIL3] = 2.0, 1.0
    row = [0.1] + [1.0] * (len(PRIMITIVES) - 1)
    heavy = list(row)
    heavy[SEP5] = 4.0
    cell = [heavy, heavy] + [row] * (EDGES - 2)
    return alpha, table_of(cell * 3), [False, True, True]


def test_the_budgeted_genotype_replaces_the_costliest_pairs_by_their_next_best_option():
    alpha, table, reduction = hand_case()
    darts = derive_genotype(alpha, alpha)
    assert genotype_ms(darts, table, reduction) == pytest.approx(42.5)
    assert budgeted_genotype(alpha, alpha, table, reduction, 42.5) == darts
    # one step: the reduce cells' node-0 pair on input 0 (8 ms over two cells) -> dil 3x3
    once = budgeted_genotype(alpha, alpha, table, reduction, 37.0)
    assert once.normal == darts.normal
    assert once.reduce[:2] == (("dil_conv_3x3", 0), ("sep_conv_5x5", 1))
    assert once.reduce[2:] == darts.reduce[2:]
    assert genotype_ms(once, table, reduction) == pytest.approx(36.5)
    # three steps: both reduce pairs of node 0 (-6 ms each), then the normal one on input 0
    thrice = budgeted_genotype(alpha, alpha, table, reduction, 30.0)
    assert thrice.reduce[:2] == (("dil_conv_3x3", 0), ("dil_conv_3x3", 1))
    assert thrice.normal[:2] == (("dil_conv_3x3", 0), ("sep_conv_5x5", 1))
    assert genotype_ms(thrice, table, reduction) == pytest.approx(27.5)
    # the cheapest genotype: 1 ms per pair and cell
    assert cheapest_ms(table, reduction) == pytest.approx(0.5 + 8 * 3)
    assert genotype_ms(
        budgeted_genotype(alpha, alpha, table, reduction, 24.5), table, reduction
    ) == (pytest.approx(24.5))
    with pytest.raises(ValueError, match="no genotype fits in 24 ms"):
        budgeted_genotype(alpha, alpha, table, reduction, 24.0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"dpfnas.resource": "flops"}, r"'dpfnas.resource' = 'flops': allowed: one of none, lat"),
        ({"dpfnas.resource": "latency"}, r"'dpfnas.latency-budget-ms' = 0.0: with 'dpfnas.reso"),
        ({"dpfnas.latency-budget-ms": -1}, r"'dpfnas.latency-budget-ms' = -1.0: allowed: > 0 ms"),
    ],
)
def test_a_bad_latency_key_is_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        parse_run_config({**tiny_dpfnas("-"), **overrides})


@pytest.fixture
def injected_tables(tmp_path, monkeypatch):
    """Every party 'measures' the same known table (:data:`OPTION_MS`, fixed 0.3 ms)."""
    monkeypatch.setenv("FEDORASFLWR_CACHE", str(tmp_path / "cache"))

    def measure(space, request, *, device=None):
        row = [OPTION_MS[name] for name in PRIMITIVES]
        return table_of([row] * len(space.choices), 0.3, spec=space.spec)

    monkeypatch.setattr(latency, "measure_and_validate", measure)


def start(config, num_nodes=2):
    settings = parse_run_config(config)
    grid = InProcessGrid(client_app, config, num_nodes)
    strategy = DPFNAS(
        space=build_supernet(settings),
        settings=settings.method_settings,
        seed=settings.seed,
        latency_request=LatencyRequest(repeats=1, warmup=0, validation_paths=0),
    )
    return (
        strategy,
        grid,
        lambda: strategy.start(grid, ArrayRecord(), settings.method_settings.iterations),
    )


def test_dpfnas_derives_its_genotype_within_the_budget_on_the_parties_table(
    injected_tables, data_cache
):
    # the tiny space has two cells, both reductions: the cheapest genotype takes
    # 0.3 + 8 pairs x 2 cells x 0.05 (skip_connect) = 1.1 ms
    config = tiny_dpfnas(
        data_cache,
        **{"dpfnas.resource": "latency", "dpfnas.latency-budget-ms": 1.5, "dpfnas.final-rounds": 0},
    )
    strategy, _, run = start(config)
    result = run()
    reduction = list(strategy.space.net.reduction)
    assert reduction == [True, True]
    assert cheapest_ms(strategy.group_latency, reduction) == pytest.approx(1.1)
    predicted = genotype_ms(result.genotype, strategy.group_latency, reduction)
    assert result.latency["predicted-ms"] == pytest.approx(predicted)
    assert predicted <= 1.5 + 1e-9
    assert result.latency["budget-ms"] == 1.5
    assert result.latency["unbudgeted-ms"] > 1.5  # DARTS's own genotype was over the budget
    assert len(result.latency_tables) == 2


def test_a_budget_below_the_cheapest_genotype_stops_the_run_before_any_training(
    injected_tables, data_cache
):
    config = tiny_dpfnas(
        data_cache, **{"dpfnas.resource": "latency", "dpfnas.latency-budget-ms": 1.0}
    )
    _, grid, run = start(config)
    with pytest.raises(ValueError, match=r"'dpfnas.latency-budget-ms' = 1.0: no genotype .* "):
        run()
    assert not [m for m in grid.sent if m.metadata.message_type == DPFNAS_WEIGHTS]
