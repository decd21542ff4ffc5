"""DecNAS client (Algorithm 4.1, ``Client_Operation``): tune a candidate, report, upload later.

``tune_candidate`` trains the received pruned model for E local epochs on the
training split, tests it on the validation split and replies with the
accuracy and counts only; the trained weights stay on the client
(``context.state``).  ``upload_candidate`` sends them when the server asks,
which it does only for candidates that survived the round's dropping.
``train_model`` / ``evaluate_model`` serve the FedAvg stages (GM_0 training,
long-term tuning, baselines) and the test-split evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import ConfigRecord, MetricRecord, RecordDict
from torch import nn

from ...arrays import record_of, state_dict_of
from ...data import ClientData
from ...protocol import ARRAYS, CONFIG, METRICS, space_from_config
from ...search_spaces.prunable import PrunableNet, load_prunable
from ...seeding import stream_words
from ...training import (
    evaluate,
    held_out_metrics,
    local_sgd,
    ordered_loader,
    reply_state,
    torch_device,
)

__all__ = [
    "STATE_PREFIX",
    "evaluate_model",
    "state_key",
    "train_model",
    "tune_candidate",
    "upload_candidate",
]

STATE_PREFIX = "decnas."


def state_key(config: Mapping[str, Any]) -> str:
    """Where a tuned candidate waits in ``context.state``: iteration, round, candidate."""
    iteration, round_ = int(config["iteration"]), int(config["round"])
    return f"{STATE_PREFIX}{iteration}.{round_}.{int(config['candidate'])}"


def _load(content: RecordDict) -> tuple[ConfigRecord, PrunableNet]:
    config: ConfigRecord = content.config_records[CONFIG]
    state = state_dict_of(content.array_records[ARRAYS])
    return config, load_prunable(space_from_config(config), state)


def _train(net: nn.Module, config: ConfigRecord, data: ClientData, words: tuple[int, ...]) -> dict:
    """E epochs of SGD on the training split; loss and training FLOPs."""
    done = local_sgd(net, data.train, config, words)
    return {
        "train-loss": done.loss,
        "train-flops": done.flops(2 * int(config["net-macs"])),
    }


def _words(config: ConfigRecord, purpose: str, partition_id: int, *extra: int) -> tuple[int, ...]:
    return stream_words(config["seed"], purpose, config["server-round"], partition_id, *extra)


def tune_candidate(
    content: RecordDict, data: ClientData, partition_id: int, state: RecordDict
) -> RecordDict:
    """Short-term fine-tuning of one candidate: train, validate, keep the weights, report.

    Weights kept from earlier rounds are discarded: the server only asks for
    the current round's survivors.
    """
    config, net = _load(content)
    key = state_key(config)
    current = key.rsplit(".", 1)[0] + "."
    for old in [k for k in state.keys() if k.startswith(STATE_PREFIX)]:
        if not old.startswith(current):
            del state[old]
    words = _words(
        config, "decnas-tune", partition_id, int(config["iteration"]), int(config["candidate"])
    )
    metrics = _train(net, config, data, words)
    result = evaluate(net, ordered_loader(data.val), torch_device())
    state[key] = record_of(reply_state(net, content.array_records[ARRAYS]))
    return RecordDict(
        {
            METRICS: MetricRecord(
                {
                    "num-examples": len(data.train),
                    "num-val": result.count,
                    "correct": result.correct,
                    "accuracy": result.accuracy,
                    **metrics,
                }
            )
        }
    )


def upload_candidate(content: RecordDict, data: ClientData, state: RecordDict) -> RecordDict:
    """The weights kept by ``tune_candidate`` for this iteration, round and candidate.

    Raises
    ------
    KeyError
        If this client did not tune that candidate in that round (the server
        then drops the reply, naming the node).
    """
    key = state_key(content.config_records[CONFIG])
    if key not in state.array_records:
        raise KeyError(f"no tuned weights for {key!r}: this client did not tune that candidate")
    arrays = state.array_records[key]
    del state[key]
    return RecordDict({ARRAYS: arrays, METRICS: MetricRecord({"num-examples": len(data.train)})})


def train_model(content: RecordDict, data: ClientData, partition_id: int) -> RecordDict:
    """Local epochs of a whole model for the FedAvg stages; reply with its weights."""
    config, net = _load(content)
    metrics = _train(net, config, data, _words(config, "decnas-train", partition_id))
    return RecordDict(
        {
            ARRAYS: record_of(reply_state(net, content.array_records[ARRAYS])),
            METRICS: MetricRecord({"num-examples": len(data.train), **metrics}),
        }
    )


def evaluate_model(content: RecordDict, data: ClientData) -> RecordDict:
    """Loss and accuracy of the received model on the ``split`` ("val" or "test") split,
    its BatchNorm statistics re-estimated on the training split first (``held_out_metrics``)."""
    config, net = _load(content)
    split = str(config.get("split", "test"))
    if split not in ("val", "test"):
        raise ValueError(f"config 'split' = {split!r}: val or test")
    dataset = data.val if split == "val" else data.test
    return RecordDict({METRICS: MetricRecord(held_out_metrics(net, dataset, data.train))})
