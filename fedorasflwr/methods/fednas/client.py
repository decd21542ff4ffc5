"""FedNAS client (He et al., 2020; FedML's ``FedNASTrainer.search``): local DARTS epochs.

``search_supernet``: ``local-epochs`` epochs over the training split; after each weight
step on a training batch (SGD on w, cross-entropy of the mixed, softmax(alpha)-weighted
supernet) one architecture step on the next validation batch (Adam on alpha, first
order: grad_alpha L_val(w, alpha) at the current w, DARTS's ``unrolled = False``, which
FedML's FedNAS runs).  The reply carries every supernet key, w and alpha, and the
client's sample count for the server's weighted FedAvg, and ``train-flops``: every
sample forwarded with gradients (the training batches of the weight steps and the
validation batches of the architecture steps) at ``3 x mixed-flops``, the per-sample
forward FLOPs of the mixed supernet the server sends (``costs.training_flops``).

``train_final`` / ``evaluate_final``: the derived network's FedAvg (local SGD) and test;
``train-flops`` of a final round is ``LocalTraining.flops(net-flops)`` (training at 3x,
the BatchNorm refresh at 1x).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from flwr.app import ConfigRecord, MetricRecord, RecordDict
from torch import Tensor, nn
from torch.utils.data import DataLoader

from ...arrays import record_of, state_dict_of
from ...costs import training_flops
from ...data import ClientData
from ...protocol import ARRAYS, CONFIG, METRICS, space_from_config
from ...search_spaces import SearchSpace, build_space
from ...search_spaces.darts_style import derived_network_of, require_darts_style, weight_keys
from ...seeding import stream_words, substream
from ...training import (
    clip_gradients,
    held_out_metrics,
    local_sgd,
    seeded_loader,
    sgd,
    torch_device,
)

__all__ = ["evaluate_final", "search_supernet", "train_final"]


def _load_space(content: RecordDict) -> tuple[SearchSpace, ConfigRecord]:
    config: ConfigRecord = content.config_records[CONFIG]
    space = build_space(**space_from_config(config))
    require_darts_style(space, "FedNAS")
    space.load_state_dict(state_dict_of(content.array_records[ARRAYS]), strict=True)
    return space, config


def _cycle(loader: DataLoader) -> Iterator[tuple[Tensor, Tensor]]:
    while True:
        yield from loader


def search_supernet(content: RecordDict, data: ClientData, partition_id: int) -> RecordDict:
    """Local first-order DARTS epochs on w (train batches) and alpha (val batches); each
    w step's gradient clipped at L2 norm ``grad-clip`` (absent or 0: none)."""
    space, config = _load_space(content)
    device = torch_device()
    space.to(device).train()
    parameters = dict(space.named_parameters())
    arch = [parameters[k] for k in space.arch_keys]
    weights = [parameters[k] for k in weight_keys(space)]
    weight_optimizer = sgd(weights, config)
    # DARTS / FedML: Adam, betas (0.5, 0.999), weight decay 1e-3 on the alphas
    arch_optimizer = torch.optim.Adam(
        arch,
        lr=float(config["arch-lr"]),
        betas=(0.5, 0.999),
        weight_decay=float(config["arch-weight-decay"]),
    )
    words = stream_words(config["seed"], "fednas-search", config["server-round"], partition_id)
    batch_size = int(config["batch-size"])
    max_norm = float(config.get("grad-clip", 0.0))
    train_loader = seeded_loader(data.train, batch_size, words)
    val_batches = _cycle(seeded_loader(data.val, batch_size, substream(words, "val")))
    loss_sum, seen, val_sum, val_steps, val_seen = 0.0, 0, 0.0, 0, 0
    for _ in range(int(config["local-epochs"])):
        for inputs, targets in train_loader:
            if len(data.val):  # the architecture step, on the current w (first order)
                val_inputs, val_targets = next(val_batches)
                arch_optimizer.zero_grad(set_to_none=True)
                val_loss = nn.functional.cross_entropy(
                    space(val_inputs.to(device)), val_targets.to(device)
                )
                val_loss.backward(inputs=arch)
                arch_optimizer.step()
                val_sum += float(val_loss.detach())
                val_steps += 1
                val_seen += len(val_targets)
            weight_optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(space(inputs.to(device)), targets.to(device))
            loss.backward(inputs=weights)
            clip_gradients(weights, max_norm)  # DARTS: nn.utils.clip_grad_norm_(w, 5)
            weight_optimizer.step()
            loss_sum += float(loss.detach()) * len(targets)
            seen += len(targets)
    state = {k: v.detach().cpu() for k, v in space.state_dict().items()}
    metrics = MetricRecord(
        {
            # FedAvg's weight: the local training set's size (FedML: local_sample_number)
            "num-examples": len(data.train),
            "train-loss": loss_sum / max(seen, 1),
            "val-loss": val_sum / max(val_steps, 1),
            # forward + backward of every sample of both steps through the mixed supernet
            "train-flops": training_flops(int(config["mixed-flops"]), seen + val_seen),
        }
    )
    return RecordDict({ARRAYS: record_of(state), METRICS: metrics})


def _derived(content: RecordDict) -> tuple[nn.Module, ConfigRecord]:
    config: ConfigRecord = content.config_records[CONFIG]
    return derived_network_of(config, state_dict_of(content.array_records[ARRAYS])), config


def train_final(content: RecordDict, data: ClientData, partition_id: int) -> RecordDict:
    """Local SGD epochs of the derived network (FedAvg's client side)."""
    net, config = _derived(content)
    words = stream_words(config["seed"], "fednas-final", config["server-round"], partition_id)
    done = local_sgd(net, data.train, config, words)
    state = {k: v.detach().cpu() for k, v in net.state_dict().items()}
    metrics = MetricRecord(
        {
            "num-examples": len(data.train),
            "train-loss": done.loss,
            "train-flops": done.flops(int(config["net-flops"])),
        }
    )
    return RecordDict({ARRAYS: record_of(state), METRICS: metrics})


def evaluate_final(content: RecordDict, data: ClientData) -> RecordDict:
    """Loss and accuracy of the derived network on this client's test split."""
    net, _ = _derived(content)
    return RecordDict({METRICS: MetricRecord(held_out_metrics(net, data.test, data.train))})
