"""HeteroFL / FjORD client: train the received sub-model, reply with it; test it.

The server sends the leading channel slice of the global model at the client's tier
width ``width`` (``search_spaces.widths.sub_arrays``).  HeteroFL trains that
sub-model as it is (``local_sgd``).  FjORD's ordered dropout samples, for every batch,
one width of the ladder ``widths`` up to ``width`` (uniformly) and takes the SGD step
on that width's leading slice only (the entries outside it get no gradient; momentum
is kept at the tier width, as a masked model would keep it); with ``distill``, the
p_max model teaches the sampled width (self-distillation).  Both refresh the
BatchNorm statistics of the tier-width model on the training split before replying.

The model: a user's ``model_fn`` when the caller passes one (a ClientApp of its own),
else the factory the message's ``model-fn`` names (imported by its path), else the
built-in ConvNet of the message's image keys (``model_of``).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, MetricRecord, RecordDict
from torch import nn
from torch.utils.data import Dataset

from ...arrays import record_of, state_dict_of
from ...costs import training_flops
from ...data import ClientData
from ...protocol import ARRAYS, CONFIG, METRICS
from ...search_spaces.widths import ModelFn, width_net
from ...seeding import numpy_stream, seed_torch, stream_words
from ...training import (
    clip_gradients,
    flatten_logits,
    held_out_metrics,
    local_sgd,
    refresh_batchnorm,
    reply_state,
    seeded_loader,
    sgd,
    torch_device,
)
from .model import MODEL_FN, import_factory

__all__ = [
    "IMAGE_KEYS",
    "evaluate_width",
    "image_of",
    "model_of",
    "ordered_dropout_sgd",
    "train_width",
]

#: the image keys of every message (the fixed architecture's input and classes)
IMAGE_KEYS = ("num-classes", "in-channels", "input-height", "input-width")


def image_of(config: Mapping[str, Any]) -> dict[str, int]:
    """The image spec (``width_net``'s) a message's config names."""
    return {key.replace("-", "_"): int(config[key]) for key in IMAGE_KEYS}


def model_of(config: Mapping[str, Any], model_fn: ModelFn | None = None) -> ModelFn:
    """The factory of the model a message's ``config`` is about: ``model_fn`` when given,
    else the one its ``model-fn`` names (``import_factory``), else the built-in ConvNet
    for its image keys and ``head`` (``width_net``; no ``head``: ``"flatten"``)."""
    if model_fn is not None:
        return model_fn
    if MODEL_FN in config:
        return import_factory(str(config[MODEL_FN]))
    if not all(key in config for key in IMAGE_KEYS):
        raise ValueError(
            f"the message names no model: no {MODEL_FN!r} and not the image keys "
            f"{', '.join(IMAGE_KEYS)}; pass the strategy's model_fn to this handler"
        )
    return partial(width_net, image_of(config), head=str(config.get("head", "flatten")))


def _load(content: RecordDict, build: ModelFn) -> tuple[ConfigRecord, nn.Module]:
    config: ConfigRecord = content.config_records[CONFIG]
    net = build(float(config["width"]))
    net.load_state_dict(state_dict_of(content.array_records[ARRAYS]))
    return config, net


def _ladder(config: Mapping[str, Any]) -> list[tuple[float, int]]:
    """(width, MACs) of every ladder width up to the client's ``width``."""
    width = float(config["width"])
    pairs = zip(config["widths"], config["width-macs"], strict=True)
    return [(float(w), int(m)) for w, m in pairs if float(w) <= width + 1e-9]


def ordered_dropout_sgd(
    net: nn.Module,
    build: ModelFn,
    dataset: Dataset,
    config: Mapping[str, Any],
    words: tuple[int, ...],
    rng: np.random.Generator,
) -> tuple[float, int, int]:
    """FjORD's local training of ``net`` (the tier-width model), in place: per batch a width
    sampled uniformly from the ladder (``_ladder``), the step taken on its leading slice.
    ``words`` fix the batch order, ``rng`` the widths. With ``distill`` in ``config``
    (FjORD's self-distillation), a batch whose sampled width is below p_max also trains
    the p_max model on the labels, and the sampled width learns the p_max model's soft
    labels (KL divergence, temperature 1) instead of the labels. ``build(width)`` builds each
    width's module (``model_of``: the user's factory, or the built-in ConvNet's).
    Returns the mean loss (the labels' cross-entropy of the model trained on them), the
    samples seen and the training FLOPs spent."""
    device = torch_device()
    net.to(device).train()
    optimizer = sgd(net.parameters(), config)
    criterion = nn.CrossEntropyLoss()
    ladder = _ladder(config)
    top_width, top_macs = ladder[-1]
    distill = bool(config.get("distill", False))
    subs = {w: build(w).to(device).train() for w, _ in ladder}
    params = dict(net.named_parameters())
    loss_sum, seen, flops = 0.0, 0, 0
    for _ in range(int(config["local-epochs"])):
        for inputs, targets in seeded_loader(dataset, int(config["batch-size"]), words):
            width, macs = ladder[int(rng.integers(len(ladder)))]
            sub = subs[width]
            with torch.no_grad():  # the sub-model: the leading slice of the current weights
                for name, tensor in sub.named_parameters():
                    tensor.copy_(params[name][tuple(slice(0, s) for s in tensor.shape)])
            inputs, targets = inputs.to(device), targets.to(device)
            sub.zero_grad(set_to_none=True)
            optimizer.zero_grad(set_to_none=False)
            teacher = None
            if distill and width < top_width:  # the p_max model learns from the labels ...
                logits, labels = flatten_logits(net(inputs), targets)
                teacher_loss = criterion(logits, labels)
                teacher_loss.backward()
                teacher = logits.detach()
                flops += training_flops(2 * top_macs, len(targets))
            logits, labels = flatten_logits(sub(inputs), targets)
            if teacher is None:
                loss = criterion(logits, labels)
            else:  # ... and the sampled width from the p_max model's soft labels
                loss = nn.functional.kl_div(
                    nn.functional.log_softmax(logits, dim=-1),
                    nn.functional.log_softmax(teacher, dim=-1),
                    reduction="batchmean",
                    log_target=True,
                )
            loss.backward()
            for name, tensor in sub.named_parameters():
                grad = torch.zeros_like(params[name])
                grad[tuple(slice(0, s) for s in tensor.shape)] = tensor.grad
                params[name].grad = grad if params[name].grad is None else params[name].grad + grad
            clip_gradients(net.parameters(), float(config.get("grad-clip", 0.0)))
            optimizer.step()
            if teacher is not None:
                loss = teacher_loss  # the loss reported: the labels', as without distillation
            loss_sum += float(loss.detach()) * len(targets)
            seen += len(targets)
            flops += training_flops(2 * macs, len(targets))
    calibrated = refresh_batchnorm(net, dataset, int(config["batch-size"]))
    flops += 2 * _ladder(config)[-1][1] * calibrated
    net.eval()
    return loss_sum / max(seen, 1), seen, flops


def train_width(
    content: RecordDict, data: ClientData, partition_id: int, model_fn: ModelFn | None = None
) -> RecordDict:
    """Local epochs of the received tier-width model (``mode`` "heterofl": that width only;
    "fjord": ordered dropout over the ladder); reply with its weights.

    ``model_fn``: the factory of a width-scalable model of your own, the one given to the
    strategy (default: the one the message names, ``model_of``).  Torch's global RNG
    (dropout, a model's own draws) is seeded from the run's seed, the round and
    ``partition_id`` for the call (the CPU generator restored after it), so a reply
    depends on nothing else."""
    config: ConfigRecord = content.config_records[CONFIG]
    seed, server_round = int(config["seed"]), int(config["server-round"])
    with torch.random.fork_rng(devices=[]):
        seed_torch(seed, "widths-train-rng", server_round, partition_id)
        build = model_of(config, model_fn)  # resolved once per message
        _, net = _load(content, build)
        words = stream_words(seed, f"{config['mode']}-train", server_round, partition_id)
        if config["mode"] == "fjord":
            rng = numpy_stream(seed, "fjord-widths", server_round, partition_id)
            loss, _, flops = ordered_dropout_sgd(net, build, data.train, config, words, rng)
        else:
            done = local_sgd(net, data.train, config, words)
            loss, flops = done.loss, done.flops(2 * _ladder(config)[-1][1])
    return RecordDict(
        {
            ARRAYS: record_of(reply_state(net, content.array_records[ARRAYS])),
            METRICS: MetricRecord(
                {"num-examples": len(data.train), "train-loss": loss, "train-flops": flops}
            ),
        }
    )


def evaluate_width(
    content: RecordDict, data: ClientData, model_fn: ModelFn | None = None
) -> RecordDict:
    """Loss and accuracy of the received tier-width model on the test split, its BatchNorm
    statistics re-estimated on the training split first (``held_out_metrics``);
    ``model_fn`` as for ``train_width``."""
    config: ConfigRecord = content.config_records[CONFIG]
    _, net = _load(content, model_of(config, model_fn))
    return RecordDict({METRICS: MetricRecord(held_out_metrics(net, data.test, data.train))})
