"""DP-FNAS client (Singh et al., 2020, Algorithm 1): one party's private gradients.

``weight_gradient`` (exchange a): Poisson-sample the training split at rate p,
compute per-sample gradients of the loss w.r.t. the weights W
(``torch.func.vmap(grad(...))``), clip each to L2 norm R_G, sum, add
R_G * N(0, sigma^2 I), divide by the expected batch size p * N -> G_k.

``architecture_gradient`` (exchange b): the same on the validation split for
the architecture variables A (first order: grad_A L_val(W'); second order adds
the paper's finite-difference term, Eq. 5), clip R_H, noise R_H * N(0, tau^2 I).

The divisor is the *expected* batch size (opacus' convention): the sensitivity
of the noised sum is then exactly R, and |I_t| is never revealed.  (The paper
divides by |I_t|.)  Replies carry only the noised gradient and public numbers.

``train-flops`` (the ledger's client training compute): every sample differentiated, at
``3 x mixed-flops`` (``costs.training_flops``; ``mixed-flops``, the mixed supernet's
forward FLOPs per sample, comes in the config).  A per-sample gradient (``vmap`` of
``grad``) costs more wall time than one batched backward but the same FLOPs by this
convention.  The second-order architecture gradient differentiates, per validation
sample, that sample and then the training batch twice (W+ and W-): n_val x (1 + 2 n_train)
sample passes.  A private party (noise multiplier > 0) reports the *expected* count
(p N, and p N_val x (1 + 2 p N_train)), rounded: the realised |I_t| is never revealed.

Every noise draw and Poisson sample of a private computation (both exchanges,
the second-order training batch, DP final training) comes from the party's OS
CSPRNG, which the server cannot regenerate (``secure_random``); only
``insecure-reproducible-noise`` in the message config seeds them instead, and a party
obeys that only when its owner set the node config ``allow-reproducible-noise = true``
(``check_noise_consent``; default: it refuses the message, saying why).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, MetricRecord, RecordDict
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap
from torch.utils.data import Dataset

from ...arrays import record_of, state_dict_of
from ...costs import training_flops
from ...data import ClientData
from ...protocol import ARRAYS, CONFIG, METRICS, space_from_config
from ...search_spaces import SearchSpace, build_space
from ...search_spaces.darts_style import derived_network_of, require_darts_style, weight_keys
from ...seeding import stream_words, substream
from ...training import held_out_metrics, local_sgd, torch_device
from .contract import INSECURE_KEY, PREVIOUS_PREFIX, final_steps
from .per_sample import CHUNK, per_sample_gradients
from .secure_random import NoiseSource, SampleSource, gaussian, party_randomness

__all__ = [
    "CONSENT_KEY",
    "architecture_gradient",
    "check_noise_consent",
    "clip_and_noise",
    "evaluate_final",
    "per_sample_gradients",
    "poisson_sample",
    "train_final",
    "weight_gradient",
]


#: node config key: the party's owner lets the server seed its DP noise (default false)
CONSENT_KEY = "allow-reproducible-noise"


def _consents(node_config: Mapping[str, Any]) -> bool:
    value = node_config.get(CONSENT_KEY, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"node config {CONSENT_KEY} = {value!r} is invalid: true or false")


def check_noise_consent(config: Mapping[str, Any], node_config: Mapping[str, Any]) -> None:
    """Refuse a private computation (noise multiplier > 0) whose message asks for seeded
    noise (``insecure-reproducible-noise = true``) unless this node's owner allowed it
    (node config ``allow-reproducible-noise = true``): seeded noise can be regenerated, and
    removed, by the server, so the party's data would have no privacy against it.

    Raises
    ------
    PermissionError
        Naming both keys and why; Flower sends the server an error reply.
    ValueError
        The node config's value is not a boolean.
    """
    private = float(config.get("noise-multiplier", 0.0)) > 0
    if private and bool(config.get(INSECURE_KEY, False)) and not _consents(node_config):
        raise PermissionError(
            f"refused: the server asks for {INSECURE_KEY} = true (DP noise seeded from the "
            "run seed, which the server can regenerate and subtract: no privacy against it); "
            f"this node's owner has not allowed it (node config {CONSENT_KEY} = true)"
        )


def poisson_sample(rng: SampleSource, size: int, rate: float) -> np.ndarray:
    """Indices of a Poisson subsample: each of ``size`` items kept with probability ``rate``.

    ``rng``: a ``numpy.random.Generator`` or ``SecureRandom`` (anything with ``.random``)."""
    return np.flatnonzero(rng.random(size) < rate)


def _gather(dataset: Dataset, indices: np.ndarray) -> tuple[Tensor, Tensor]:
    """The items at ``indices``, stacked and moved to ``torch_device()``."""
    device = torch_device()
    if len(indices) == 0:
        return torch.empty(0, device=device), torch.empty(0, dtype=torch.long, device=device)
    items = [dataset[int(i)] for i in indices]
    inputs = torch.stack([x for x, _ in items])
    targets = torch.stack([torch.as_tensor(y) for _, y in items])
    return inputs.to(device), targets.to(device)


def clip_and_noise(
    per_sample: Mapping[str, Tensor],
    *,
    clip: float,
    noise_multiplier: float,
    expected_batch: float,
    generator: NoiseSource,
) -> tuple[dict[str, Tensor], float]:
    """Algorithm 1's Gaussian mechanism: clip each sample's joint L2 norm to ``clip``,
    sum, add ``clip * N(0, noise_multiplier^2)`` per coordinate, divide by
    ``expected_batch``.  Also returns the fraction of samples that were clipped.

    ``generator``: a seeded ``torch.Generator`` or ``SecureRandom`` (the OS CSPRNG)."""
    names = list(per_sample)
    first = per_sample[names[0]]
    count = first.shape[0]
    if count:
        norms = torch.sqrt(sum(per_sample[k].reshape(count, -1).pow(2).sum(1) for k in names))
        factors = (clip / (norms + 1e-12)).clamp(max=1.0)
        clipped_fraction = float((norms > clip).float().mean())
    out = {}
    for name in names:
        grads = per_sample[name]
        total = (
            torch.einsum("b,b...->...", factors, grads)
            if count
            else torch.zeros(grads.shape[1:], dtype=grads.dtype, device=grads.device)
        )
        if noise_multiplier > 0:
            std = noise_multiplier * clip
            total = total + gaussian(std, total.shape, generator, total.dtype, total.device)
        out[name] = total / expected_batch
    return out, clipped_fraction if count else 0.0


def _no_samples(wrt: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Zero samples' per-sample gradients: ``(0, *shape)`` on each tensor's device."""
    return {k: v.new_zeros((0, *v.shape)) for k, v in wrt.items()}


def _load(content: RecordDict) -> tuple[SearchSpace, ConfigRecord]:
    config: ConfigRecord = content.config_records[CONFIG]
    space = build_space(**space_from_config(config))
    require_darts_style(space)
    state = state_dict_of(content.array_records[ARRAYS])
    space.load_state_dict({k: v for k, v in state.items() if not k.startswith(PREVIOUS_PREFIX)})
    return space.to(torch_device()), config


def _words(config: Mapping[str, Any], partition_id: int, phase: str) -> list[int]:
    """Seed words of a seeded (non-private or insecure) computation; see ``secure_random``."""
    return list(
        stream_words(config["seed"], f"dpfnas-{phase}", config["server-round"], partition_id)
    )


def _randomness(config: Mapping[str, Any], words: list[int]) -> tuple[SampleSource, NoiseSource]:
    return party_randomness(config, words, private=float(config["noise-multiplier"]) > 0)


def _batch(
    dataset: Dataset, config: Mapping[str, Any], sampler: SampleSource
) -> tuple[Tensor, Tensor, float]:
    rate = float(config["sample-rate"])
    indices = poisson_sample(sampler, len(dataset), rate)
    inputs, targets = _gather(dataset, indices)
    return inputs, targets, max(rate * len(dataset), 1e-12)


def _private(config: Mapping[str, Any]) -> bool:
    return float(config.get("noise-multiplier", 0.0)) > 0


def _passes_flops(forward_flops: int, passes: float) -> int:
    """``train-flops`` of ``passes`` sample passes (forward + backward) through a net of
    ``forward_flops`` per sample; a whole number (an expected count is rounded)."""
    return int(round(training_flops(forward_flops, 1) * passes))


def _search_flops(config: Mapping[str, Any], passes: int, expected: float) -> int:
    """``train-flops`` of a search exchange: the realised sample passes, or for a private
    party the expected ones (the realised count would reveal |I_t|)."""
    return _passes_flops(int(config["mixed-flops"]), expected if _private(config) else passes)


def _reply(
    per_sample: Mapping[str, Tensor],
    config: Mapping[str, Any],
    expected_batch: float,
    noise: NoiseSource,
    train_flops: int,
) -> RecordDict:
    """Clip and noise the per-sample gradients (both exchanges), then the reply."""
    multiplier = float(config["noise-multiplier"])
    gradient, clipped = clip_and_noise(
        per_sample,
        clip=float(config["clip"]),
        noise_multiplier=multiplier,
        expected_batch=expected_batch,
        generator=noise,
    )
    arrays = record_of({k: v.detach().cpu().contiguous() for k, v in gradient.items()})
    metrics = MetricRecord({"expected-batch": expected_batch, "train-flops": train_flops})
    if multiplier == 0:  # the clipped fraction depends on the data: never sent from a private party
        metrics["clipped-fraction"] = clipped
    return RecordDict({ARRAYS: arrays, METRICS: metrics})


def weight_gradient(content: RecordDict, data: ClientData, partition_id: int) -> RecordDict:
    """Exchange (a): the noised, clipped training gradient G_k of the weights W."""
    space, config = _load(content)
    sampler, noise = _randomness(config, _words(config, partition_id, "weights"))
    inputs, targets, expected = _batch(data.train, config, sampler)
    named = dict(space.named_parameters())
    wrt = {k: named[k] for k in weight_keys(space)}
    per_sample = (
        per_sample_gradients(space, wrt, inputs, targets) if len(inputs) else _no_samples(wrt)
    )
    rate = float(config["sample-rate"])
    flops = _search_flops(config, len(inputs), rate * len(data.train))
    return _reply(per_sample, config, expected, noise, flops)


def architecture_gradient(content: RecordDict, data: ClientData, partition_id: int) -> RecordDict:
    """Exchange (b): the noised, clipped validation gradient H_k of the alphas A."""
    space, config = _load(content)
    words = _words(config, partition_id, "architecture")
    sampler, noise = _randomness(config, words)
    inputs, targets, expected = _batch(data.val, config, sampler)
    named = dict(space.named_parameters())
    wrt = {k: named[k] for k in space.arch_keys}
    rate = float(config["sample-rate"])
    second = int(config["order"]) == 2
    # sample passes: each validation sample once; order 2 adds, per validation sample, two
    # passes (W+, W-) of the training batch (_second_order: rate x num-train expected)
    n_train, e_train = 0, (rate * len(data.train) if second else 0.0)
    if not len(inputs):
        per_sample = _no_samples(wrt)
    elif second:
        per_sample, n_train = _second_order(space, content, config, inputs, targets, data, words)
    else:
        per_sample = per_sample_gradients(space, wrt, inputs, targets)
    e_val = rate * len(data.val)
    flops = _search_flops(config, len(inputs) * (1 + 2 * n_train), e_val * (1 + 2 * e_train))
    return _reply(per_sample, config, expected, noise, flops)


def _second_order(
    space: SearchSpace,
    content: RecordDict,
    config: Mapping[str, Any],
    inputs: Tensor,
    targets: Tensor,
    data: ClientData,
    words: list[int],
) -> tuple[dict[str, Tensor], int]:
    """Per validation sample i, Eq. 5: grad_A L_val^i(W') - xi / (2 eps) *
    (grad_A L_tr(W+) - grad_A L_tr(W-)), W+- = W +- eps grad_W' L_val^i(W'),
    with eps = 0.01 / ||grad_W' L_val^i|| (DARTS) and a Poisson training batch.

    The training batch enters H_k here; the paper's accounting (and this
    project's) charges H_k to the validation split only.  Also returns the size of the
    training batch (``train-flops``: each validation sample differentiates it twice)."""
    state = state_dict_of(content.array_records[ARRAYS])
    weights = weight_keys(space)
    device = torch_device()
    previous = {k: state[PREVIOUS_PREFIX + k].to(device) for k in weights}
    named = {k: v.detach() for k, v in space.named_parameters()}
    arch = {k: named[k] for k in space.arch_keys}
    current = {k: named[k] for k in weights}
    xi = float(config["weight-lr"])
    train_x, train_y, _ = _batch(
        data.train, config, _randomness(config, list(substream(words, "train-batch")))[0]
    )
    if not len(train_x):
        train_x, train_y = inputs[:0], targets[:0]

    def val_loss(a: dict[str, Tensor], w: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        logits = functional_call(space, {**a, **w}, (x.unsqueeze(0),))
        return nn.functional.cross_entropy(logits, y.unsqueeze(0))

    def train_loss(a: dict[str, Tensor], w: dict[str, Tensor]) -> Tensor:
        if not len(train_x):
            return sum(v.sum() * 0.0 for v in a.values())
        logits = functional_call(space, {**a, **w}, (train_x,))
        return nn.functional.cross_entropy(logits, train_y)

    def one(x: Tensor, y: Tensor) -> dict[str, Tensor]:
        grad_a, grad_w = grad(val_loss, argnums=(0, 1))(arch, current, x, y)
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grad_w.values()))
        eps = 0.01 / (norm + 1e-12)
        plus = {k: previous[k] + eps * grad_w[k] for k in weights}
        minus = {k: previous[k] - eps * grad_w[k] for k in weights}
        g_plus = grad(train_loss)(arch, plus)
        g_minus = grad(train_loss)(arch, minus)
        return {k: grad_a[k] - xi / (2 * eps) * (g_plus[k] - g_minus[k]) for k in arch}

    return vmap(one, chunk_size=CHUNK)(inputs, targets), len(train_x)


def _derived(content: RecordDict) -> tuple[nn.Module, ConfigRecord]:
    config: ConfigRecord = content.config_records[CONFIG]
    return derived_network_of(config, state_dict_of(content.array_records[ARRAYS])), config


def train_final(content: RecordDict, data: ClientData, partition_id: int) -> RecordDict:
    """Local SGD epochs of the derived network (FedAvg's client side)."""
    net, config = _derived(content)
    words = _words(config, partition_id, "final")
    if _private(config):
        net.to(torch_device()).train()  # batches (_gather) and noise follow
        optimizer = torch.optim.SGD(
            net.parameters(), lr=float(config["lr"]), momentum=float(config["momentum"])
        )
        return _train_final_private(net, optimizer, config, data, list(words))
    done = local_sgd(net, data.train, config, words)
    state = {k: v.detach().cpu() for k, v in net.state_dict().items()}
    # FedAvg's weight is the node's dataset size (bounded by its profile), not the samples
    # seen over all local epochs: with final-local-epochs > 1 those exceed the bound.
    metrics = MetricRecord(
        {
            "num-examples": len(data.train),
            "train-loss": done.loss,
            "train-flops": done.flops(int(config["net-flops"])),
        }
    )
    return RecordDict({ARRAYS: record_of(state), METRICS: metrics})


def _train_final_private(
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: Mapping[str, Any],
    data: ClientData,
    words: list[int],
) -> RecordDict:
    """DP-SGD local training: Poisson batches (rate B / N), per-sample clipping, noise.
    ``train-flops``: the expected samples (steps x B / N x N), never the realised ones."""
    n = len(data.train)
    batch = int(config["batch-size"])
    rate = min(1.0, batch / n)
    rng, generator = _randomness(config, list(substream(words, "dp-sgd")))
    named = dict(net.named_parameters())
    steps = final_steps(n, batch, int(config["local-epochs"]))
    for _ in range(steps):
        inputs, targets = _gather(data.train, poisson_sample(rng, n, rate))
        if len(inputs):
            per_sample = per_sample_gradients(net, named, inputs, targets)
        else:
            per_sample = _no_samples(named)
        gradient, _ = clip_and_noise(
            per_sample,
            clip=float(config["clip"]),
            noise_multiplier=float(config["noise-multiplier"]),
            expected_batch=rate * n,
            generator=generator,
        )
        for key, parameter in named.items():
            parameter.grad = gradient[key]
        optimizer.step()
    state = {k: v.detach().cpu() for k, v in net.state_dict().items()}
    # num-examples is the public N (FedAvg weights); no data-dependent loss is sent
    flops = _passes_flops(int(config["net-flops"]), steps * rate * n)
    metrics = MetricRecord({"num-examples": n, "train-loss": 0.0, "train-flops": flops})
    return RecordDict({ARRAYS: record_of(state), METRICS: metrics})


def evaluate_final(content: RecordDict, data: ClientData) -> RecordDict:
    """Loss and accuracy of the derived network on this party's test split."""
    net, _ = _derived(content)
    return RecordDict({METRICS: MetricRecord(held_out_metrics(net, data.test, data.train))})
