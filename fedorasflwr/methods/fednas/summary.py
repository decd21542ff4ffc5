"""FedNAS's end-of-run summary (``progress.summary_lines`` prints it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...costs import flops_to_macs
from ...progress import MFLOPS, MMACS, fmt
from ...results import cost_point
from ...search_spaces.darts import unsearched_lines

__all__ = ["points", "summary"]


def summary(document: Mapping[str, Any], settings: Any = None) -> list[str]:
    """The genotype, its cost, its test accuracy and the alphas' entropy first and last."""
    flops = document.get("flops")
    entropy = [e for e in document.get("alpha_entropy", []) if e]
    lines = [
        f"genotype: {document.get('genotype', '-')}",
        *unsearched_lines(document.get("space", {})),
        f"search rounds: {fmt(document.get('rounds'))}",
        f"derived net {MFLOPS}: {fmt(None if flops is None else flops / 1e6)}; {MMACS}: "
        f"{fmt(None if flops is None else flops_to_macs(flops) / 1e6)}",
        f"test accuracy of the derived net: {fmt(document.get('test_accuracy'))}",
    ]
    if document.get("global_test_accuracy") is not None:
        lines.append(
            f"global test acc of the derived net: {fmt(document['global_test_accuracy'])}"
            f" ({document.get('global_test_count')} samples on the server)"
        )
    if entropy:
        first, last = entropy[0], entropy[-1]
        lines.append(
            "alpha entropy (nats, mean per edge): "
            + ", ".join(f"{k} {fmt(first.get(k))} -> {fmt(last.get(k))}" for k in last)
        )
    return lines


def points(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The derived net as one cost point."""
    return [
        cost_point(
            "derived",
            flops=document.get("flops"),
            macs=document.get("macs"),
            test_accuracy=document.get("test_accuracy"),
            test_scope="last round's evaluated clients",
            global_test_accuracy=document.get("global_test_accuracy"),
        )
    ]
