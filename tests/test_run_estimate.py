"""The whole run's ETA of FDNAS, CFDNAS, DP-FNAS and DecNAS: each method's plan from small
settings, checked against hand-computed stages, and one tiny in-process run per method whose
clock lines carry ``run ETA``, down to 0 at its last step (every planned step was seen: the
plan's stage names are the names of the method's clocks)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import TrainingRecipe, parse_run_config
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.decnas.runner import decnas_plan
from fedorasflwr.methods.decnas.settings import DecNASSettings
from fedorasflwr.methods.dpfnas.runner import ITERATION_WORK, dpfnas_plan
from fedorasflwr.methods.dpfnas.settings import DPFNASSettings
from fedorasflwr.methods.fdnas.runner import fdnas_plan, planned_clusters
from fedorasflwr.methods.fdnas.settings import FDNASSettings
from fedorasflwr.methods.fednas.settings import FedNASSettings
from fedorasflwr.progress import PlannedStage, RunEstimate, nodes_profiled
from fedorasflwr.server_app import runner
from tests.runconfig import FEW_ROWS, tiny_decnas, tiny_fdnas, tiny_fednas
from tests.strategies.test_dpfnas_strategy import small_dpfnas

# ------------------------------------------------------------------ the plans


def _fdnas_settings() -> FDNASSettings:
    return FDNASSettings(
        train=TrainingRecipe(rounds=4, clients_per_round=4, local_epochs=2),
        cluster_rounds=2,
        final=TrainingRecipe(rounds=5, clients_per_round=4, local_epochs=1),
    )


def test_fdnas_plan_searches_then_trains_the_net_on_every_node() -> None:
    plan = fdnas_plan(_fdnas_settings(), nodes=10)
    assert plan.stages == [
        PlannedStage("search", 4, 4 * 2),  # 4 of 10 clients, 2 local epochs
        PlannedStage("final-fdnas", 5, 10 * 1),  # the net's FedAvg: every node
    ]


def test_cfdnas_plan_adds_each_cluster_s_search_and_net() -> None:
    plan = fdnas_plan(_fdnas_settings(), nodes=10, clusters=3)
    # clusters of partitions 0-2, 3-5, 6-9: search rounds of 3, 3 and 4 clients x 2 epochs
    assert plan.stages[2:] == [
        PlannedStage("cluster-*", 3 * 2, (3 + 3 + 4) * 2 / 3),
        PlannedStage("final-cluster-*", 3 * 5, 10 / 3),  # every node of its cluster
    ]
    assert plan.stages[2].covers("cluster-2") and not plan.stages[2].covers("final-cluster-2")
    # more clusters than nodes: the empty ranges are no clusters
    assert fdnas_plan(_fdnas_settings(), nodes=2, clusters=3).stages[2:] == [
        PlannedStage("cluster-*", 2 * 2, 1 * 2),
        PlannedStage("final-cluster-*", 2 * 5, 1.0),
    ]


def test_cfdnas_plans_the_class_groups_or_num_clusters() -> None:
    groups = tiny_fdnas("-", method="cfdnas", **{"data.class-groups": "0,1;2,3;4,5;6,7,8,9"})
    assert planned_clusters(parse_run_config(groups)) == 4
    contiguous = tiny_fdnas("-", method="cfdnas", **{"data.partitioner": "iid"})
    contiguous["fdnas.num-clusters"] = 2
    assert planned_clusters(parse_run_config(contiguous)) == 2


def test_dpfnas_plan_of_its_search_and_final_training() -> None:
    settings = DPFNASSettings(
        iterations=6, final=TrainingRecipe(rounds=3, clients_per_round=0, local_epochs=2)
    )
    assert dpfnas_plan(settings, nodes=4).stages == [
        PlannedStage("DP-FNAS", 6, 4 * ITERATION_WORK),
        PlannedStage("final", 3, 4 * 2),  # clients 0: every party
    ]
    single = DPFNASSettings(
        mode="single",
        iterations=6,
        final=TrainingRecipe(rounds=3, clients_per_round=2, local_epochs=2),
    )
    assert dpfnas_plan(single, nodes=4).stages == [
        PlannedStage("DP-FNAS", 6, ITERATION_WORK),  # one party
        PlannedStage("final", 3, 1 * 2),
    ]


def _decnas_settings(**changes: object) -> DecNASSettings:
    return DecNASSettings(
        train=TrainingRecipe(rounds=3, clients_per_round=0, local_epochs=2),
        max_iterations=3,
        num_groups=2,
        drop_ratio=0.33,
        rounds=(1, 3),
        rounds_every=2,
        final_rounds=4,
        **changes,
    )


def test_decnas_plan_follows_the_round_schedule_and_the_dropping() -> None:
    plan = decnas_plan(_decnas_settings(), nodes=6, layers=4)
    # a candidate trains on a group of 6 / 2 = 3 clients for 2 epochs; ceil(0.33 x 4) = 2
    # candidates dropped after each round
    assert plan.stages == [
        PlannedStage("gm0", 3, 6 * 2),
        PlannedStage("iteration-1", 1, 4 * 3 * 2),  # schedule block 1: 1 round
        PlannedStage("iteration-2", 1, 4 * 3 * 2),
        PlannedStage("iteration-3", 3, (4 + 2 + 1) / 3 * 3 * 2),  # block 2: 3 rounds
        PlannedStage("final-gm*", 4, 6 * 2),  # GM_T only
    ]


def test_decnas_plan_of_the_naive_variant_with_every_model_tuned() -> None:
    settings = _decnas_settings(variant="naive", final_models="all", width_baseline=True)
    plan = decnas_plan(settings, nodes=6, layers=4)
    # no groups (every client trains each candidate), no dropping, the largest round number
    iterations = [PlannedStage(f"iteration-{t}", 3, 4 * 6 * 2) for t in (1, 2, 3)]
    assert plan.stages == [
        PlannedStage("gm0", 3, 12.0),
        *iterations,
        PlannedStage("final-gm*", 3 * 4, 12.0),  # GM_1..GM_3
        PlannedStage("width-*", 3 * (3 + 4), 12.0),  # each baseline: GM_0's and tuning rounds
    ]


# ------------------------------------------------------------------ tiny runs

#: a clock line with the run's ETA: its stage and the seconds left
RUN_ETA = re.compile(
    r"^\[(?P<stage>[^\]]+)\] \w+ \d+/\d+: .*, run ETA (?P<left>[0-9.]+s|\d+m\d+s|\d+h\d+m)"
)

#: method -> (its tiny run config, nodes, the clock stages that must show the run's ETA);
#: the ETA's steps do not depend on the data's size: 64 rows per client (FEW_ROWS), but
#: CFDNAS keeps its partitioner (its clusters are the class groups of the partitions)
RUNS = {
    "fdnas": (
        lambda cache: tiny_fdnas(cache, **{"min-nodes": 6}, **FEW_ROWS),
        6,
        {"search", "final-fdnas"},
    ),
    "cfdnas": (
        lambda cache: tiny_fdnas(cache, method="cfdnas", **{"min-nodes": 6}),
        6,
        {"search", "final-fdnas", "cluster-0", "cluster-2", "final-cluster-0", "final-cluster-2"},
    ),
    "dpfnas": (
        lambda cache: small_dpfnas(cache, **{"min-nodes": 2}, **FEW_ROWS),
        2,
        {"DP-FNAS", "final"},
    ),
    "fednas": (
        lambda cache: tiny_fednas(cache, **{"min-nodes": 2}, **FEW_ROWS),
        2,
        {"FedNAS", "final"},
    ),
    "decnas": (
        lambda cache: tiny_decnas(cache, **{"min-nodes": 6}, **FEW_ROWS),
        6,
        {"gm0", "iteration-1", "final-gm1"},
    ),
}


@pytest.mark.parametrize("method", list(RUNS))
def test_a_tiny_run_shows_the_run_eta_down_to_zero(
    method: str, data_cache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_config, nodes, stages = RUNS[method]
    config = {**make_config(data_cache), "output-dir": str(tmp_path)}
    settings = parse_run_config(config)
    with caplog.at_level(logging.INFO, logger="flwr"):
        runner(method)(InProcessGrid(client_app, config, nodes), settings, tmp_path)
    lines = [m for m in map(RUN_ETA.match, caplog.messages) if m is not None]
    assert stages <= {m["stage"] for m in lines}, caplog.text
    # the last step of the plan: every planned step was seen, none is left
    assert lines[-1]["left"] == "0.0s", lines[-1].string


# ------------------------------------------------------------------ the node count


def _quick_dpfnas_settings() -> DPFNASSettings:
    """configs/quick-dpfnas.toml's stages: 3 iterations; 4 final rounds of 10 clients x 5."""
    return DPFNASSettings(
        iterations=3, final=TrainingRecipe(rounds=4, clients_per_round=10, local_epochs=5)
    )


def test_the_plan_is_made_again_for_the_nodes_profiled() -> None:
    # the bug: every runner planned for ``min-nodes`` (2 by default), not the federation's 20
    settings = _quick_dpfnas_settings()
    estimate = dpfnas_plan(settings, nodes=2)
    with estimate.active():
        nodes_profiled(20)
    assert estimate.stages == dpfnas_plan(settings, nodes=20).stages
    assert estimate.stages[0] == PlannedStage("DP-FNAS", 3, 20 * ITERATION_WORK)
    nodes_profiled(5)  # no estimate active: nothing to tell, nothing changes
    assert estimate.stages == dpfnas_plan(settings, nodes=20).stages


def test_quick_dpfnas_run_eta_after_its_first_iteration() -> None:
    # The quick preset's first iteration (54.4 s, 20 parties): the run ETA is the search's
    # 2 iterations left plus the final training's 4 rounds x 10 clients x 5 epochs at the
    # seconds per client-epoch seen. Planned for min-nodes = 2 (with ITERATION_WORK 0.15) it
    # said 41m31s after an 18.4 s iteration, for a run that took under 5 minutes.
    settings = _quick_dpfnas_settings()
    estimate = dpfnas_plan(settings, nodes=2)
    with estimate.active():
        nodes_profiled(20)
    estimate.record("DP-FNAS", 1, 54.4)
    per_work = 54.4 / (20 * ITERATION_WORK)
    left = estimate.remaining()
    assert left == pytest.approx(2 * 54.4 + 4 * 10 * 5 * per_work)
    # measured: about 3.5 minutes after it (2 iterations, 4 final rounds of 24-42 s)
    assert left < 5 * 60


@pytest.mark.slow
def test_a_run_plans_for_the_nodes_it_profiled(
    data_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiny FedNAS run of 3 nodes waiting for 1 (``min-nodes``): its estimate, made for
    1, is planned again for the 3 the strategy profiled."""
    from fedorasflwr.methods.fednas import runner as fednas_runner

    made: list[RunEstimate] = []
    planned = fednas_runner.fednas_plan

    def keep(settings: FedNASSettings, nodes: int) -> RunEstimate:
        made.append(planned(settings, nodes))
        return made[-1]

    monkeypatch.setattr(fednas_runner, "fednas_plan", keep)
    config = {**tiny_fednas(data_cache, **{"min-nodes": 1}), "output-dir": str(tmp_path)}
    settings = parse_run_config(config)
    runner("fednas")(InProcessGrid(client_app, config, 3), settings, tmp_path)
    method = settings.method_settings
    assert made[0].stages == planned(method, 3).stages != planned(method, 1).stages


def test_quick_fednas_run_eta_after_its_first_round() -> None:
    """configs/quick-fednas.toml's first search round took 57.6 s (5 clients x 2 epochs of
    the mixed supernet); the rest of the run took about 3 minutes (2 more rounds, then 4
    final rounds of about 15.5 s). With SEARCH_WORK at 2 the run ETA said 11m31s."""
    from fedorasflwr.methods.fednas.runner import SEARCH_WORK, fednas_plan

    settings = FedNASSettings(
        search=TrainingRecipe(rounds=3, clients_per_round=5, local_epochs=2),
        final=TrainingRecipe(rounds=4, clients_per_round=10, local_epochs=5),
    )
    estimate = fednas_plan(settings, nodes=20)
    estimate.record("FedNAS", 1, 57.6)
    left = estimate.remaining()
    assert left == pytest.approx(2 * 57.6 + 4 * 10 * 5 * 57.6 / (5 * 2 * SEARCH_WORK))
    assert 2 * 60 < left < 4 * 60
