"""Flower's Strategy contract: each public strategy's ``start`` is called exactly as a Flower
user calls ``flwr.serverapp.strategy.Strategy.start`` (Flower's parameter names, by keyword
and by position) on the in-process grid with the real ClientApp, and returns a Flower
``Result`` with the method's extras; ``num_rounds`` sets the main stage's rounds,
``evaluate_fn`` sees the global arrays, ``train_config`` / ``evaluate_config`` reach the
clients, and an error reply handed to ``aggregate_train`` is skipped."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any

import pytest
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp.strategy import Result, Strategy

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.data import load_server_data
from fedorasflwr.federation.base import FederatedNASStrategy
from fedorasflwr.inprocess import InProcessGrid, error_reply
from fedorasflwr.methods.decnas.runner import build_decnas_net
from fedorasflwr.protocol import CONFIG
from fedorasflwr.runs import build_supernet
from fedorasflwr.strategies import CFDNAS, DPFNAS, FDNAS, DecNAS, FedorAS
from tests.runconfig import tiny_decnas, tiny_fdnas, tiny_fedoras
from tests.strategies.test_dpfnas_strategy import tiny_dpfnas
from tests.strategies.test_fdnas import make_strategy as fdnas_strategy

PUBLIC = (FedorAS, DecNAS, FDNAS, CFDNAS, DPFNAS)
TRAIN_KEY, EVALUATE_KEY = "user-train-key", "user-evaluate-key"


# --- the signature ------------------------------------------------------------------------


@pytest.mark.parametrize("cls", PUBLIC, ids=lambda c: c.__name__)
def test_start_declares_flowers_parameters(cls):
    flower = inspect.signature(Strategy.start).parameters
    ours = inspect.signature(cls.start).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == [
        (p.name, p.kind, p.default) for p in flower.values()
    ]
    assert issubclass(cls, Strategy)
    # one start for all (FederatedNASStrategy's); each method's run returns its Result
    assert cls.start is FederatedNASStrategy.start and "run" in cls.__dict__
    assert issubclass(typing.get_type_hints(cls.run)["return"], Result)
    settings = cls_settings(cls)()  # its defaults; the (dotted) rounds setting is an int
    head, _, field = cls.rounds_setting.partition(".")
    assert head in {f.name for f in dataclasses.fields(settings)}
    assert isinstance(
        getattr(getattr(settings, head), field) if field else getattr(settings, head), int
    )


def cls_settings(cls: type) -> type:
    """The settings class of strategy ``cls`` (the ``settings`` annotation of the first
    constructor in its MRO that names one: CFDNAS's passes it on to FDNAS's)."""
    hints = (typing.get_type_hints(c.__init__) for c in cls.__mro__ if "__init__" in c.__dict__)
    return next(h["settings"] for h in hints if "settings" in h)


# --- one run of each strategy as a Flower user starts it --------------------------------


class Recorder:
    """An ``evaluate_fn``: every call's round and arrays."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, ArrayRecord]] = []

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        self.calls.append((server_round, arrays))
        return MetricRecord({"keys": len(arrays)})


def inject_errors(strategy: FederatedNASStrategy) -> list[int]:
    """Hand ``aggregate_train`` an error reply (Flower's ``has_error()``) in front of the
    real ones at every call; returns the list the injections are counted in."""
    injected: list[int] = []
    original = strategy.aggregate_train

    def with_error(server_round: int, replies: Any, **stage: Any) -> Any:
        replies = list(replies)
        if replies:
            replies = [error_reply(replies[0], "injected ClientApp error"), *replies]
            injected.append(server_round)
        return original(server_round, replies, **stage)

    strategy.aggregate_train = with_error  # type: ignore[method-assign]
    return injected


def configs_of(grid: InProcessGrid, category: str) -> list[dict[str, Any]]:
    """The config records of the messages of ``category`` ("train" / "evaluate") sent."""
    return [
        dict(m.content.config_records[CONFIG])
        for m in grid.sent
        if m.metadata.message_type.startswith(category + ".") and CONFIG in m.content.config_records
    ]


def failures(result: Any) -> int:
    return sum(stage["totals"]["failed"] for stage in result.ledger.values() if "totals" in stage)


def check_contract(
    result: Any,
    grid: InProcessGrid,
    recorder: Recorder,
    injected: list[int],
    *,
    rounds: int,
    evaluated_rounds: list[int],
    evaluate_messages: bool,
) -> None:
    assert isinstance(result, Result)
    assert len(result.arrays) > 0
    assert sorted(result.train_metrics_clientapp) == list(
        range(1 if 0 not in result.train_metrics_clientapp else 0, rounds + 1)
    )
    assert [r for r, _ in recorder.calls] == evaluated_rounds
    assert all(isinstance(a, ArrayRecord) and len(a) for _, a in recorder.calls)
    assert sorted(result.evaluate_metrics_serverapp) == evaluated_rounds
    trained = configs_of(grid, "train")
    assert trained and all(c[TRAIN_KEY] == 7 for c in trained)
    assert all(EVALUATE_KEY not in c for c in trained)
    if evaluate_messages:
        evaluated = configs_of(grid, "evaluate")
        assert evaluated and all(c[EVALUATE_KEY] == "yes" for c in evaluated)
    assert injected and failures(result) >= len(injected)


def user_configs() -> tuple[ConfigRecord, ConfigRecord]:
    return ConfigRecord({TRAIN_KEY: 7}), ConfigRecord({EVALUATE_KEY: "yes"})


def test_fedoras_by_keyword(data_cache):
    # Stage 1 only (fedoras.stop-after); the config says 2 rounds, start says 1
    config = tiny_fedoras(data_cache, **{"fedoras.stop-after": "supernet", "fedoras.eval-every": 1})
    settings = parse_run_config(config)
    space = build_supernet(settings)
    strategy = FedorAS(space=space, settings=settings.method_settings, seed=settings.seed)
    injected = inject_errors(strategy)
    grid = InProcessGrid(client_app, config, 12)
    recorder = Recorder()
    train_config, evaluate_config = user_configs()
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(space.state_dict()),
        num_rounds=1,
        timeout=120.0,
        train_config=train_config,
        evaluate_config=evaluate_config,
        evaluate_fn=recorder,
    )
    check_contract(
        result,
        grid,
        recorder,
        injected,
        rounds=1,
        evaluated_rounds=[0, 1],
        evaluate_messages=False,
    )
    assert len(result.history) == 2 and result.tiers and result.tier_of_partition
    assert strategy.reply_timeout == 120.0
    assert result.arrays.keys() == space.state_dict().keys()


def test_fedoras_search_sends_the_evaluate_config(data_cache):
    # Stage 2 with federated scoring: the paths go to the clients as evaluate.* messages
    config = tiny_fedoras(
        data_cache,
        **{
            "fedoras.stop-after": "search",
            "fedoras.search-scoring": "federated",
            "fedoras.search-evaluations": 4,
        },
    )
    settings = parse_run_config(config)
    strategy = FedorAS(
        space=build_supernet(settings),
        settings=settings.method_settings,
        seed=settings.seed,
        server_data=load_server_data(settings.data),
    )
    grid = InProcessGrid(client_app, config, 12)
    train_config, evaluate_config = user_configs()
    result = strategy.start(grid, ArrayRecord(), 1, 60, train_config, evaluate_config)
    assert isinstance(result, Result) and result.searches
    evaluated = configs_of(grid, "evaluate")
    assert evaluated and all(c[EVALUATE_KEY] == "yes" for c in evaluated)
    # Flower's evaluate hooks score paths of the supernet; an error reply is skipped
    paths = [result.searches[0].best, result.searches[0].evaluated[-1].path]
    flat = [int(v) for path in paths for v in path]
    messages = list(
        strategy.configure_evaluate(
            7, result.arrays, ConfigRecord({"tier": 0, "paths": flat}), grid
        )
    )
    assert messages and all(m.metadata.message_type == "evaluate.fedoras_paths" for m in messages)
    replies = list(grid.send_and_receive(messages, timeout=60))
    metrics = strategy.aggregate_evaluate(
        7, [error_reply(replies[0], "injected ClientApp error"), *replies]
    )
    assert metrics is not None and metrics["clients"] == len(replies)
    assert len(metrics["accuracy"]) == 2 and all(0 <= a <= 1 for a in metrics["accuracy"])
    assert strategy.aggregate_evaluate(7, [error_reply(replies[0], "injected")]) is None


def test_decnas_positionally(data_cache):
    # the config allows 3 iterations, start 1; GM_0 trained 1 round, no tuning
    config = tiny_decnas(
        data_cache, **{"decnas.max-iterations": 3, "decnas.final-rounds": 0, "decnas.target": 0.1}
    )
    settings = parse_run_config(config)
    net = build_decnas_net(settings)
    strategy = DecNAS(net=net, settings=settings.method_settings, seed=settings.seed)
    injected = inject_errors(strategy)
    grid = InProcessGrid(client_app, config, 6)
    recorder = Recorder()
    train_config, evaluate_config = user_configs()
    result = strategy.start(
        grid,
        ArrayRecord(net.state_dict()),
        1,
        120.0,
        train_config,
        evaluate_config,
        recorder,
    )
    check_contract(
        result,
        grid,
        recorder,
        injected,
        rounds=1,
        evaluated_rounds=[0, 1],
        evaluate_messages=True,
    )
    assert len(result.frontier) == 2  # GM_0 and one iteration, not the config's 3
    assert result.arrays.keys() == result.frontier[-1].arrays.keys()
    assert result.train_metrics_clientapp[1]["macs"] == result.frontier[1].macs
    assert result.summary()["frontier"]


def test_fdnas_by_keyword(data_cache):
    config = tiny_fdnas(data_cache, **{"fdnas.final-rounds": 0})
    strategy = fdnas_strategy(config, cls=FDNAS)
    injected = inject_errors(strategy)
    grid = InProcessGrid(client_app, config, 10)
    recorder = Recorder()
    train_config, evaluate_config = user_configs()
    result = strategy.start(
        grid,
        initial_arrays=ArrayRecord(),  # the space's own weights
        num_rounds=2,  # the config says 1
        train_config=train_config,
        evaluate_config=evaluate_config,
        evaluate_fn=recorder,
    )
    check_contract(
        result,
        grid,
        recorder,
        injected,
        rounds=2,
        evaluated_rounds=[0, 1, 2],
        evaluate_messages=True,
    )
    assert len(result.search_history) == 2 and result.nets[0].name == "fdnas"
    assert result.arrays is result.supernet
    assert strategy.reply_timeout == 3600  # Flower's default timeout


def test_cfdnas_by_keyword(data_cache):
    config = tiny_fdnas(data_cache, **{"fdnas.final-rounds": 0})
    strategy = fdnas_strategy(config, cls=CFDNAS, train_global=False)
    injected = inject_errors(strategy)
    grid = InProcessGrid(client_app, config, 10)
    recorder = Recorder()
    train_config, evaluate_config = user_configs()
    result = strategy.start(
        grid,
        ArrayRecord(),
        num_rounds=2,
        timeout=60,
        train_config=train_config,
        evaluate_config=evaluate_config,
        evaluate_fn=recorder,
    )
    check_contract(
        result,
        grid,
        recorder,
        injected,
        rounds=2,
        evaluated_rounds=[0, 1, 2],
        evaluate_messages=True,
    )
    assert len(result.search_history) == 2
    assert [net.name for net in result.nets] == ["cluster-0", "cluster-1", "cluster-2"]
    assert all(len(h) == 1 for h in result.cluster_history.values())  # fdnas.cluster-rounds


def test_dpfnas_by_keyword(data_cache):
    config = tiny_dpfnas(
        data_cache,
        **{"dpfnas.iterations": 3, "dpfnas.eval-every": 1, "space.layers-per-block": 1},
    )
    settings = parse_run_config(config)
    space = build_supernet(settings)
    strategy = DPFNAS(space=space, settings=settings.method_settings, seed=settings.seed)
    injected = inject_errors(strategy)
    grid = InProcessGrid(client_app, config, 2)
    recorder = Recorder()
    train_config, evaluate_config = user_configs()
    result = strategy.start(
        grid,
        ArrayRecord(space.state_dict()),
        num_rounds=2,  # the config says 3
        timeout=120.0,
        train_config=train_config,
        evaluate_config=evaluate_config,
        evaluate_fn=recorder,
    )
    check_contract(
        result,
        grid,
        recorder,
        injected,
        rounds=2,
        evaluated_rounds=[0, 1, 2],
        evaluate_messages=True,
    )
    assert result.iterations == 2 and result.genotype is not None
    assert result.final_arrays is not None and result.privacy


# --- the strategy's own keys win over the caller's ------------------------------------------


def test_the_strategys_keys_win_over_train_config(data_cache):
    config = tiny_fedoras(data_cache, **{"fedoras.stop-after": "supernet"})
    settings = parse_run_config(config)
    strategy = FedorAS(
        space=build_supernet(settings), settings=settings.method_settings, seed=settings.seed
    )
    grid = InProcessGrid(client_app, config, 12)
    strategy.start(grid, ArrayRecord(), num_rounds=1, train_config=ConfigRecord({"lr": 99.0}))
    trained = configs_of(grid, "train")
    assert trained and all(c["lr"] == settings.method_settings.train.lr for c in trained)


def test_validate_profiles_sees_the_kept_profiles_and_can_stop_the_run(data_cache):
    # profile_nodes hands the profiles to the constructor's validate_profiles (every method:
    # the runners check num-partitions there); raising stops the run before any training
    config = tiny_decnas(data_cache)
    settings = parse_run_config(config)
    seen: list[list[int]] = []

    def refuse(profiles):
        seen.append(sorted(p.partition_id for p in profiles))
        raise ValueError("not the partitions this run expects")

    net = build_decnas_net(settings)
    strategy = DecNAS(
        net=net, settings=settings.method_settings, seed=settings.seed, validate_profiles=refuse
    )
    grid = InProcessGrid(client_app, config, 6)
    with pytest.raises(ValueError, match="not the partitions this run expects"):
        strategy.start(grid, ArrayRecord(net.state_dict()), num_rounds=1)
    assert seen == [list(range(6))]
    assert configs_of(grid, "train") == []
