"""The fault benchmark: every fault of the reliability catalogue, tried for real, in one table.

The kinds of fault, each tried and counted:

- **malformed replies**: every kind in ``tests/reliability/catalog.py`` (NaN / Inf / wrong
  shape / wrong dtype / unknown key / missing records / negative or inflated counts /
  a non-finite metric / an oversized reply / a crash / a duplicate, a second altered or a
  wrong-type reply / an earlier round's reply re-sent, alone or before the fresh one / no
  nonce echoed),
  each sent by its own node in one run of each method on the in-process grid with real
  clients and data.  "Handled" = dropped with a WARNING naming the node and booked in the
  ledger; "corrupted nothing" = the run's result equals, to the bit, the run in which
  those replies were never sent.  The crash and the oversized reply are also counted in
  their own rows (process faults, oversized replies).
- **bad profiles**: every kind in ``PROFILE_FAULTS`` (negative, fractional or boolean
  counts, a missing field, ``num-train`` 0, a label histogram of another length, with a
  negative entry or not adding up, ``num-train`` x 10^6, a partition id out of range,
  another ``num-partitions``), each sent by its own node in one run of each method.
  "Handled" = the node dropped with a WARNING naming it and booked as rejected, the run not
  lost (it did not raise: ``lost`` counts the runs that did); "corrupted nothing" = the
  run equals, to the bit, the run in which those nodes sent no profile.
- **bad run configs**: every type and range mutation and a misspelling of every key, plus
  cross-key mistakes; "handled" = refused with a ``ValueError`` naming the key before any
  training instruction was sent.
- **corrupted files**, **process faults**, **terminating signals** and **oversized
  replies**: the cases of the test modules that corrupt partition caches (a directory
  where a cache file belongs too) and checkpoints, that stop a run mid-stage and resume it
  (the ServerApp's grid dies before round k; the resumed run must equal the uninterrupted
  one), that send the launcher's signal handling SIGINT / SIGTERM / SIGHUP, and that
  send replies over the size bound; plus, without ``--quick``, the deployment-engine test
  that SIGKILLs a SuperNode mid-round and the launcher stopped with SIGTERM mid-run.  They
  run through pytest; each case is one fault tried, "handled" = it passed.

"Lost" = tried - handled. Prints a Markdown table and ``headline: ...``; writes
``benchmarks/results/faults.json``.

    python benchmarks/faults.py            # every method, the engine tests too
    python benchmarks/faults.py --quick    # FedorAS replies and profiles, configs, cheap cases
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from common import ROOT, report

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: pytest cases per category: (category, test id prefix)
PYTEST_CASES = [
    (
        "corrupted files",
        "tests/data/test_cache_integrity.py::test_corruption_is_caught_and_rebuilt",
    ),
    ("corrupted files", "tests/data/test_cache_integrity.py::test_server_slice_is_checked_too"),
    ("corrupted files", "tests/data/test_cache_integrity.py::test_text_ids_out_of_the_vocabulary"),
    ("corrupted files", "tests/test_checkpoint_files.py::test_a_missing_file"),
    ("corrupted files", "tests/test_checkpoint_files.py::test_an_empty_file"),
    ("corrupted files", "tests/test_checkpoint_files.py::test_a_file_that_is_not_a_checkpoint"),
    ("corrupted files", "tests/test_checkpoint_files.py::test_a_pickle_weights_only_refuses"),
    ("corrupted files", "tests/test_checkpoint_files.py::test_not_a_dict"),
    ("corrupted files", "tests/test_checkpoint_files.py::test_a_missing_entry"),
    ("corrupted files", "tests/test_checkpoint_files.py::test_a_state_dict_that_is_not_tensors"),
    ("corrupted files", "tests/test_checkpoint_files.py::test_non_finite_weights"),
    ("corrupted files", "tests/test_checkpoint_files.py::test_float64_weights_where"),
    ("corrupted files", "tests/test_checkpoint_files.py::test_missing_and_unexpected_keys"),
    ("corrupted files", "tests/test_checkpoint_files.py::test_a_wrong_shape"),
    ("corrupted files", "tests/test_checkpoint_files.py::test_another_space"),
    ("corrupted files", "tests/test_checkpoint_files.py::test_a_checkpoint_of_another_method"),
    ("corrupted files", "tests/test_checkpoint_files.py::test_a_checkpoint_without_its_settings"),
    ("corrupted files", "tests/test_checkpoint_files.py::test_a_step_or_stage_out_of_range"),
    ("corrupted files", "tests/test_checkpoint_files.py::test_a_ledger_with_negative_or_foreign"),
    ("bad resumes", "tests/test_checkpoint_files.py::test_a_resume_with_other_settings"),
    ("bad resumes", "tests/reliability/test_resume.py::test_a_resume_with_other_settings"),
    ("bad resumes", "tests/reliability/test_resume.py::test_a_checkpoint_out_of_range"),
    ("bad resumes", "tests/strategies/test_dpfnas_accounting.py::test_a_corrupt_privacy_history"),
    ("bad resumes", "tests/test_checkpoints.py::test_a_resume_with_other_tiers"),
    ("process faults", "tests/test_checkpoints.py::test_a_resumed_stage1_equals_the_uninterrupted"),
    ("process faults", "tests/test_checkpoints.py::test_a_resumed_dpfnas_search_equals"),
    ("process faults", "tests/test_checkpoints.py::test_a_resumed_fdnas_search_equals"),
    ("process faults", "tests/test_checkpoints.py::test_a_resumed_decnas_continues"),
    ("process faults", "tests/test_checkpoints.py::test_a_search_failure_keeps_the_supernet"),
    (
        "corrupted files",
        "tests/data/test_cache_integrity.py::test_an_empty_directory_where_a_cache_file_belongs",
    ),
    (
        "corrupted files",
        "tests/data/test_cache_integrity.py::test_a_directory_holding_files_where_a_cache_file",
    ),
    ("corrupted files", "tests/data/test_cache_integrity.py::test_a_cache_directory_that_is_a"),
    (
        "terminating signals",
        "tests/reliability/test_process_faults.py::test_every_terminating_signal_raises_stopped",
    ),
    (
        "terminating signals",
        "tests/reliability/test_process_faults.py::test_a_signal_ignored_before_stays_ignored",
    ),
    (
        "terminating signals",
        "tests/reliability/test_process_faults.py::test_a_signal_while_processes_are_stopped",
    ),
    (
        "terminating signals",
        "tests/reliability/test_process_faults.py::test_later_signals_cannot_cut_the_clean_up",
    ),
    ("oversized replies", "tests/reliability/test_reply_size.py::test_a_reply_larger_than_what"),
    ("oversized replies", "tests/reliability/test_reply_size.py::test_the_honest_reply_behind"),
]
#: the categories of ``PYTEST_CASES`` the smoke run (``--quick``) tries: the cheap ones
QUICK_CATEGORIES = ("corrupted files", "terminating signals", "oversized replies")
ENGINE_CASES = [
    (
        "process faults",
        "tests/engines/test_secure_deployment.py::test_a_supernode_killed_mid_round_is_booked_once_to_itself",
    ),
    (
        "terminating signals",
        "tests/reliability/test_process_faults.py::test_sigterm_stops_every_process_the_launcher",
    ),
]


class _Outcomes:
    """A pytest plugin keeping each selected case's outcome."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}

    def pytest_runtest_logreport(self, report) -> None:  # noqa: ANN001 - pytest's hook
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.outcomes[report.nodeid] = report.outcome


class _OnlyCases:
    """A pytest plugin deselecting every test of the files that is none of the cases."""

    def __init__(self, prefixes: list[str]) -> None:
        self.prefixes = tuple(prefixes)

    def pytest_collection_modifyitems(self, config, items) -> None:  # noqa: ANN001 - pytest's hook
        other = [item for item in items if not item.nodeid.startswith(self.prefixes)]
        if other:
            config.hook.pytest_deselected(items=other)
            items[:] = [item for item in items if item.nodeid.startswith(self.prefixes)]


def pytest_rows(cases: list[tuple[str, str]], only_cases: bool = False) -> list[dict]:
    """Run the files of ``cases`` (with ``only_cases``: only the cases' tests) in this
    process; one row per case's test."""
    import pytest

    files = sorted({prefix.split("::")[0] for _, prefix in cases})
    collector = _Outcomes()
    plugins: list[object] = [collector]
    if only_cases:
        plugins.append(_OnlyCases([prefix for _, prefix in cases]))
    # "-n 0": in this process (pyproject's addopts would start pytest-xdist workers)
    pytest.main(
        ["-q", "-n", "0", "-p", "no:cacheprovider", "--rootdir", str(ROOT), *files],
        plugins=plugins,
    )
    rows = []
    for nodeid, outcome in collector.outcomes.items():
        category = next((c for c, prefix in cases if nodeid.startswith(prefix)), None)
        if category is not None:
            rows.append({"category": category, "case": nodeid, "handled": outcome == "passed"})
    missing = [p for _, p in cases if not any(r["case"].startswith(p) for r in rows)]
    if missing:
        raise SystemExit(f"cases not found (renamed?): {missing}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="FedorAS only, on 64 rows per client; no engine test"
    )
    args = parser.parse_args()

    from tests.reliability.trials import METHODS, config_trial, profile_trial, reply_trial
    from tests.runconfig import FEW_ROWS

    # the smoke run's FedorAS trials as tests/reliability/test_replies.py runs them: every
    # client on 64 rows, fewer and larger local steps (what each case shows holds at any size)
    smaller = {**FEW_ROWS, "fedoras.batch-size": 128} if args.quick else None

    started = time.perf_counter()
    table: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    with tempfile.TemporaryDirectory() as tmp:
        cache, out = Path(tmp) / "cache", Path(tmp) / "out"
        replies = []
        excess = []
        for method in ("fedoras",) if args.quick else METHODS:
            trial = reply_trial(method, cache, out / method, smaller)
            replies += trial["rows"]
            excess.append(trial["honest-excess"])
        for row in replies:
            cell = table["malformed replies (" + row["method"] + ")"]
            cell["tried"] += 1
            cell["handled"] += row["logged"] and row["booked"] > 0
            cell["corrupted nothing"] += row["corrupted-nothing"]
            also = {"client-crash": "process faults", "oversized": "oversized replies"}
            if row["kind"] in also:
                cell = table[also[row["kind"]]]
                cell["tried"] += 1
                cell["handled"] += row["logged"] and row["booked"] > 0
                cell["corrupted nothing"] += row["corrupted-nothing"]
        profiles, lost_runs = [], 0
        for method in ("fedoras",) if args.quick else METHODS:
            trial = profile_trial(method, cache, out / ("profiles-" + method), smaller)
            profiles += trial["rows"]
            lost_runs += bool(trial["lost"])
        for row in profiles:
            cell = table["bad profiles (" + row["method"] + ")"]
            cell["tried"] += 1
            cell["handled"] += row["logged"] and row["booked"] > 0 and not row["lost"]
            cell["corrupted nothing"] += row["corrupted-nothing"]
        configs = config_trial(cache, out / "configs")
        cell = table["bad run configs"]
        for row in configs:
            cell["tried"] += 1
            refused = row["outcome"] == "refused" and row["names-key"]
            cell["handled"] += refused
            cell["corrupted nothing"] += refused
    chosen = [c for c in PYTEST_CASES if not args.quick or c[0] in QUICK_CATEGORIES]
    # the smoke run skips the files' other tests (7 of 34, they are no fault case)
    cases = pytest_rows(chosen + ([] if args.quick else ENGINE_CASES), only_cases=args.quick)
    for row in cases:
        cell = table[row["category"]]
        cell["tried"] += 1
        cell["handled"] += row["handled"]
        cell["corrupted nothing"] += row["handled"]

    for cell in table.values():
        cell["lost"] = cell["tried"] - cell["handled"]
    print("\n| fault | tried | handled | lost | corrupted nothing |")
    print("| --- | --- | --- | --- | --- |")
    for name, cell in table.items():
        print(
            f"| {name} | {cell['tried']} | {cell['handled']} | {cell['lost']} "
            f"| {cell['corrupted nothing']} |"
        )
    unhandled = [r for r in replies if not (r["logged"] and r["booked"] > 0)]
    unhandled += [r for r in configs if r["outcome"] != "refused" or not r["names-key"]]
    unhandled += [r for r in profiles if not (r["logged"] and r["booked"] > 0) or r["lost"]]
    unhandled += [r for r in cases if not r["handled"]]
    for row in unhandled:
        print("not handled:", row)
    tried = sum(c["tried"] for c in table.values())
    handled = sum(c["handled"] for c in table.values())
    summary = {
        "faults_tried": tried,
        "faults_handled": handled,
        "faults_lost": tried - handled,
        # the most bytes an honest reply carried beyond what its node was sent (the size
        # bound allows fedorasflwr.federation.replies.REPLY_MARGIN)
        "honest_reply_excess_bytes": max(excess),
        "reply_kinds": len({r["kind"] for r in replies}),
        "profile_kinds": len({r["kind"] for r in profiles}),
        "runs_lost": lost_runs,
        "methods": len({r["method"] for r in replies}),
        "configs_tried": len(configs),
        "all_handled": handled == tried,
        "seconds": round(time.perf_counter() - started, 1),
    }
    document = {
        "table": {k: dict(v) for k, v in table.items()},
        "replies": replies,
        "profiles": profiles,
        "configs": [r for r in configs if r["outcome"] != "refused" or not r["names-key"]],
        "cases": cases,
    }
    report("faults", args.quick, summary, document)


if __name__ == "__main__":
    main()
