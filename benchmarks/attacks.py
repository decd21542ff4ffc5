"""How much of the aggregate can one or two attacking clients of ten take?

One FedorAS Stage-1 round of 10 real clients (MNIST-5k, quarter-width ``cnn_s``, the
in-process grid) gives the honest replies.  Attackers (the clients of the lowest
partition ids) then replace theirs, and the strategies' own reply checks and
aggregation run on the result:

- **OPA**: ``FedorAS.aggregate_train`` (per-option counts, partial updates);
- **FedAvg**: ``SeededFedAvg.aggregate_train`` (the FedAvg every method's training
  stages use) on replies of the same round run with the whole supernet sent and
  returned (``fedoras.comm-budget = 1``, ``fedoras.aggregation = "fedavg"``);

each with ``aggregation`` = mean (OPA / FedAvg as published), median and
trimmed-mean (trim 0.2).  Attacks, for 1 and 2 colluding attackers:

- ``honest``: the attacker's own honest reply (1 attacker): its honest share;
- ``poison``: poisoned weights T = current + 1 on every float entry of the keys the
  attacker returns, honest counts;
- ``inflate``: T with ``num-examples`` and every option count x 10^6, kept consistent;
- ``inflate+profile``: the same, by a node that also declared ``num-train`` x 10^6 in
  its profile (passes the count check: what only robust aggregation stops).

**Share** of the attackers: the projection coefficient of (G - H) on (A - H), over
the float entries of the keys the attackers returned, where G is the aggregate with
the attack, H the aggregate (same method and rule) of the honest clients alone and
A the attackers' weights.  For a weighted mean it is exactly the attackers' total
weight; 0 means no pull, 1 means the aggregate is the attacker's.  A rejected reply
has share 0.

The accuracy cost of each rule without an attack: a short Stage-1 run (10 clients
a round) per rule, the supernet's mean validation accuracy over 8 fixed random paths
(the server's held-out slice, BN recalibrated) after the last round.

    python benchmarks/attacks.py            # 6 rounds per rule for the accuracy cost (~5 min)
    python benchmarks/attacks.py --quick    # CI smoke run (1 round, ~30 s CPU)
"""

# ruff: noqa: E402 (the package is imported after this checkout is put on sys.path)
from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import ROOT, report, run_config, warm_data_cache
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

if str(ROOT) not in sys.path:  # this checkout's package, not another installed one
    sys.path.insert(0, str(ROOT))

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.data import load_server_data
from fedorasflwr.federation.aggregation import Aggregation
from fedorasflwr.federation.base import NodeProfile, StageFailedError
from fedorasflwr.federation.fedavg import SeededFedAvg
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.fedoras.evaluation import SupernetEvaluator
from fedorasflwr.methods.fedoras.strategy import FedorAS
from fedorasflwr.nonce import echo
from fedorasflwr.protocol import ARRAYS, METRICS, NONCE
from fedorasflwr.runs import build_supernet

NUM_CLIENTS = 10
INFLATION = 10**6
RULES = {
    "mean": Aggregation("mean"),
    "median": Aggregation("median"),
    "trimmed-mean": Aggregation("trimmed-mean", 0.2),
}
ATTACKS = (("honest", 1), ("poison", 1), ("poison", 2), ("inflate", 1), ("inflate", 2))
ATTACKS += (("inflate+profile", 1), ("inflate+profile", 2))


def settings(cache_dir: Path, **overrides: Any) -> dict[str, Any]:
    return run_config(
        {
            "data.cache-dir": str(cache_dir),
            "data.partitioner": "iid",
            "space.width": 0.25,
            "fedoras.rounds": 1,
            "fedoras.clients-per-round": NUM_CLIENTS,
            "fedoras.local-epochs": 1,
            "fedoras.tier-samples": 500,
            "fedoras.search-scoring": "federated",
            "fedoras.eval-every": 0,
            **overrides,
        }
    )


def make_strategy(config: dict[str, Any], evaluate: bool = False) -> FedorAS:
    parsed = parse_run_config(config)
    evaluator = None
    if evaluate:
        evaluator = SupernetEvaluator(
            build_supernet(parsed),
            load_server_data(parsed.data),
            num_paths=parsed.method_settings.eval_paths,
            seed=parsed.seed,
        )
    return FedorAS(
        space=build_supernet(parsed),
        settings=parsed.method_settings,
        seed=parsed.seed,
        evaluate_fn=evaluator,
    )


# --- one round's honest replies ------------------------------------------------------


@dataclasses.dataclass
class Round:
    """One Stage-1 round: the strategy, the arrays sent and the honest replies."""

    strategy: FedorAS
    grid: InProcessGrid
    current: ArrayRecord
    replies: list[Message]
    # (attack, attackers) -> the attacked replies, made once for every rule
    attacked: dict[tuple[str, int], list[Message]] = dataclasses.field(default_factory=dict)


def honest_round(config: dict[str, Any]) -> Round:
    grid = InProcessGrid(client_app, config, NUM_CLIENTS)
    strategy = make_strategy(config)
    strategy.setup(grid)
    current = ArrayRecord(strategy.space.state_dict())
    messages = list(strategy.configure_train(1, current, ConfigRecord(), grid))
    replies = strategy.exchange(grid, "supernet", messages)
    partition = {p.node_id: p.partition_id for p in strategy.profiles.values()}
    replies.sort(key=lambda r: partition[r.metadata.src_node_id])
    return Round(strategy, grid, current, replies)


def poisoned(reply: Message, current: ArrayRecord, inflate: int) -> Message:
    """T = current + 1 on the reply's float keys; counts x ``inflate`` (consistent)."""
    arrays = reply.content.array_records[ARRAYS]
    target = ArrayRecord()
    for key, array in arrays.items():
        values = array.numpy()
        if np.issubdtype(values.dtype, np.floating):
            values = np.asarray(current[key].numpy() + 1.0, dtype=values.dtype)
        target[key] = Array(values)
    metrics = MetricRecord(dict(reply.content.metric_records[METRICS]))
    metrics["num-examples"] = int(metrics["num-examples"]) * inflate
    if "option-counts" in metrics:
        metrics["option-counts"] = [int(c) * inflate for c in metrics["option-counts"]]
    # the attacker echoes the nonce it was sent: its reply answers this round's instruction
    content = RecordDict({ARRAYS: target, METRICS: metrics, NONCE: reply.content[NONCE]})
    return Message(content, reply_to=_instruction(reply))


def _instruction(reply: Message) -> Message:
    return Message(
        RecordDict(),
        dst_node_id=reply.metadata.src_node_id,
        message_type=reply.metadata.message_type,
    )


def attacked(run: Round, attack: str, attackers: int) -> tuple[list[Message], set[int]]:
    """The replies with the first ``attackers`` replaced; and the attackers' node ids."""
    if (attack, attackers) not in run.attacked:
        replies = list(run.replies)
        inflate = INFLATION if attack.startswith("inflate") else 1
        for i in range(attackers):
            if attack != "honest":
                replies[i] = poisoned(replies[i], run.current, inflate)
        run.attacked[attack, attackers] = replies
    replies = list(run.attacked[attack, attackers])
    return replies, {r.metadata.src_node_id for r in replies[:attackers]}


# --- aggregation under each method ---------------------------------------------------------

Aggregate = Callable[[list[Message], Sequence[NodeProfile]], ArrayRecord]


def opa_aggregate(run: Round, rule: Aggregation) -> Aggregate:
    def aggregate(replies: list[Message], profiles: Sequence[NodeProfile]) -> ArrayRecord:
        strategy = run.strategy
        strategy.aggregation = rule
        strategy.profiles = {p.node_id: p for p in profiles}
        arrays, _ = strategy.aggregate_train(1, replies)
        assert arrays is not None
        return arrays

    return aggregate


def fedavg_aggregate(run: Round, rule: Aggregation) -> Aggregate:
    def aggregate(replies: list[Message], profiles: Sequence[NodeProfile]) -> ArrayRecord:
        strategy = SeededFedAvg(
            nodes=list(profiles),
            seed=0,
            stage="fedavg",
            ledger=run.strategy.ledger,
            clients_per_round=NUM_CLIENTS,
            train_message_type=replies[0].metadata.message_type,
            fraction_evaluate=0.0,
            aggregation=rule,
        )
        sent = strategy.configure_train(1, run.current, ConfigRecord(), run.grid)
        by_node = {m.metadata.dst_node_id: m for m in sent}
        answers = [  # the same content, answering (and echoing the nonce of) FedAvg's messages
            echo(
                by_node[r.metadata.src_node_id],
                Message(
                    RecordDict(dict(r.content.items())), reply_to=by_node[r.metadata.src_node_id]
                ),
            )
            for r in replies
            if r.metadata.src_node_id in by_node
        ]
        arrays, _ = strategy.aggregate_train(1, answers)
        assert arrays is not None
        return arrays

    return aggregate


def share(
    aggregate: ArrayRecord, honest: ArrayRecord, attacker: ArrayRecord, keys: Sequence[str]
) -> float:
    """Projection coefficient of (aggregate - honest) on (attacker - honest) over ``keys``."""

    def flat(record: ArrayRecord) -> np.ndarray:
        return np.concatenate([record[k].numpy().astype(np.float64).ravel() for k in keys])

    direction = flat(attacker) - flat(honest)
    norm = float(direction @ direction)
    return float((flat(aggregate) - flat(honest)) @ direction / norm) if norm > 0 else 0.0


def measure(
    run: Round,
    method: str,
    rule_name: str,
    attack: str,
    attackers: int,
    honest_aggregates: dict[tuple[str, str, int], ArrayRecord],
) -> dict:
    """One row; ``honest_aggregates`` keeps H per (method, rule, attackers): the same
    for every attack (deserialising the replies' arrays is most of a row's time)."""
    make = opa_aggregate if method == "OPA" else fedavg_aggregate
    aggregate = make(run, RULES[rule_name])
    profiles = {p.node_id: p for p in run.strategy.profiles.values()}
    replies, bad = attacked(run, attack, attackers)
    declared = dict(profiles)
    if attack == "inflate+profile":
        for node in bad:
            declared[node] = dataclasses.replace(
                profiles[node], num_train=profiles[node].num_train * INFLATION
            )
    key = (method, rule_name, attackers)
    if key not in honest_aggregates:
        honest_aggregates[key] = aggregate(
            [r for r in run.replies if r.metadata.src_node_id not in bad],
            [p for n, p in profiles.items() if n not in bad],
        )
    honest = honest_aggregates[key]
    rejected_before = run.strategy.ledger.stage_totals(_stage(method)).rejected
    try:
        result = aggregate(replies, list(declared.values()))
    finally:
        run.strategy.profiles = profiles
    rejected = run.strategy.ledger.stage_totals(_stage(method)).rejected - rejected_before
    attacker = ArrayRecord()
    for reply in replies[:attackers]:
        for key, array in reply.content.array_records[ARRAYS].items():
            attacker[key] = array
    keys = [k for k in attacker if np.issubdtype(attacker[k].numpy().dtype, np.floating)]
    return {
        "method": method,
        "aggregation": RULES[rule_name].describe(),
        "attack": attack,
        "attackers": attackers,
        "rejected": rejected,
        "share": share(result, honest, attacker, keys),
    }


def _stage(method: str) -> str:
    return "supernet" if method == "OPA" else "fedavg"


# --- accuracy cost without an attack ----------------------------------------------------


def accuracy_cost(cache: Path, rounds: int) -> list[dict[str, Any]]:
    rows = []
    for rule in RULES.values():
        config = settings(cache, **{"fedoras.rounds": rounds, "fedoras.eval-every": rounds})
        grid = InProcessGrid(client_app, config, NUM_CLIENTS)
        strategy = make_strategy(config, evaluate=True)
        strategy.aggregation = rule
        start = time.perf_counter()
        strategy.settings = dataclasses.replace(strategy.settings, stop_after="supernet")
        result = strategy.start(grid, ArrayRecord(), num_rounds=rounds)
        last = result.history[-1]
        rows.append(
            {
                "aggregation": rule.describe(),
                "rounds": rounds,
                "val-accuracy": float(last["val-accuracy"]),
                "val-accuracy-min": float(last["val-accuracy-min"]),
                "val-accuracy-max": float(last["val-accuracy-max"]),
                "seconds": round(time.perf_counter() - start, 1),
            }
        )
    return rows


def first_round_accuracy(run: Round, config: dict[str, Any]) -> list[dict[str, Any]]:
    """``accuracy_cost(cache, 1)`` without training again: the supernet after one Stage-1
    round is each rule's aggregate of ``run``'s honest replies (``run`` is that round)."""
    evaluator = make_strategy(config, evaluate=True).evaluate_fn
    assert evaluator is not None
    profiles = list(run.strategy.profiles.values())
    rows = []
    for rule in RULES.values():
        start = time.perf_counter()
        metrics = evaluator(1, opa_aggregate(run, rule)(list(run.replies), profiles))
        run.strategy.profiles = {p.node_id: p for p in profiles}
        rows.append(
            {
                "aggregation": rule.describe(),
                "rounds": 1,
                "val-accuracy": float(metrics["val-accuracy"]),
                "val-accuracy-min": float(metrics["val-accuracy-min"]),
                "val-accuracy-max": float(metrics["val-accuracy-max"]),
                "seconds": round(time.perf_counter() - start, 1),
            }
        )
    return rows


# --- the whole benchmark ------------------------------------------------------------------------


def run(quick: bool, cache: Path) -> dict[str, Any]:
    opa_config = settings(cache)
    fedavg_config = settings(cache, **{"fedoras.comm-budget": 1.0, "fedoras.aggregation": "fedavg"})
    warm_data_cache([opa_config], NUM_CLIENTS)
    rounds = {"OPA": honest_round(opa_config), "FedAvg": honest_round(fedavg_config)}
    honest_aggregates: dict[tuple[str, str, int], ArrayRecord] = {}
    rows = [
        measure(rounds[method], method, rule, attack, attackers, honest_aggregates)
        for method in rounds
        for attack, attackers in ATTACKS
        for rule in RULES
    ]
    # one round per rule: the OPA round above is that round (same seed, same clients)
    accuracy = first_round_accuracy(rounds["OPA"], opa_config) if quick else accuracy_cost(cache, 6)

    def pick(method: str, attack: str, attackers: int, rule: str) -> float:
        described = RULES[rule].describe()
        return next(
            r["share"]
            for r in rows
            if (r["method"], r["attack"], r["attackers"], r["aggregation"])
            == (method, attack, attackers, described)
        )

    honest = {m: pick(m, "honest", 1, "mean") for m in rounds}
    inflated = [r for r in rows if r["attack"] == "inflate"]
    headline = {
        "opa_honest_share": honest["OPA"],
        "opa_inflate_share": pick("OPA", "inflate", 1, "mean"),
        "opa_lie_mean_share": pick("OPA", "inflate+profile", 1, "mean"),
        "opa_lie_median_share": pick("OPA", "inflate+profile", 1, "median"),
        "opa_lie_trimmed_share": pick("OPA", "inflate+profile", 1, "trimmed-mean"),
        "fedavg_honest_share": honest["FedAvg"],
        "fedavg_lie_mean_share": pick("FedAvg", "inflate+profile", 1, "mean"),
        "fedavg_lie_median_share": pick("FedAvg", "inflate+profile", 1, "median"),
        "inflated_within_honest": all(r["share"] <= honest[r["method"]] + 1e-9 for r in inflated),
        **{f"acc_{row['aggregation'].split()[0]}": row["val-accuracy"] for row in accuracy},
    }
    return {
        "settings": {
            "clients": NUM_CLIENTS,
            "inflation": INFLATION,
            "accuracy-rounds": 1 if quick else 6,
            "space.width": 0.25,
            "dataset": "mnist5k (iid)",
        },
        "rows": rows,
        "accuracy": accuracy,
        "headline": headline,
    }


def print_report(result: dict[str, Any]) -> None:
    print("| method | aggregation | attack | attackers | rejected | share |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in result["rows"]:
        print(
            f"| {r['method']} | {r['aggregation']} | {r['attack']} | {r['attackers']} "
            f"| {r['rejected']} | {r['share']:.6f} |"
        )
    print()
    print("| aggregation (no attack) | rounds | val accuracy (mean / min / max of 8 paths) |")
    print("| --- | --- | --- |")
    for r in result["accuracy"]:
        print(
            f"| {r['aggregation']} | {r['rounds']} | {r['val-accuracy']:.3f} / "
            f"{r['val-accuracy-min']:.3f} / {r['val-accuracy-max']:.3f} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            result = run(args.quick, Path(tmp) / "cache")
        except StageFailedError as exc:
            print(f"a stage failed: {exc}", file=sys.stderr)
            return 1
    headline = result.pop("headline")
    print_report(result)
    report("attacks", args.quick, headline, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
