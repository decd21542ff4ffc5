"""DP-FNAS's genotype under a latency budget (``dpfnas.resource = "latency"``).

DP-FNAS has no resource term (Singh et al. 2020 search for accuracy alone); its natural one
acts where nothing private is touched: at the derivation.  The parties' latency tables
(timings of the shared supernet on zero inputs, no data) give every option of every edge of
every cell its milliseconds; a genotype's predicted latency is

    ``fixed_ms + sum over cells, over the genotype's 8 (operation, input) pairs of that
    cell's kind, of option_ms[edge of that pair in that cell][operation]``

(the 6 edges a derived cell drops cost nothing).  :func:`budgeted_genotype` starts from
DARTS's genotype (top-2 inputs per node, strongest non-zero operation) and, while its
prediction is over the budget, replaces the costliest pair that has a cheaper alternative
(another operation, or another input the node does not use yet) by that alternative's
strongest by alpha.  Each step lowers one pair's cost, so it ends; it reaches a genotype
within the budget whenever :func:`cheapest_ms` does.  Only the ``darts`` space's layout
(``DartsSpace``: cells of 14 edges over :data:`PRIMITIVES`) is known here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...latency import LatencyTable
from ...search_spaces.darts import EDGES, NODES, PRIMITIVES, DartsSpace, Genotype, derive_genotype

__all__ = ["budgeted_genotype", "cheapest_ms", "genotype_ms", "require_darts_layout"]

NONE = PRIMITIVES.index("none")
#: relative slack of the budget: a genotype summing to it in floating point fits
SLACK = 1e-9


def require_darts_layout(space: Any) -> None:
    """``ValueError`` unless ``space`` is the built-in darts space (the layout this reads)."""
    if not isinstance(space, DartsSpace):
        raise ValueError(
            "run config 'dpfnas.resource' = 'latency' needs the darts space (its cell layout "
            f"maps the latency table onto genotypes); got {type(space).__name__}"
        )


def _node_edges(node: int) -> range:
    """Edge indices (within a cell) of the inputs of intermediate ``node``."""
    start = sum(2 + i for i in range(node))
    return range(start, start + 2 + node)


def _pair_costs(table: LatencyTable, reduction: list[bool], reduce: bool) -> torch.Tensor:
    """(14, 8) milliseconds of each (edge, operation) summed over the cells of one kind."""
    total = torch.zeros(EDGES, len(PRIMITIVES), dtype=torch.float64)
    for cell, is_reduction in enumerate(reduction):
        if is_reduction == reduce:
            rows = table.option_ms[cell * EDGES : (cell + 1) * EDGES]
            total += torch.tensor(rows, dtype=torch.float64)
    return total


def _check_table(table: LatencyTable, reduction: list[bool]) -> None:
    if table.num_options() != (len(PRIMITIVES),) * (EDGES * len(reduction)):
        raise ValueError(
            f"the latency table has {len(table.option_ms)} layers; the darts space "
            f"{EDGES * len(reduction)} of {len(PRIMITIVES)} options"
        )


def genotype_ms(genotype: Genotype, table: LatencyTable, reduction: list[bool]) -> float:
    """Predicted latency of ``genotype``'s derived network on ``table`` (module docstring)."""
    _check_table(table, reduction)
    total = table.fixed_ms
    for reduce, cell in ((False, genotype.normal), (True, genotype.reduce)):
        costs = _pair_costs(table, reduction, reduce)
        for k, (op, j) in enumerate(cell):
            total += float(costs[_node_edges(k // 2)[j], PRIMITIVES.index(op)])
    return total


def cheapest_ms(table: LatencyTable, reduction: list[bool]) -> float:
    """Predicted latency of the cheapest genotype: per node its two cheapest inputs, each
    with its cheapest non-zero operation."""
    _check_table(table, reduction)
    total = table.fixed_ms
    for reduce in (False, True):
        costs = _pair_costs(table, reduction, reduce)
        costs[:, NONE] = float("inf")
        for node in range(NODES):
            per_input = sorted(float(costs[e].min()) for e in _node_edges(node))
            total += per_input[0] + per_input[1]
    return total


def budgeted_genotype(
    alpha_normal: torch.Tensor,
    alpha_reduce: torch.Tensor,
    table: LatencyTable,
    reduction: list[bool],
    budget_ms: float,
) -> Genotype:
    """DARTS's genotype of the alphas, made to fit ``budget_ms`` on ``table`` greedily (the
    module docstring); ``ValueError`` if even the cheapest genotype does not fit."""
    low = cheapest_ms(table, reduction)
    bound = budget_ms * (1 + SLACK)
    if low > bound:
        raise ValueError(
            f"no genotype fits in {budget_ms:.4g} ms on the latency table (the cheapest "
            f"takes {low:.4g} ms)"
        )
    genotype = derive_genotype(alpha_normal, alpha_reduce)
    cells = {False: list(genotype.normal), True: list(genotype.reduce)}
    weights = {
        False: F.softmax(alpha_normal.detach().double().cpu(), dim=-1),
        True: F.softmax(alpha_reduce.detach().double().cpu(), dim=-1),
    }
    costs = {reduce: _pair_costs(table, reduction, reduce) for reduce in (False, True)}

    def cost(reduce: bool, k: int, op: str, j: int) -> float:
        return float(costs[reduce][_node_edges(k // 2)[j], PRIMITIVES.index(op)])

    total = genotype_ms(genotype, table, reduction)
    while total > bound:
        chosen = sorted(
            ((reduce, k) for reduce in (False, True) for k in range(2 * NODES)),
            key=lambda rk: -cost(rk[0], rk[1], *cells[rk[0]][rk[1]]),
        )
        for reduce, k in chosen:
            op, j = cells[reduce][k]
            other = cells[reduce][k ^ 1][1]  # the node's other input stays taken
            now = cost(reduce, k, op, j)
            edges = _node_edges(k // 2)
            alternatives = [
                (float(weights[reduce][edges[i], o]), PRIMITIVES[o], i)
                for i in range(len(edges))
                if i != other
                for o in range(len(PRIMITIVES))
                if o != NONE and cost(reduce, k, PRIMITIVES[o], i) < now
            ]
            if alternatives:
                _, new_op, new_input = max(alternatives)
                cells[reduce][k] = (new_op, new_input)
                total += cost(reduce, k, new_op, new_input) - now
                break
        else:  # unreachable above the cheapest genotype, which was checked
            raise ValueError(f"no genotype within {budget_ms:.4g} ms was found")
    for cell in cells.values():  # each node's pair in input order, as DARTS writes it
        for node in range(NODES):
            cell[2 * node : 2 * node + 2] = sorted(
                cell[2 * node : 2 * node + 2], key=lambda p: p[1]
            )
    return Genotype(tuple(cells[False]), tuple(cells[True]))
