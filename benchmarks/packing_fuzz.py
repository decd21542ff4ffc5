"""Fuzz of the server's decoder of a client's arrays (issue 42).

Seeded random changes to what a client controls in a reply's arrays - the packing index
(its JSON, an entry, a field, the version), the packed array's ``.npy`` header, metadata
and length, a plain array's header, metadata and length - each run through what the
server runs (``fedorasflwr.packing.unpack`` against the specs sent, then
``fedorasflwr.decoding.decode_array``). The bytes of the values are never changed, so a
case must come to the arrays that were sent, bit for bit, or to a refusal
(``PackingError`` / ``DecodeError``); anything else (another exception, other values) is
a bug, and so is a large allocation (the cases declare up to 2^62 elements; the peak is
``tracemalloc``'s, numpy's buffers included). The cases are ``tests/reliability/fuzz.py``'s.

    python benchmarks/packing_fuzz.py            # 5 seeds x 1000 cases (~2 min on 2 cores)
    python benchmarks/packing_fuzz.py --quick    # CI smoke run (200 cases)
"""

# ruff: noqa: E402 (the package is imported after this checkout is put on sys.path)
from __future__ import annotations

import argparse
import sys
import time

from common import ROOT, report

if str(ROOT) not in sys.path:  # this checkout's package, not another installed one
    sys.path.insert(0, str(ROOT))

from tests.reliability.fuzz import OUTCOMES, fuzz


def run(quick: bool) -> dict:
    seeds, count = ((0,), 200) if quick else ((0, 1, 2, 3, 4), 1000)
    started = time.perf_counter()
    runs = [fuzz(seed, count) for seed in seeds]
    seconds = time.perf_counter() - started
    totals = {o: sum(r["outcomes"][o] for r in runs) for o in OUTCOMES}
    kinds: dict[str, dict[str, int]] = {}
    for r in runs:
        for kind, outcomes in r["by-kind"].items():
            per = kinds.setdefault(kind, dict.fromkeys(OUTCOMES, 0))
            for outcome, n in outcomes.items():
                per[outcome] += n
    peak = max(r["largest-peak-bytes"] for r in runs)
    headline = {
        "cases": sum(r["cases"] for r in runs),
        "decoded": totals["decoded"],
        "refused": totals["refused"],
        "bad": totals["wrong-values"] + totals["other-exception"],
        "largest_peak_kib": round(peak / 1024, 1),
        "honest_packed_bytes": runs[0]["honest-packed-bytes"],
        "seconds": round(seconds, 1),
    }
    return {
        "seeds": list(seeds),
        "cases_per_seed": count,
        "outcomes": totals,
        "by_kind": kinds,
        "bad_cases": [row for r in runs for row in r["bad"]][:20],
        "headline": headline,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    args = parser.parse_args(argv)
    result = run(args.quick)
    headline = result.pop("headline")
    print("| change | decoded | refused | wrong values | other exception |")
    print("| --- | --- | --- | --- | --- |")
    for kind, n in sorted(result["by_kind"].items()):
        print(
            f"| {kind} | {n['decoded']} | {n['refused']} | {n['wrong-values']} "
            f"| {n['other-exception']} |"
        )
    report("packing_fuzz", args.quick, headline, result)
    return 0 if headline["bad"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
