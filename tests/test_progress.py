"""What a person sees: number formatting, progress lines, the end-of-run summary, logging set-up."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from flwr.supercore import log

from fedorasflwr import progress
from fedorasflwr.launch import cli, simulation
from fedorasflwr.progress import (
    STEP_LINE,
    PlannedStage,
    ProgressEcho,
    RunEstimate,
    StageClock,
    fmt,
    format_bytes,
    format_metrics,
    format_seconds,
    quiet_flower_strategy,
    setup_logging,
    summary_lines,
)
from fedorasflwr.strategies import DPFNASSettings

LEDGER = {
    "train": {"seconds": 1.0, "totals": {"bytes_down": 3 * 1024**2, "bytes_up": 1024**2}},
    "test": {"seconds": 0.5, "totals": {"bytes_down": 1024**2, "bytes_up": 2048}},
}


# ------------------------------------------------------------------ numbers


def test_fmt_keeps_four_significant_digits() -> None:
    assert fmt(0.123456789) == "0.1235"
    assert fmt(2.2256641430230997) == "2.226"
    assert fmt(12345.678) == "1.235e+04"
    assert fmt(1e-7) == "1e-07"
    assert fmt(0.5) == "0.5"
    assert fmt(3) == "3"
    assert fmt(True) == "True"
    assert fmt(None) == "-"
    assert fmt(float("nan")) == "nan"
    assert fmt([0.33333333, 2]) == "[0.3333, 2]"
    assert fmt(0.123456789, digits=3) == "0.123"


def test_format_metrics_orders_and_selects_keys() -> None:
    metrics = {"loss": 0.69314718, "accuracy": 0.912345678, "num-examples": 450}
    assert format_metrics(metrics) == "loss 0.6931, accuracy 0.9123, num-examples 450"
    assert format_metrics(metrics, ["accuracy", "absent"]) == "accuracy 0.9123"
    assert format_metrics({}) == "-"
    assert format_metrics(None) == "-"


def test_format_bytes_and_seconds() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 1024**2) == "3 MiB"
    assert format_bytes(None) == "-"
    assert format_seconds(8.25) == "8.2s"
    assert format_seconds(75.2) == "1m15s"
    assert format_seconds(3 * 3600 + 125) == "3h02m"


def test_stage_clock_line_has_metrics_and_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    now = iter([100.0, 130.0, 160.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(now))
    clock = StageClock("supernet", 4)
    line = clock.line(1, {"loss": 1.23456, "accuracy": 0.5}, sent=6)
    assert line == "[supernet] round 1/4: loss 1.235, accuracy 0.5; sent 6 | 30.0s, ETA 1m30s"
    assert clock.line(4, {}) == "[supernet] round 4/4: - | 1m00s"  # no ETA at the end


def test_stage_clock_eta_after_resume_counts_only_steps_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = iter([0.0, 10.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(now))
    clock = StageClock("DP-FNAS", 10, first=6, label="iteration")
    assert clock.line(6, {"epsilon": 1.5}).endswith("10.0s, ETA 40.0s")


# ------------------------------------------------------------------ the whole run's ETA


def _plan() -> RunEstimate:
    return RunEstimate(
        [
            PlannedStage("supernet", 10, work=5.0),
            PlannedStage("search", 4, work=0.5),
            PlannedStage("finetune-t*-supernet", 6, work=2.0),
        ]
    )


def test_run_estimate_scales_the_cost_seen_onto_stages_not_begun() -> None:
    plan = _plan()
    assert plan.remaining() is None  # nothing seen: no estimate
    plan.record("supernet", 4, 40.0)
    # supernet: 10 s a step, 6 left; 40 s / (4 steps * 5) = 2 s per unit of work:
    # search 4 * 0.5 * 2 = 4 s, fine-tuning 6 * 2 * 2 = 24 s
    assert plan.remaining() == pytest.approx(60.0 + 4.0 + 24.0)


def test_run_estimate_uses_a_begun_stage_s_own_pace() -> None:
    plan = _plan()
    plan.record("supernet", 10, 100.0)
    plan.record("search", 4, 20.0)
    plan.record("finetune-t1-supernet", 2, 6.0)  # tier 1 of the fine-tuning: 3 s a round
    plan.record("finetune-t1-random", 5, 99.0)  # not in the plan: ignored
    assert plan.remaining() == pytest.approx(4 * 3.0)
    plan.record("finetune-t2-supernet", 4, 8.0)  # 14 s for 6 rounds, none left
    assert plan.remaining() == 0.0


def test_run_estimate_after_a_resume_counts_the_steps_done_before() -> None:
    plan = _plan()
    plan.record("supernet", 2, 20.0, before=5)  # rounds 6, 7 run here: 3 left at 10 s
    assert plan.remaining() == pytest.approx(30.0 + 4.0 + 24.0)


def test_stage_clock_shows_the_run_eta_beside_the_stage_eta(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = iter([0.0, 30.0, 60.0, 100.0, 106.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(now))
    plan = RunEstimate([PlannedStage("supernet", 2, 4.0), PlannedStage("finetune-t*", 3, 2.0)])
    with plan.active():
        clock = StageClock("supernet", 2)
    assert progress._ESTIMATE.get() is None  # active only within
    # 30 s a round; 30 s / 4 = 7.5 s per unit: the fine-tuning 3 * 2 * 7.5 = 45 s
    assert clock.line(1).endswith("| 30.0s, ETA 30.0s, run ETA 1m15s")
    # the stage's ETA has run out, the run's has not
    assert clock.line(2).endswith("| 1m00s, run ETA 45.0s")
    with plan.active():
        tune = StageClock("finetune-t1", 1)  # started at 100 s
    assert tune.line(1).endswith("| 6.0s, run ETA 12.0s")  # 6 s a round, 2 rounds left


def test_stage_clock_without_a_plan_shows_no_run_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    now = iter([0.0, 10.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(now))
    assert "run ETA" not in StageClock("search", 4).line(1)


def test_fedoras_plan_covers_its_three_stages() -> None:
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.methods.fedoras.runner import SCORE_WORK, fedoras_plan
    from tests.runconfig import pyproject_run_config

    settings = parse_run_config(pyproject_run_config()).method_settings
    plan = fedoras_plan(settings, nodes=20)
    train, finetune = settings.train, settings.finetune
    assert plan.stages == [
        PlannedStage("supernet", train.rounds, train.clients_per_round * train.local_epochs),
        PlannedStage("search", settings.num_tiers, settings.search_evaluations * SCORE_WORK),
        PlannedStage(
            "finetune-t*-supernet",
            settings.num_tiers * finetune.rounds,
            finetune.clients_per_round * finetune.local_epochs,
        ),
        PlannedStage(
            "finetune-t*-random",
            settings.num_tiers * (settings.rand_init_rounds or finetune.rounds),
            finetune.clients_per_round * finetune.local_epochs,
        ),
    ]
    assert plan.stages[3].covers("finetune-t2-random")
    assert not plan.stages[3].covers("finetune-t2-random-search-0")
    # rand-init's own clients per round (the paper: 10 against fine-tuning's 6) sets its work
    own = parse_run_config(
        {**pyproject_run_config(), "fedoras.rand-init-clients-per-round": 10}
    ).method_settings
    assert fedoras_plan(own, nodes=20).stages[3].work == 10 * finetune.local_epochs


# ------------------------------------------------------------------ summary tables


def _fedoras() -> dict[str, Any]:
    model = {
        "tier": 1,
        "init": "supernet",
        "options": ["identity", "conv3x3"],
        "flops": 268368,
        "params": 1698,
        "search_accuracy": 0.1575,
        "test": {"accuracy": 0.23503325942350334, "loss": 2.2},
    }
    rand_init = {**model, "init": "random", "test": {"accuracy": 0.125, "loss": 2.3}}
    return {
        "models": [model, rand_init, {**model, "tier": 2, "test": None}],
        "ledger": LEDGER,
    }


def _fdnas() -> dict[str, Any]:
    net = {
        "name": "cluster-1",
        "options": ["mbconv_k3_e3", "mbconv_k5_e6"],
        "flops": 143104,
        "params": 3068,
        "partitions": [0, 1, 2],
        "averaged_accuracy": 0.09555555555555556,
        "mean_local_accuracy": None,
    }
    return {"nets": [net], "ledger": LEDGER}


def _decnas() -> dict[str, Any]:
    gm = {
        "iteration": 2,
        "widths": [4, 4, 8, 5],
        "macs": 371439,
        "params": 4453,
        "search_val_accuracy": 0.8333333333333334,
        "test_accuracy": 0.7911111111111111,
        "tuned_test_accuracy": 0.9088888888888889,
    }
    return {"frontier": [gm], "ledger": LEDGER}


def _dpfnas() -> dict[str, Any]:
    party = {
        "partition_id": 3,
        "weights": {"epsilon": 0.8281879762236559, "steps": 3},
        "architecture": {"epsilon": 1.5454643277438542, "steps": 3},
        "epsilon": 1.5454643277438542,
    }
    unbounded = {**party, "partition_id": 4, "epsilon": None}
    return {
        "genotype": "normal=[sep_conv_3x3]",
        "iterations": 3,
        "stopped": "completed",
        "test_accuracy": 0.4567891,
        "space": {"min_flops": 1_000_000, "max_flops": 2_500_000},
        "privacy": [party, unbounded],
        "ledger": LEDGER,
    }


def _row(lines: list[str], first_cell: str) -> list[str]:
    (row,) = [line.split() for line in lines if line.split()[:1] == [first_cell]]
    return row


def _columns(header: str) -> list[str]:
    return header.split("  ")  # columns are two or more spaces apart; names have one


def test_fedoras_summary_per_tier_names_what_each_column_measures() -> None:
    lines = summary_lines("fedoras", _fedoras())
    assert [c.strip() for c in _columns(lines[1]) if c.strip()] == [
        "tier",
        "init",
        "model",
        "MFLOPs/sample",
        "MMACs/sample",
        "params",
        "supernet-path val acc (search)",
        "test acc after fine-tune",
    ]
    supernet_init, rand_init = [line.split() for line in lines if line.startswith("T1 ")]
    assert supernet_init == [
        "T1",
        "supernet",
        "identity-conv3x3",
        "0.2684",
        "0.1342",
        "1698",
        "0.1575",
        "0.235",
    ]
    # the rand-init model trains the same path from scratch: it has no search accuracy
    assert rand_init == [
        "T1",
        "random",
        "identity-conv3x3",
        "0.2684",
        "0.1342",
        "1698",
        "-",
        "0.125",
    ]
    assert _row(lines, "T2")[-1] == "-"  # not tested
    assert lines[-1] == "bytes moved: 4 MiB to clients, 1 MiB from clients"


@pytest.mark.parametrize("method", ["fdnas", "cfdnas"])
def test_fdnas_summary_per_net_shows_final_accuracy(method: str) -> None:
    lines = summary_lines(method, _fdnas())
    assert lines[0] == f"=== {method} summary ==="
    for column in (
        "net",
        "model",
        "MFLOPs/sample",
        "MMACs/sample",
        "clients",
        "test acc (clients pooled)",
        "test acc after local epochs (client mean)",
    ):
        assert column in lines[1]
    assert _row(lines, "cluster-1") == [
        "cluster-1",
        "mbconv_k3_e3-mbconv_k5_e6",
        "0.1431",
        "0.07155",
        "3068",
        "3",
        "0.09556",
        "-",
    ]


def test_decnas_summary_per_gm() -> None:
    lines = summary_lines("decnas", _decnas())
    for column in (
        "GM",
        "widths",
        "MFLOPs/sample",
        "MMACs/sample",
        "val acc (search)",
        "test acc after tuning",
    ):
        assert column in lines[1]
    expected = ["GM_2", "4x4x8x5", "0.7429", "0.3714", "4453", "0.8333", "0.7911", "0.9089"]
    assert _row(lines, "GM_2") == expected


def test_dpfnas_summary_has_privacy_per_party() -> None:
    lines = summary_lines("dpfnas", _dpfnas(), DPFNASSettings(delta=1e-5))
    text = "\n".join(lines)
    assert "genotype: normal=[sep_conv_3x3]" in text
    assert "test accuracy of the derived net: 0.4568" in text
    assert "iterations: 3\n" in text + "\n"  # completed: no reason shown
    stopped = summary_lines("dpfnas", {**_dpfnas(), "stopped": "privacy target reached"})
    assert "iterations: 3 (privacy target reached)" in stopped
    assert "privacy spent (delta 1e-05" in text
    assert _row(lines, "3") == ["3", "1.545", "0.8282", "1.545", "3"]
    assert _row(lines, "4")[1] == "inf"  # no guarantee
    # parties that spent the same share one row, named by id ranges
    same = [{**_dpfnas()["privacy"][0], "partition_id": i} for i in (0, 1, 2, 5, 7, 8)]
    grouped = summary_lines("dpfnas", {**_dpfnas(), "privacy": same})
    assert _row(grouped, "0-2,5,7-8") == ["0-2,5,7-8", "1.545", "0.8282", "1.545", "3"]
    assert "supernet MFLOPs/sample: 1..2.5; MMACs/sample: 0.5..1.25" in text
    assert lines[-1].startswith("bytes moved: 4 MiB")


def _widths(mode: str) -> dict[str, Any]:
    """A width baseline's result: two tiers (1-based), their width, MACs and FLOPs."""
    tiers = [
        {"tier": t, "width": w, "macs": m, "flops": 2 * m, "params": 10, "partitions": [t]}
        for t, w, m in ((1, 0.5, 40_000), (2, 1.0, 150_000))
    ]
    return {"mode": mode, "tiers": [{**t, "test_accuracy": 0.5} for t in tiers]}


@pytest.mark.parametrize(
    ("method", "document", "first_cell", "flops"),
    [
        ("fedoras", _fedoras(), "T1", 268368),
        ("fdnas", _fdnas(), "cluster-1", 143104),
        ("cfdnas", _fdnas(), "cluster-1", 143104),
        ("decnas", _decnas(), "GM_2", 2 * 371439),
        ("heterofl", _widths("heterofl"), "2", 2 * 150_000),
        ("fjord", _widths("fjord"), "2", 2 * 150_000),
    ],
)
def test_every_summary_table_shows_mflops_and_mmacs_side_by_side(
    method: str, document: dict[str, Any], first_cell: str, flops: int
) -> None:
    """The papers' "FLOPs" are MACs: every table of models has MFLOPs/sample (2 x MACs,
    torch.utils.flop_counter) and MMACs/sample next to it, MACs = FLOPs / 2."""
    lines = summary_lines(method, document)
    header = next(line for line in lines if "MFLOPs/sample" in line)  # a title may precede
    columns = [c.strip() for c in _columns(header) if c.strip()]
    at = columns.index("MFLOPs/sample")
    assert columns[at + 1] == "MMACs/sample"
    cells = [c.strip() for c in _columns(_line(lines, first_cell)) if c.strip()]
    mflops, mmacs = float(cells[at]), float(cells[at + 1])
    assert mflops == pytest.approx(flops / 1e6, rel=5e-4)
    assert mmacs == pytest.approx(flops / 2e6, rel=5e-4)
    assert mmacs == pytest.approx(mflops / 2, rel=1e-3)


def _line(lines: list[str], first_cell: str) -> str:
    """The first line of ``lines`` whose first cell is ``first_cell``."""
    return next(line for line in lines if line.split()[:1] == [first_cell])


def test_a_run_by_latency_shows_milliseconds_next_to_the_flops() -> None:
    fedoras = _fedoras()
    fedoras["models"] = [
        {**m, "latency_ms": 0.25 * (i + 1)} for i, m in enumerate(fedoras["models"])
    ]
    lines = summary_lines("fedoras", fedoras)
    assert lines[1].split()[:7] == [
        "tier",
        "init",
        "model",
        "MFLOPs/sample",
        "MMACs/sample",
        "latency",
        "ms",
    ]
    assert _row(lines, "T2")[3:6] == ["0.2684", "0.1342", "0.75"]
    fdnas = _fdnas()
    fdnas["nets"] = [{**n, "predicted_ms": 1.5} for n in fdnas["nets"]]
    assert _row(summary_lines("fdnas", fdnas), "cluster-1")[2:5] == ["0.1431", "0.07155", "1.5"]
    decnas = _decnas()
    decnas["frontier"] = [{**m, "latency_ms": 0.125} for m in decnas["frontier"]]
    assert _row(summary_lines("decnas", decnas), "GM_2")[2:5] == ["0.7429", "0.3714", "0.125"]
    dpfnas = {**_dpfnas(), "latency": {"budget_ms": 2.0, "predicted_ms": 1.75}}
    text = "\n".join(summary_lines("dpfnas", dpfnas))
    assert "latency on the parties' table: 1.75 ms (budget 2 ms)" in text
    # by FLOPs: no such column or line
    assert "latency ms" not in summary_lines("fedoras", _fedoras())[1]
    assert "latency" not in "\n".join(summary_lines("dpfnas", _dpfnas()))


def test_a_run_with_a_global_test_set_shows_its_accuracy_in_the_last_column() -> None:
    fedoras = _fedoras()
    first, rand_init, untested = fedoras["models"]
    fedoras["models"] = [{**first, "global_test_accuracy": 0.4567891}, rand_init, untested]
    lines = summary_lines("fedoras", fedoras)
    assert lines[1].rstrip().endswith("global test acc")
    # the supernet row has one; rand-init's and the untested tier's have none: "-"
    rows = [line.split() for line in lines[2:] if line.split()[:1] in (["T1"], ["T2"])]
    assert [(row[1], row[-1]) for row in rows] == [
        ("supernet", "0.4568"),
        ("random", "-"),
        ("supernet", "-"),
    ]
    fdnas = _fdnas()
    fdnas["nets"][0]["global_test_accuracy"] = 0.5
    assert _row(summary_lines("fdnas", fdnas), "cluster-1")[-1] == "0.5"
    decnas = _decnas()
    decnas["frontier"][0].update(global_test_accuracy=0.75, tuned_global_test_accuracy=0.875)
    lines = summary_lines("decnas", decnas)
    assert lines[1].rstrip().endswith("global test acc  global test acc after tuning")
    assert _row(lines, "GM_2")[-2:] == ["0.75", "0.875"]
    dpfnas = {**_dpfnas(), "global_test_accuracy": 0.25, "global_test_count": 450}
    text = "\n".join(summary_lines("dpfnas", dpfnas))
    assert "global test acc of the derived net: 0.25 (450 samples on the server)" in text
    # without a global test set, no such column or line
    for method, document in [("fedoras", _fedoras()), ("fdnas", _fdnas()), ("decnas", _decnas())]:
        assert "global" not in summary_lines(method, document)[1]
    assert "global" not in "\n".join(summary_lines("dpfnas", _dpfnas()))


def test_summary_of_unknown_method_is_refused() -> None:
    with pytest.raises(ValueError, match="method 'nasnet': allowed: one of fedoras, fdnas"):
        summary_lines("nasnet", {})


# ------------------------------------------------------------------ logging


@pytest.fixture
def flwr_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger("flwr")
    root = logging.getLogger()
    saved = (list(root.handlers), list(logger.filters), [(h, h.level) for h in logger.handlers])
    yield logger
    root.handlers, logger.filters = saved[0], saved[1]
    for handler, level in saved[2]:
        handler.setLevel(level)


def _printing_handlers(logger: logging.Logger) -> list[logging.Handler]:
    """Handlers a ``flwr`` record reaches that print it (pytest's capture excluded)."""
    found = []
    while logger is not None:
        found += [h for h in logger.handlers if not type(h).__module__.startswith("_pytest")]
        logger = logger.parent if logger.propagate else None  # type: ignore[assignment]
    return found


def test_setup_logging_prints_each_flwr_line_once(
    flwr_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(progress.VERBOSE_ENV, raising=False)
    import opacus.utils.module_utils  # noqa: F401  (its import calls logging.basicConfig)

    root = logging.getLogger()
    opacus_handler = logging.StreamHandler()
    opacus_handler.setFormatter(logging.Formatter(progress._OPACUS_FORMAT))
    root.addHandler(opacus_handler)  # as on a fresh process, where basicConfig adds it
    assert len(_printing_handlers(flwr_logger)) == 2  # the duplicate of every line
    setup_logging()
    setup_logging()  # idempotent: no handler added
    printing = _printing_handlers(flwr_logger)
    assert [type(h).__name__ for h in printing] == ["ConsoleHandler"]
    assert printing[0].level == logging.INFO  # DEBUG (Ray backend set-up) hidden
    assert flwr_logger.propagate  # pytest's caplog still sees flwr records


def test_a_later_basic_config_adds_no_second_printer(flwr_logger: logging.Logger) -> None:
    # opacus imported after the ServerApp set logging up (the simulation engine loads the
    # ClientApp then; DP-FNAS's client imports opacus): its basicConfig must add nothing
    root = logging.getLogger()
    root.handlers = []  # a fresh process (no pytest capture handlers)
    setup_logging(False)
    logging.basicConfig(format=progress._OPACUS_FORMAT)  # what opacus' import runs
    printing = [h for h in _printing_handlers(flwr_logger) if type(h) is not logging.NullHandler]
    assert [type(h).__name__ for h in printing] == ["ConsoleHandler"]


def test_setup_logging_keeps_other_root_handlers(flwr_logger: logging.Logger) -> None:
    other = logging.StreamHandler()
    other.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger().addHandler(other)
    setup_logging(False)
    assert other in logging.getLogger().handlers


#: a library app's ServerApp as a user writes it, without `setup_logging`: it imports the
#: strategies (DP-FNAS's accountant imports opacus) and DP-FNAS's per-sample check (its
#: lazy opacus import, as on a ClientApp), then logs one line through Flower's logger
LIBRARY_APP = """
import fedorasflwr.strategies
from fedorasflwr.methods.dpfnas import per_sample
from fedorasflwr.search_spaces.base import build_space
from logging import INFO
from flwr.common.logger import log
space = build_space("darts", channels=2, cells=2, input_height=28, input_width=28)
per_sample.per_sample_problem(space, samples=2)
log(INFO, "fedorasflwr: the one line")
"""


def test_a_library_app_prints_each_line_once() -> None:
    # `flwr run` streams the ServerApp's stdout and stderr: a root handler opacus added
    # printed every flwr line a second time (issue 32)
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", LIBRARY_APP],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert output.count("fedorasflwr: the one line") == 1, output


def test_verbose_restores_debug(
    flwr_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(progress.VERBOSE_ENV, "1")
    setup_logging()
    printing = _printing_handlers(flwr_logger)
    assert [h.level for h in printing] == [logging.DEBUG]


def test_quiet_flower_strategy_drops_only_flower_strategy_info(
    flwr_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flwr.serverapp.strategy import FedAvg

    monkeypatch.delenv(progress.VERBOSE_ENV, raising=False)
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    keep = Keep(level=logging.DEBUG)
    flwr_logger.addHandler(keep)
    try:
        with quiet_flower_strategy():
            FedAvg(fraction_evaluate=0.0).summary()
            log(logging.INFO, "project line")
        assert seen == ["project line"]
        FedAvg(fraction_evaluate=0.0)  # outside: Flower's warning is back
        assert any("fraction_evaluate is set to 0.0" in m for m in seen)
        seen.clear()
        monkeypatch.setenv(progress.VERBOSE_ENV, "1")
        with quiet_flower_strategy():
            FedAvg(fraction_evaluate=0.0).summary()
        assert len(seen) > 3  # --verbose: Flower's banner again
    finally:
        flwr_logger.removeHandler(keep)
    assert not flwr_logger.filters


def test_launcher_passes_verbose_on(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    def fake_run_simulation(app_dir: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        raise KeyboardInterrupt  # stop before any Flower process

    monkeypatch.setattr(cli, "run_simulation", fake_run_simulation)
    assert cli.main(["--num-supernodes", "2"]) == 130
    assert cli.main(["--num-supernodes", "2", "--verbose"]) == 130
    quiet, loud = calls
    assert quiet["env"] == {} and quiet["federation_config"] is None
    assert loud["env"][progress.VERBOSE_ENV] == "1"
    assert loud["env"]["FLWR_LOG_LEVEL"] == "DEBUG"
    assert loud["federation_config"] == {"verbose": True}


def test_ray_tip_filter_is_a_valid_precise_warning_filter() -> None:
    import subprocess
    import sys

    code = (
        "import warnings\n"
        "warnings.warn_explicit('tip', FutureWarning, 'worker.py', 1, 'ray._private.worker')\n"
        "warnings.warn_explicit('other', FutureWarning, 'x.py', 1, 'other.module')\n"
    )
    env = {"PYTHONWARNINGS": simulation.RAY_TIP_FILTER}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert "other" in out.stderr and "tip" not in out.stderr


# ------------------------------------------------------------------ the launcher's echo

LOG = [
    "\x1b[92mINFO \x1b[0m:      Starting FedorAS\n",
    "\x1b[92mINFO \x1b[0m:      [supernet] round 1/4: loss 2.1 | 30.0s, ETA 1m30s\n",
    "\x1b[92mINFO \x1b[0m:      [supernet] round 2/4: loss 1.9 | 60.0s, ETA 1m00s\n",
    "\x1b[92mINFO \x1b[0m:      [finetune-T1] round 1/3: loss 1.0 | 5.0s, ETA 10.0s\n",
]


def test_progress_echo_writes_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    echo = ProgressEcho(out)
    assert not echo.terminal
    for line in LOG:
        echo(line)
    echo.close()
    assert out.getvalue() == "".join(LOG)  # each line once, unchanged, no bar


PREAMBLE = [
    "\x1b[92mINFO \x1b[0m:      Starting logstream for run_id `123`\n",
    "\x1b[92mINFO \x1b[0m:      Starting Flower Simulation\n",
    "\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed\n",
    "\x1b[92mINFO \x1b[0m:      To change federation size, use the following command:\n",
    "\x1b[92mINFO \x1b[0m:      \tflwr federation simulation-config @none/default <superlink>\n",
    "(ClientAppActor pid=1) \x1b[93mWARNING \x1b[0m:   Manually terminating ClientAppActor\n",
    "\x1b[92mINFO \x1b[0m:      \n",
]


@pytest.mark.parametrize("verbose_output", [False, True])
def test_progress_echo_drops_flowers_preamble_unless_verbose(verbose_output: bool) -> None:
    out = io.StringIO()
    echo = ProgressEcho(out, verbose_output=verbose_output)
    kept = "\x1b[92mINFO \x1b[0m:      Federation `@none/default` (20 simulated SuperNodes)\n"
    for line in [*PREAMBLE, kept, *LOG]:
        echo(line)
    expected = [*PREAMBLE, kept, *LOG] if verbose_output else [kept, *LOG]
    assert out.getvalue() == "".join(expected)


def test_stage_clock_due_throttles_lines_and_leaves_the_last_to_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    monkeypatch.setattr("fedorasflwr.progress.time.perf_counter", lambda: now[0])
    clock = StageClock("finetune-t1", total=5)
    assert [clock.due(step) for step in range(0, 6)] == [False] + [True] * 5  # every step
    shown = []
    for step, seconds in zip(range(1, 6), (10, 31, 40, 70, 200), strict=True):
        now[0] = seconds
        shown.append(clock.due(step, every=30.0))
    # 31 s and 70 s are >= 30 s after the last line; step 5 (the last) is the caller's
    assert shown == [False, True, False, True, False]


def test_progress_echo_follows_the_stage_in_progress_on_a_terminal() -> None:
    out = io.StringIO()
    echo = ProgressEcho(out, terminal=True)
    for line in LOG[:3]:
        echo(line)
    (task,) = echo._bar.tasks
    assert (task.description, task.completed, task.total) == ("supernet", 2, 4)
    echo(LOG[3])
    (task,) = echo._bar.tasks  # the finished stage's bar is replaced
    assert (task.description, task.completed, task.total) == ("finetune-T1", 1, 3)
    echo.close()
    text = out.getvalue()
    for line in LOG:  # every line printed once, colour codes rendered by rich
        assert text.count(STEP_LINE.sub("", line.split(":      ")[1]).strip()) >= 1
    assert text.count("Starting FedorAS") == 1


def test_id_ranges_folds_runs_and_shows_no_ids_as_a_dash():
    from fedorasflwr.progress import id_ranges

    assert id_ranges([8, 0, 1, 2, 5, 7]) == "0-2,5,7-8"
    assert id_ranges([3]) == "3"
    assert id_ranges([]) == "-"


def test_width_summary_of_a_tier_no_client_serves():
    """A deployment with fewer nodes than tiers leaves a tier without clients: the end-of-run
    summary still prints (it crashed the ServerApp at the very end of the run)."""
    from fedorasflwr.methods.widths.summary import summary

    tier = {"tier": 2, "width": 0.5, "macs": 2e6, "params": 100, "test_accuracy": None}
    lines = summary({"mode": "heterofl", "tiers": [{**tier, "partitions": []}]})
    assert any(" - " in line or "| - |" in line for line in lines[1:]), lines


@pytest.mark.slow
@pytest.mark.parametrize("method", ["heterofl", "fjord"])
def test_the_width_baselines_round_lines_carry_a_loss_and_an_eta(
    method: str, data_cache: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Like every method's: ``[heterofl] round 1/2: train-loss 2.1; clients 4/4 | 3.2s,
    ETA 3.2s`` (the loss: the replies' mean, weighted by their examples)."""
    import logging
    import re

    from flwr.app import ArrayRecord

    from fedorasflwr.client_app import app as client_app
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.inprocess import InProcessGrid
    from fedorasflwr.strategies import FjORD, HeteroFL
    from tests.runconfig import FEW_ROWS, pyproject_run_config

    config = pyproject_run_config()
    config.update(
        {
            "method": method,
            "data.cache-dir": str(data_cache),
            "onnx": False,
            f"{method}.rounds": 2,
            f"{method}.batch-size": 64,
            **FEW_ROWS,  # the lines' form holds at any data size
        }
    )
    settings = parse_run_config(config)
    image = {"num_classes": 10, "in_channels": 1, "input_height": 28, "input_width": 28}
    strategy = (HeteroFL if method == "heterofl" else FjORD)(
        image=image, settings=settings.method_settings, seed=settings.seed
    )
    with caplog.at_level(logging.INFO, logger="flwr"):
        result = strategy.start(InProcessGrid(client_app, config, 4), ArrayRecord(), num_rounds=2)
    line = re.compile(
        rf"^\[{method}\] round (\d)/2: train-loss ([0-9.]+); clients 4/4 \| [0-9ms.]+(, ETA )?"
    )
    found = [m for m in map(line.match, caplog.messages) if m is not None]
    assert [m[1] for m in found] == ["1", "2"], caplog.text
    assert found[0][3] == ", ETA " and found[1][3] is None  # no ETA after the last round
    losses = [float(m[2]) for m in found]
    assert losses == pytest.approx([h["train-loss"] for h in result.history], rel=1e-3)
    assert all(0 < loss < 10 for loss in losses)


def test_fjord_summary_says_how_little_the_wide_slices_train() -> None:
    """Why quick-fjord's accuracy fell with width after 4 rounds: of every client-batch,
    the channels of width 1 train in 1/16 (4 tiers of 5 clients, widths uniform up to each
    p_max); the summary prints the shares."""
    from fedorasflwr.methods.widths.settings import FjORDSettings
    from fedorasflwr.methods.widths.summary import summary, update_shares

    ladder = (0.25, 0.5, 0.75, 1.0)
    tiers = [(w, 5) for w in ladder]
    shares = update_shares(ladder, tiers)
    assert shares == pytest.approx([1.0, (1 / 2 + 2 / 3 + 3 / 4) / 4, (1 / 3 + 2 / 4) / 4, 1 / 16])
    assert update_shares(ladder, [(1.0, 5)]) == pytest.approx([1.0, 0.75, 0.5, 0.25])
    document = _widths("fjord")
    lines = summary(document, FjORDSettings(widths=(0.5, 1.0), tier_widths=(0.5, 1.0)))
    assert lines[-1].startswith("share of client-batches training each width's outer channels:")
    assert "0.5 1, 1 0.25 (ordered dropout" in lines[-1]  # tiers of 1 client each
    assert not any("share" in line for line in summary(_widths("heterofl")))
