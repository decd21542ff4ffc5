"""DP-FNAS accounting: a party's epsilon is composed from its (noise, rate, steps) history,
cached (``privacy.Accountant``) and equal to opacus's uncached accountants; a resumed
search accounts each past step at the noise it was taken with, never at today's."""

from __future__ import annotations

import math
import warnings

import pytest
from flwr.app import ArrayRecord
from opacus.accountants import GaussianAccountant, PRVAccountant, RDPAccountant
from opacus.accountants.analysis import gdp as gdp_analysis

from fedorasflwr.checkpoints import Checkpointer, read_resume
from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.dpfnas.privacy import (
    Accountant,
    PartyPrivacy,
    add_steps,
    gdp_mu,
    history_mu,
)
from fedorasflwr.methods.dpfnas.strategy import DPFNAS
from fedorasflwr.runs import build_supernet
from tests.strategies.test_dpfnas_strategy import small_dpfnas

DELTA = 1e-5
HISTORIES = [
    [(1.0, 0.01, 10)],
    [(1.0, 0.01, 10), (4.0, 0.01, 5)],
    [(0.8, 0.2, 3), (1.5, 0.05, 100), (0.8, 0.2, 2)],
    [(2.0, 1.0, 1)],
    [(1.1, 0.003, 1000), (1.1, 0.004, 1000)],
]


def opacus_epsilon(kind: str, history) -> float:
    """A fresh opacus accountant of ``kind`` given ``history`` (uncached)."""
    account = {"rdp": RDPAccountant, "prv": PRVAccountant}[kind]()
    account.history = list(history)
    return float(account.get_epsilon(delta=DELTA))


@pytest.mark.parametrize("history", HISTORIES, ids=lambda h: f"{len(h)}-segments")
def test_the_cached_rdp_accountant_equals_opacus_bit_for_bit(history):
    account = Accountant("rdp", DELTA)
    first = account.epsilon(history)
    assert first == opacus_epsilon("rdp", history)
    # one step at a time, as a search takes them: every prefix equals opacus too
    grown: list = []
    for noise, rate, steps in history:
        for _ in range(min(steps, 7)):
            grown = add_steps(grown, noise, rate)
            assert account.epsilon(grown) == opacus_epsilon("rdp", grown)
    assert account.epsilon(history) == first


@pytest.mark.parametrize("history", HISTORIES[:3], ids=lambda h: f"{len(h)}-segments")
def test_the_cached_prv_accountant_equals_opacus(history):
    assert Accountant("prv", DELTA).epsilon(history) == pytest.approx(
        opacus_epsilon("prv", history), rel=1e-12
    )


def test_the_cached_gdp_accountant_equals_opacus_and_composes_mu():
    account = Accountant("gdp", DELTA)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opacus = GaussianAccountant()
    opacus.history = [(1.0, 0.01, 10)]
    assert account.epsilon([(1.0, 0.01, 10)]) == opacus.get_epsilon(delta=DELTA)
    two = [(1.0, 0.01, 10), (4.0, 0.02, 5)]
    mu = math.hypot(gdp_mu(1.0, 0.01, 10), gdp_mu(4.0, 0.02, 5))
    assert history_mu(two) == pytest.approx(mu, rel=1e-12)
    assert account.epsilon(two) == pytest.approx(
        gdp_analysis.eps_from_mu(mu=mu, delta=DELTA), rel=1e-12
    )


def test_histories_merge_like_opacus_and_are_remembered():
    history = add_steps([], 1.0, 0.1)
    history = add_steps(history, 1.0, 0.1, 2)
    history = add_steps(history, 4.0, 0.1)
    assert history == [(1.0, 0.1, 3), (4.0, 0.1, 1)]
    assert add_steps(history, 4.0, 0.1, 0) == history
    account = Accountant("rdp", DELTA)
    assert account.epsilon([]) == 0.0 and account.epsilon([(0.0, 0.1, 1)]) == math.inf
    for _ in range(3):
        account.epsilon(history)
    assert account.computed == 1
    account.epsilon(add_steps(history, 4.0, 0.1))
    assert account.computed == 2
    assert len(account._rdp) == 2  # one per-step RDP per (noise, rate), whatever the steps
    # the uncached reference of one mechanism, one segment
    one = PartyPrivacy.compute(
        0,
        sigma=1.0,
        tau=1.0,
        rate_train=0.1,
        rate_val=0.2,
        steps_weights=3,
        steps_arch=3,
        delta=DELTA,
        accountant="rdp",
    )
    assert one.weights.epsilon == account.epsilon([(1.0, 0.1, 3)])


# --- a resumed search keeps its steps' noise --------------------------------------------


@pytest.fixture(scope="module")
def after_one_iteration(data_cache, tmp_path_factory):
    """A checkpoint after one search iteration at sigma = tau = 1 (``resume.stage_done``
    cleared: as a run of more iterations writes it)."""
    config = small_dpfnas(data_cache, **{"dpfnas.iterations": 1, "dpfnas.final-rounds": 0})
    settings = parse_run_config(config)
    out = tmp_path_factory.mktemp("dpfnas-accounts")
    strategy = DPFNAS(
        space=build_supernet(settings), settings=settings.method_settings, seed=settings.seed
    )
    strategy.on_progress = Checkpointer(out, method="dpfnas", seed=settings.seed, every=1)
    strategy.start(InProcessGrid(client_app, config, 2), ArrayRecord(), 1)
    return out / "checkpoint.pt"


def resumed(path, data_cache, **overrides):
    config = small_dpfnas(
        data_cache, **{"dpfnas.iterations": 3, "dpfnas.final-rounds": 0, **overrides}
    )
    settings = parse_run_config(config)
    resume = read_resume(str(path), method="dpfnas", seed=settings.seed, reference=None, space=None)
    resume.stage_done = False
    strategy = DPFNAS(
        space=build_supernet(settings),
        settings=settings.method_settings,
        seed=settings.seed,
        resume=resume,
    )
    return strategy, resume, InProcessGrid(client_app, config, 2)


def test_a_resumed_search_accounts_each_step_at_the_noise_it_was_taken_with(
    after_one_iteration, data_cache
):
    """The issue's case: steps taken at sigma 1 are not re-accounted at a later sigma 4
    (the runner refuses such a resume; the strategy's account is right even so)."""
    strategy, _, grid = resumed(
        after_one_iteration, data_cache, **{"dpfnas.noise-weights": 4.0, "dpfnas.noise-arch": 4.0}
    )
    result = strategy.start(grid, ArrayRecord(), 3)
    for party, profile in zip(result.privacy, strategy.parties, strict=True):
        rate_train, rate_val = strategy.sample_rates(profile)
        for mechanism, rate in ((party.weights, rate_train), (party.architecture, rate_val)):
            assert mechanism.history == ((1.0, rate, 1), (4.0, rate, 2))
            assert mechanism.steps == 3
            assert mechanism.epsilon == opacus_epsilon("rdp", mechanism.history)
            everything_at_4 = opacus_epsilon("rdp", [(4.0, rate, 3)])
            assert mechanism.epsilon > 1.5 * everything_at_4  # the first step's cost is kept
    saved = strategy.progress("completed", 3)["accounts"]
    assert saved[str(strategy.parties[0].partition_id)]["weights"][0][0] == 1.0


@pytest.mark.parametrize(
    ("corrupt", "fragment"),
    [
        (
            lambda a: a["0"].update(weights=[[1.0, 0.5, -1]]),
            "'weights'\\] holds \\[1.0, 0.5, -1\\]",
        ),
        (lambda a: a["0"].update(arch=[[1.0, 1.5, 1]]), "'arch'\\] holds \\[1.0, 1.5, 1\\]"),
        (lambda a: a["1"].update(arch="many"), "'arch'\\] = 'many'"),
        (lambda a: a["0"].update(weights=[[1.0, 0.5, 2]]), "has 2 steps, its step count 1"),
        (lambda a: a.pop("1"), "privacy histories of the parties \\[0\\]"),
    ],
)
def test_a_corrupt_privacy_history_is_refused(after_one_iteration, data_cache, corrupt, fragment):
    strategy, resume, grid = resumed(after_one_iteration, data_cache)
    corrupt(resume.progress["accounts"])
    with pytest.raises(ValueError, match=fragment):
        strategy.start(grid, ArrayRecord(), 3)


def test_more_steps_than_iterations_are_refused(after_one_iteration, data_cache):
    # a history and step count edited together still cannot claim more steps than the
    # iterations done (a party takes one step of each mechanism per iteration)
    strategy, resume, grid = resumed(after_one_iteration, data_cache)
    noise, rate, _ = resume.progress["accounts"]["0"]["weights"][0]
    resume.progress["accounts"]["0"]["weights"] = [[noise, rate, 5]]
    resume.progress["steps"]["0"]["weights"] = 5
    with pytest.raises(ValueError, match="has 5 steps after 1 iteration"):
        strategy.start(grid, ArrayRecord(), 3)


@pytest.mark.parametrize("iterations", [-2, 2, 99])
def test_an_iteration_count_other_than_the_checkpoints_step_is_refused(
    after_one_iteration, data_cache, iterations
):
    # the search resumes from progress 'iterations': it must be the step read_resume
    # checked (a negative one would run extra iterations, spending more privacy)
    strategy, resume, grid = resumed(after_one_iteration, data_cache)
    resume.progress["iterations"] = iterations
    with pytest.raises(ValueError, match=f"'iterations' = {iterations}"):
        strategy.start(grid, ArrayRecord(), 3)
