"""FDNAS / CFDNAS client: local ProxylessNAS epochs, and training of the derived net.

``search_supernet`` is the paper's ClientUpdate (Algorithms 1-2): for E local
epochs, alternate a weight step on a training batch (one path sampled from
``softmax(alpha)``, binary gates) and an architecture step on a validation
batch with the ProxylessNAS two-path gradient estimator and a hardware-aware
loss, ``CE + beta log(E[FLOPs] / target)^2`` or FDNAS's released ``add#linear``
``CE + lambda (E[FLOPs] - target) / target`` (E[latency] on the table the server sends
with ``fdnas.resource = "latency"``, ``hardware.py``), each followed by ProxylessNAS's
rescaling of the two sampled alphas; return w and alpha (``alpha-every = 0``, the
server's warm-up rounds: weights only).
``train_net`` trains the derived net for the final FedAvg stage and reports
its test accuracy after the local epochs (the paper's "local accuracy");
``evaluate_net`` scores a received net on the local test split.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from torch import Tensor, nn
from torch.utils.data import DataLoader

from ...arrays import record_of, state_dict_of
from ...costs import training_flops
from ...data import ClientData
from ...protocol import ARRAYS, CONFIG, METRICS, space_from_config
from ...search_spaces import SearchSpace, Subnet, build_space, build_subnet
from ...search_spaces.differentiable import require_differentiable
from ...seeding import numpy_generator, stream_words, substream
from ...training import (
    clip_gradients,
    evaluate,
    held_out_metrics,
    local_sgd,
    ordered_loader,
    reply_state,
    seeded_loader,
    sgd,
    torch_device,
)
from .hardware import expected_latency, latency_from_config

__all__ = ["evaluate_net", "hardware_loss", "rescale_sampled", "search_supernet", "train_net"]


#: ``fdnas.hardware-loss`` values: this project's squared log-gap, FDNAS's released form
HARDWARE_LOSSES = ("log-gap", "add-linear")


def hardware_loss(
    space: SearchSpace,
    target_flops: float,
    weight: float,
    expected: Tensor | None = None,
    *,
    form: str = "log-gap",
) -> Tensor:
    """The hardware term added to CE (``fdnas.hardware-loss``), 0 at the target:

    - ``"log-gap"``: ``weight log(E[FLOPs] / target)^2`` (``weight``: ``hardware-beta``);
    - ``"add-linear"``: ``weight (E[FLOPs] - target) / target`` (``weight``:
      ``hardware-lambda``), ProxylessNAS's ``add#linear``, the form FDNAS's released code
      uses (``--grad_reg_loss_type add#linear``, lambda 0.05).  The paper itself only says
      "the details of hardware-aware loss term refer to ProxylessNAS".

    With ``expected`` (e.g. the expected latency, ``hardware.expected_latency``) that cost
    and a ``target`` in its unit replace the FLOPs.

    The two differ in what the target does.  In ``add-linear`` the hardware part of the
    alpha gradient, ``weight / target x dE/dalpha``, always pushes towards cheaper options
    and does not change sign at the target: the target sets only the push's size against
    the CE gradient, so the search settles where the two balance, above or below the
    target.  The squared log-gap pulls the expected FLOPs with a force growing with their
    distance from the target, downwards above it and upwards below it, so a lower target
    settles the search on a cheaper supernet (a target-seeking term as in TuNAS, Bender et
    al. 2020).  ProxylessNAS's third form, ``mul#log``, multiplies CE by
    ``(log E / log T)^beta``: there the target scales the whole alpha gradient, which Adam
    undoes, so it cannot steer the search; FDNAS's released code does not use it.
    """
    cost = space.expected_flops() if expected is None else expected
    if form == "add-linear":
        return weight * (cost - target_flops) / target_flops
    if form != "log-gap":
        raise ValueError(f"hardware loss {form!r}: allowed: {', '.join(HARDWARE_LOSSES)}")
    gap = torch.log(cost / target_flops)
    return weight * gap**2


def rescale_sampled(
    alphas: Sequence[Tensor], pairs: Sequence[Sequence[int]], before: Sequence[Tensor]
) -> None:
    """ProxylessNAS's rescaling after a two-path update (Cai et al. 2019, Sec. 3.2.1; its
    ``rescale_updated_arch_param``): shift each layer's two sampled alphas by one offset so
    that ``sum exp(alpha)`` over them equals its value ``before`` the step.  The softmax
    denominator is then unchanged, so the options that were not sampled keep their
    probabilities and the step only moves mass between the two sampled ones."""
    with torch.no_grad():
        for alpha, pair, old in zip(alphas, pairs, before, strict=True):
            index = torch.tensor(list(pair), device=alpha.device)
            new = alpha[index].double()
            offset = torch.logsumexp(new, 0) - torch.logsumexp(old.double(), 0)
            alpha[index] = (new - offset).to(alpha.dtype)


def _load_space(config: Mapping[str, Any], arrays: ArrayRecord) -> SearchSpace:
    space = build_space(**space_from_config(config))
    require_differentiable(space, "FDNAS")
    space.load_state_dict(state_dict_of(arrays), strict=True)
    return space


def _cycle(loader: DataLoader) -> Iterator[tuple[Tensor, Tensor]]:
    while True:
        yield from loader


def _probabilities(space: SearchSpace) -> list[np.ndarray]:
    """``softmax(alpha)`` of every layer on the host, normalised in float64 for numpy.

    All layers' alphas cross to the host in one copy (one sync per step on a GPU)."""
    alphas = [a.detach() for a in space.arch_parameters()]
    flat = torch.cat([torch.softmax(a, 0) for a in alphas]).double().cpu().numpy()
    probs = np.split(flat, np.cumsum([len(a) for a in alphas])[:-1])
    return [p / p.sum() for p in probs]


def _sample_candidates(
    rng: np.random.Generator, probs: np.ndarray
) -> tuple[tuple[int, ...], np.ndarray, int]:
    """Two distinct options drawn by ``probs`` (ProxylessNAS two-path mode), their
    renormalised probabilities, and the index (0/1) of the active one."""
    pair = rng.choice(len(probs), size=2, replace=False, p=probs)
    local = probs[pair] / probs[pair].sum()
    active = int(rng.choice(2, p=local))
    return tuple(int(o) for o in pair), local, active


def _alpha_step(
    space: SearchSpace,
    inputs: Tensor,
    targets: Tensor,
    rng: np.random.Generator,
    target_flops: float,
    weight: float,
    expected: Callable[[], Tensor] | None = None,
    form: str = "log-gap",
) -> tuple[float, int, list[tuple[int, ...]]]:
    """Accumulate alpha gradients of one validation batch; return its CE, forward FLOPs
    and each layer's two sampled options (``weight``: the hardware term's, 0: none)."""
    alphas = space.arch_parameters()
    picks = [_sample_candidates(rng, p) for p in _probabilities(space)]
    candidates = [pick[0] for pick in picks]
    device = alphas[0].device
    gates = [
        torch.tensor(
            [1.0 if j == active else 0.0 for j in range(2)], device=device, requires_grad=True
        )
        for _, _, active in picks
    ]
    cross_entropy = nn.functional.cross_entropy(
        space.forward_gated(inputs, candidates, gates), targets
    )
    if weight:
        cost = None if expected is None else expected()
        loss = cross_entropy + hardware_loss(space, target_flops, weight, cost, form=form)
    else:
        loss = cross_entropy
    loss.backward()
    with torch.no_grad():
        for alpha, (pair, local, _), gate in zip(alphas, picks, gates, strict=True):
            # dL/dalpha_i = sum_j dL/dg_j p_j (delta_ij - p_i), over the two candidates
            grad_gate = gate.grad.double().cpu().numpy()
            for i in range(2):
                value = sum(grad_gate[j] * local[j] * ((i == j) - local[i]) for j in range(2))
                alpha.grad[pair[i]] += float(value)
    flops = space.fixed_cost.flops + sum(
        space.option_cost(layer, o).flops for layer, pair in enumerate(candidates) for o in pair
    )
    return float(cross_entropy.detach()), flops, candidates


def search_supernet(content: RecordDict, data: ClientData, partition_id: int) -> RecordDict:
    """E local epochs of ProxylessNAS updates of w and alpha; reply with both."""
    config: ConfigRecord = content.config_records[CONFIG]
    space = _load_space(config, content.array_records[ARRAYS])
    words = stream_words(config["seed"], "fdnas-search", config["server-round"], partition_id)
    rng = numpy_generator(words)
    device = torch_device()
    space.to(device).train()
    weight_optimizer = sgd(space.weight_parameters(), config)
    alpha_optimizer = torch.optim.Adam(
        space.arch_parameters(), lr=float(config["alpha-lr"]), betas=(0.0, 0.999)
    )
    # an older server sends neither key: the squared log-gap, weighted by hardware-beta
    form = str(config.get("hardware-loss", "log-gap"))
    weight = float(config["hardware-lambda" if form == "add-linear" else "hardware-beta"])
    # resource latency: the group table and a target in ms replace the FLOPs
    latency = latency_from_config(config, space.num_options())
    target = float(config["target-flops"]) if latency is None else latency[2]
    expected = None if latency is None else partial(expected_latency, space, *latency[:2])
    # 0 (never) also in the warm-up rounds: weights only, alphas frozen
    alpha_every = int(config["alpha-every"])
    batch_size = int(config["batch-size"])
    max_norm = float(config.get("grad-clip", 0.0))  # absent (an older server) or 0: none
    train_loader = seeded_loader(data.train, batch_size, words)
    val_batches = _cycle(seeded_loader(data.val, batch_size, substream(words, "val")))
    loss_sum, seen, val_sum, val_steps, flops, step = 0.0, 0, 0.0, 0, 0, 0
    for _ in range(int(config["local-epochs"])):
        for inputs, targets in train_loader:
            path = tuple(int(rng.choice(len(p), p=p)) for p in _probabilities(space))
            inputs, targets = inputs.to(device), targets.to(device)
            weight_optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(space(inputs, path), targets)
            loss.backward()
            clip_gradients(space.weight_parameters(), max_norm)
            weight_optimizer.step()
            loss_sum += float(loss.detach()) * len(targets)
            seen += len(targets)
            flops += training_flops(space.cost(path).flops, len(targets))
            step += 1
            if alpha_every and step % alpha_every == 0 and len(data.val):
                val_inputs, val_targets = next(val_batches)
                alpha_optimizer.zero_grad(set_to_none=False)
                for alpha in space.arch_parameters():
                    alpha.grad = torch.zeros_like(alpha)
                val_loss, forward, pairs = _alpha_step(
                    space,
                    val_inputs.to(device),
                    val_targets.to(device),
                    rng,
                    target,
                    weight,
                    expected,
                    form,
                )
                alphas = space.arch_parameters()
                before = [a.detach()[list(p)].clone() for a, p in zip(alphas, pairs, strict=True)]
                alpha_optimizer.step()
                rescale_sampled(alphas, pairs, before)
                val_sum += val_loss
                val_steps += 1
                flops += training_flops(forward, len(val_targets))
    state = {k: v.detach().cpu() for k, v in space.state_dict().items()}
    metrics = MetricRecord(
        {
            "num-examples": len(data.train) + len(data.val),
            "train-loss": loss_sum / max(seen, 1),
            "val-loss": val_sum / max(val_steps, 1),
            "train-flops": flops,
            "expected-flops": float(space.expected_flops().detach()),
        }
    )
    if expected is not None:
        metrics["expected-ms"] = float(expected().detach())
    return RecordDict({ARRAYS: record_of(state), METRICS: metrics})


def _load_net(config: Mapping[str, Any], arrays: ArrayRecord) -> Subnet:
    net = build_subnet(space_from_config(config), [int(v) for v in config["arch"]])
    net.load_state_dict(state_dict_of(arrays), strict=True)
    return net


def train_net(content: RecordDict, data: ClientData, partition_id: int) -> RecordDict:
    """Local epochs of the derived net (FedAvg stage); report test accuracy afterwards."""
    config: ConfigRecord = content.config_records[CONFIG]
    received = content.array_records[ARRAYS]
    net = _load_net(config, received)
    words = stream_words(config["seed"], "fdnas-train", config["server-round"], partition_id)
    done = local_sgd(net, data.train, config, words)
    local = evaluate(net, ordered_loader(data.test), torch_device())
    metrics = MetricRecord(
        {
            "num-examples": len(data.train),
            "train-loss": done.loss,
            "train-flops": done.flops(int(config["net-flops"])),
            "local-accuracy": local.accuracy,
        }
    )
    return RecordDict({ARRAYS: record_of(reply_state(net, received)), METRICS: metrics})


def evaluate_net(content: RecordDict, data: ClientData) -> RecordDict:
    """Test loss and accuracy of the received net on the local test split, its BatchNorm
    statistics re-estimated on the training split first (``held_out_metrics``)."""
    config: ConfigRecord = content.config_records[CONFIG]
    net = _load_net(config, content.array_records[ARRAYS])
    return RecordDict({METRICS: MetricRecord(held_out_metrics(net, data.test, data.train))})
