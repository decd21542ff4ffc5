"""The NetAdapt rules DecNAS runs on (§4.1, §4.3): budgets, rounds, candidate dropping.

Pure functions of numbers, so that they can be checked by hand:

- budget schedule: ``R_t = Res(GM_{t-1}) - dR_t`` with ``dR_1`` a fraction of
  ``Res(GM_0)`` and ``dR_t = dR_{t-1} * decay``, never below the final target;
- dynamic round number: iterations ``1..every`` get the first entry of the
  schedule, the next ``every`` the second, ... (paper, CelebA: 2, 5, 8, 10 every 5);
- accuracy degradation ``(Acc(GM_{t-1}) - acc_i) / (Res(GM_{t-1}) - Res(PM_i))``;
  each round the ``ceil(alpha * K)`` candidates with the largest degradation are
  dropped (K: the iteration's initial number of candidates), never the last one;
- GM_t among the survivors: the smallest degradation (default) or the most accurate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = [
    "PICKS",
    "budget",
    "degradation",
    "pick_global_model",
    "rank_candidates",
    "rounds_for",
    "survivors_after_drop",
]

#: how GM_t is chosen among an iteration's survivors (``decnas.pick``)
PICKS = ("degradation", "accuracy")


def budget(
    previous: float, initial: float, iteration: int, reduction: float, decay: float, target: float
) -> float:
    """R_t for iteration ``t >= 1``: ``previous - reduction * initial * decay^(t-1)``,
    clamped to ``target`` (the final budget) from above."""
    if iteration < 1:
        raise ValueError(f"iterations count from 1, got {iteration}")
    step = reduction * initial * decay ** (iteration - 1)
    return max(previous - step, target)


def rounds_for(iteration: int, schedule: Sequence[int], every: int) -> int:
    """Short-term fine-tuning rounds of ``iteration`` (1-based) under the dynamic schedule."""
    if not schedule or every < 1:
        raise ValueError("a round schedule needs at least one entry and every >= 1")
    return int(schedule[min((iteration - 1) // every, len(schedule) - 1)])


def degradation(
    previous_accuracy: float, accuracy: float, previous_resource: float, resource: float
) -> float:
    """Accuracy lost per unit of resource saved relative to the previous global model."""
    saved = previous_resource - resource
    if saved <= 0:
        raise ValueError(f"a candidate must save resources: {previous_resource} -> {resource}")
    return (previous_accuracy - accuracy) / saved


def rank_candidates(ratios: Mapping[int, float]) -> list[int]:
    """Candidates from the best (smallest degradation) to the worst; ties: lower index first."""
    return sorted(ratios, key=lambda c: (ratios[c], c))


def survivors_after_drop(ratios: Mapping[int, float], initial: int, alpha: float) -> list[int]:
    """The candidates kept after dropping ``ceil(alpha * initial)`` with the largest
    degradation (at least one always survives), best first."""
    ranked = rank_candidates(ratios)
    drop = math.ceil(alpha * initial - 1e-9) if alpha > 0 else 0
    keep = max(1, len(ranked) - drop)
    return ranked[:keep]


def pick_global_model(
    ratios: Mapping[int, float], accuracy: Mapping[int, float], rule: str = "degradation"
) -> int:
    """GM_t among the surviving candidates (the keys of ``ratios``).

    ``"degradation"``: the smallest degradation, the rule that drops candidates, so the
    pick is the survivor that dropping would keep last.  ``"accuracy"``: the highest
    fused validation accuracy (the paper's "most accurate", NetAdapt's pick; a candidate
    without one counts as -inf).  Ties: lower index first."""
    if rule == "degradation":
        return rank_candidates(ratios)[0]
    if rule == "accuracy":
        scores = {c: accuracy.get(c, math.nan) for c in ratios}
        scores = {c: -math.inf if math.isnan(v) else v for c, v in scores.items()}
        return min(ratios, key=lambda c: (-scores[c], c))
    raise ValueError(f"unknown pick rule {rule!r}; one of {', '.join(PICKS)}")
