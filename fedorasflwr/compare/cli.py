"""``python -m fedorasflwr.compare``: every method on one setting and one budget rule, one
leaderboard (docs/compare.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..methods import ROUND_KEYS
from .execute import MethodRun, run_method
from .leaderboard import client_flops, ledger_totals, rows_of, write_leaderboard
from .spec import (
    BUDGETS,
    CompareSpec,
    app_run_config,
    check_out,
    check_timeout,
    read_spec,
    with_rounds,
)

__all__ = ["budget_statement", "compare", "main", "scaled_rounds"]


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m fedorasflwr.compare",
        description="Run several methods on one shared setting under one budget rule and "
        "write leaderboard.md / .json / .png (docs/compare.md).",
    )
    parser.add_argument(
        "--run-config",
        type=Path,
        default=None,
        help="TOML: run-config keys every method gets, [compare] (methods, budget, rounds, "
        "reference, tolerance, nodes) and [methods.<method>] tables of its own keys, "
        "e.g. configs/compare-quick.toml",
    )
    parser.add_argument("--methods", help="comma-separated (default: the file's, else all)")
    parser.add_argument("--budget", help=f"one of {', '.join(BUDGETS)} (default: rounds)")
    parser.add_argument("--rounds", type=int, help="budget rounds: every round key set to N")
    parser.add_argument("--reference", help="budget flops: the method the others match")
    parser.add_argument("--tolerance", type=float, help="budget flops: default 0.25")
    parser.add_argument("--nodes", type=int, help="simulated clients (default 20)")
    parser.add_argument(
        "--dataset",
        help="the shared data.dataset, replacing the file's: e.g. folder:<path> to try every "
        "method on your own image folder at the file's settings",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("outputs/compare"), help="default: outputs/compare"
    )
    parser.add_argument(
        "--inprocess",
        action="store_true",
        help="each method in this process on the in-process grid (default: "
        "the simulation engine through python -m fedorasflwr.launch)",
    )
    parser.add_argument(
        "--app-dir",
        type=Path,
        default=Path("."),
        help="the Flower app (its pyproject.toml's run config; the simulation engine runs "
        "it); default: .",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per method on the simulation engine, > 0 (default: no limit)",
    )
    return parser.parse_args(argv)


def scaled_rounds(method: str, config: Mapping[str, Any], factor: float) -> dict[str, int]:
    """``method``'s round keys (``methods.ROUND_KEYS``) in the full run config ``config``
    times ``factor``, rounded, at least 1 (a key at 0, a stage switched off, stays 0)."""
    return {
        key: 0 if int(config[key]) == 0 else max(1, round(int(config[key]) * factor))
        for key in ROUND_KEYS[method]
    }


def budget_statement(spec: CompareSpec, reference_flops: int | None) -> str:
    """How the budgets were set, in words, for the leaderboard's header."""
    if spec.budget == "rounds":
        how = (
            f"every round key of every method set to {spec.rounds}"
            if spec.rounds
            else "every method runs the rounds its settings give (the shared setting, then "
            "its [methods.<method>] table)"
        )
        return (
            f"equal rounds: {how}. Rounds of different methods' stages cost different "
            "client compute: each method's client training FLOPs (its ledger) are listed, "
            f"'x reference' is its FLOPs over {spec.reference}'s"
        )
    spent = "-" if reference_flops is None else f"{reference_flops / 1e9:.4g} GFLOPs"
    return (
        f"equal client training FLOPs: {spec.reference} ran first with its rounds as set "
        f"({spent} of client training); every other method ran with its rounds as set and, "
        f"where its client training FLOPs differed from that by more than "
        f"{spec.tolerance:.0%}, once more with each of its round keys scaled by the ratio "
        "(rounded, at least 1). 'x reference' is the ratio reached: stages counted in other "
        "units (searches, NetAdapt iterations) do not scale, so it can stay away from 1"
    )


def _setting_text(config: Mapping[str, Any]) -> str:
    from ..config import parse_run_config

    data = parse_run_config(config).data
    split = data.partitioner + (f" alpha={data.alpha:g}" if data.partitioner == "dirichlet" else "")
    return (
        f"{data.dataset}, {split} split, seed {config.get('seed', 0)}, global test set "
        f"{'on' if data.global_test else 'off'}"
    )


def _chance(config: Mapping[str, Any]) -> float:
    from ..config import parse_run_config
    from ..runs import chance_accuracy

    return chance_accuracy(parse_run_config(config))


def compare(
    spec: CompareSpec,
    out: Path,
    *,
    inprocess: bool,
    app_dir: Path = Path("."),
    timeout: float | None = None,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run ``spec``'s methods (the reference first with budget ``flops``), each in
    ``<out>/<method>/``, reusing finished runs of the same settings, and write the
    leaderboard in ``out``; returns ``leaderboard.json``'s content.  Raises ``ValueError``
    before anything runs for an ``out`` it cannot write in (``spec.check_out``) or a bad
    ``timeout`` (``spec.check_timeout``)."""
    out = check_out(out, spec).resolve()
    check_timeout(timeout)
    out.mkdir(parents=True, exist_ok=True)
    defaults = app_run_config(app_dir)
    order = list(spec.methods)
    if spec.budget == "flops":
        order = [spec.reference, *(m for m in order if m != spec.reference)]
    entries: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    reference_flops: int | None = None

    def run(method: str, attempt: str, config: Mapping[str, Any]) -> MethodRun:
        where = "the in-process grid" if inprocess else "the simulation engine"
        echo(f"compare: {method} ({attempt}) on {where} ...")
        done = run_method(
            method,
            attempt,
            config,
            defaults,
            out,
            nodes=spec.nodes,
            inprocess=inprocess,
            app_dir=Path(app_dir).resolve(),
            timeout=timeout,
        )
        if done.ok:
            flops = client_flops(done.document or {})
            echo(
                f"compare: {method} ({attempt}) {done.status}: {flops / 1e9:.4g} GFLOPs of "
                "client training"
            )
        else:
            echo(f"compare: {method} ({attempt}) FAILED: {done.reason}")
        return done

    for method in order:
        config = with_rounds(spec, method, spec.run_config(method))
        full = {**defaults, **config}
        entry: dict[str, Any] = {
            "method": method,
            "rounds": {k: full.get(k) for k in ROUND_KEYS[method]},
        }
        done = run(method, "run", config)
        note = ""
        flops = client_flops(done.document or {}) if done.ok else 0
        if done.ok and not flops:
            note = "its ledger books no client training FLOPs" + (
                ": not scaled" if spec.budget == "flops" else ""
            )
        if spec.budget == "flops" and flops:
            if method == spec.reference:
                reference_flops = flops
                note = "the reference"
            elif reference_flops:
                entry["pilot_client_train_flops"] = flops
                factor = reference_flops / flops
                rounds = scaled_rounds(method, full, factor)
                if abs(flops / reference_flops - 1) <= spec.tolerance:
                    note = f"within {spec.tolerance:.0%} as set"
                elif rounds == entry["rounds"]:
                    note = "rounds cannot move closer (each at least 1)"
                else:
                    note = f"rounds scaled x{factor:.3g} (first run: {flops / 1e9:.4g} GFLOPs)"
                    entry["rounds_as_set"] = entry["rounds"]
                    entry["rounds"] = rounds
                    done = run(method, "scaled", {**config, **rounds})
            else:
                note = "not scaled: the reference failed or booked no client training FLOPs"
        entries.append(_entry(entry, done, out, note, reference_flops))
        if done.ok:
            rows += rows_of(method, done.document or {})
    if spec.budget == "rounds":
        reference_flops = next(
            (e.get("client_train_flops") for e in entries if e["method"] == spec.reference), None
        )
        for e in entries:
            e["flops_ratio"] = _ratio(e.get("client_train_flops"), reference_flops)
    reference_config = {**defaults, **spec.run_config(spec.reference)}
    header = {
        "budget": {
            "rule": spec.budget,
            "statement": budget_statement(spec, reference_flops),
            "reference": spec.reference,
            "reference_client_train_flops": reference_flops,
            "tolerance": spec.tolerance if spec.budget == "flops" else None,
            "rounds": spec.rounds if spec.budget == "rounds" else None,
        },
        "engine": "in-process grid" if inprocess else "simulation engine (fedorasflwr.launch)",
        "nodes": spec.nodes,
        "setting_text": _setting_text(reference_config),
        "compare": spec.document(),
    }
    content = write_leaderboard(out, header, entries, rows, _chance(reference_config))
    echo(f"compare: wrote {out / 'leaderboard.md'}, leaderboard.json, leaderboard.png")
    return content


def _ratio(value: float | None, reference: float | None) -> float | None:
    return None if value is None or not reference else value / reference


def _entry(
    entry: dict[str, Any], done: MethodRun, out: Path, note: str, reference: int | None
) -> dict[str, Any]:
    document = done.document or {}
    totals = ledger_totals(document) if done.ok else {}
    flops = totals.get("train_flops") or None  # 0: the method books none in its ledger
    rule = (document.get("settings") or {}).get("rounds_rule") or {}
    if rule.get("scale", 1.0) != 1.0:  # the rounds the run ran (fedorasflwr.rounds)
        ran = {key: pair[1] for key, pair in rule["rounds"].items() if key in entry["rounds"]}
        entry = {**entry, "rounds": {**entry["rounds"], **ran}}
        by_rule = f"rounds x{rule['scale']:.3g} by the rounds rule ({rule['why']})"
        note = f"{note}; {by_rule}" if note else by_rule
    return {
        **entry,
        "status": done.status,
        "reason": done.reason or None,
        "note": note or None,
        "engine": done.engine or None,
        "result": None if done.result is None else str(done.result.relative_to(out)),
        "client_train_flops": flops,
        "flops_ratio": _ratio(flops, reference),
        "bytes_up": totals.get("bytes_up"),
        "bytes_down": totals.get("bytes_down"),
        "run_seconds": document.get("seconds"),
        "wall_seconds": done.wall_seconds,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point: 0 when every method finished, 1 when one failed (the
    leaderboard is written either way), 2 for a bad comparison or a bad ``--out``,
    ``--app-dir`` or ``--timeout`` (nothing ran, nothing was written)."""
    args = _parse_args(argv)
    flags = {
        "methods": args.methods,
        "budget": args.budget,
        "rounds": args.rounds,
        "reference": args.reference,
        "tolerance": args.tolerance,
        "nodes": args.nodes,
        "dataset": args.dataset,
    }
    try:
        check_timeout(args.timeout)
        spec = read_spec(args.run_config, flags, args.app_dir, engine=not args.inprocess)
        check_out(args.out, spec)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.inprocess:
        from ..progress import setup_logging

        setup_logging()
    content = compare(
        spec, args.out, inprocess=args.inprocess, app_dir=args.app_dir, timeout=args.timeout
    )
    return 0 if all(m["status"] != "failed" for m in content["methods"]) else 1
