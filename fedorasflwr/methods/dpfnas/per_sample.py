"""Per-sample gradients, as the DP-FNAS parties compute them, and the check a space must pass.

``per_sample_gradients`` is the parties' routine (``torch.func``: ``vmap`` of ``grad``
of one sample's loss).  ``per_sample_problem`` runs it at strategy construction on a
tiny batch of the space's mixed forward, so a space the mechanism would get wrong is
refused before any message: it must pass opacus' ``ModuleValidator`` (no BatchNorm and
the like), keep every sample's output independent of its batch, and give, per sample,
the gradient that sample alone gives.  Server and parties both import this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from ...progress import root_logger_kept
from ...search_spaces.base import SearchSpace, class_path
from ...seeding import torch_stream

__all__ = ["CHUNK", "per_sample_gradients", "per_sample_problem"]

CHUNK = 16  # samples per vmap chunk: bounds memory of per-sample activations

_PASSED: set[tuple[Any, ...]] = set()  # (class, spec) of spaces that passed: the check is pure


def per_sample_gradients(
    model: nn.Module,
    wrt: Mapping[str, Tensor],
    inputs: Tensor,
    targets: Tensor,
) -> dict[str, Tensor]:
    """Per-sample gradients of the cross-entropy w.r.t. the tensors ``wrt`` (by name).

    Every other parameter of ``model`` is held at its current value.  Returns
    one ``(B, *shape)`` tensor per name.
    """
    fixed = {k: v.detach() for k, v in model.named_parameters() if k not in wrt}

    def loss(params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        logits = functional_call(model, {**fixed, **params}, (x.unsqueeze(0),))
        return nn.functional.cross_entropy(logits, y.unsqueeze(0))

    params = {k: v.detach() for k, v in wrt.items()}
    return vmap(grad(loss), in_dims=(None, 0, 0), chunk_size=CHUNK)(params, inputs, targets)


def per_sample_problem(space: SearchSpace, samples: int = 2) -> str | None:
    """Why DP-FNAS's per-sample gradients of ``space``'s mixed forward would be wrong or
    fail, or ``None``: opacus' ``ModuleValidator`` errors; an output that depends on the
    other samples of the batch; ``torch.func`` failing; per-sample gradients (every
    parameter) differing from a loop over single samples.  Runs in training mode, as the
    parties do, on ``samples`` seeded inputs; the space's state is left as it was."""
    memo = (class_path(type(space)), tuple(sorted(space.spec.items())))
    if memo in _PASSED:
        return None
    was_training = space.training
    buffers = {k: v.detach().clone() for k, v in space.named_buffers()}
    space.train()
    try:
        problem = _problem(space, samples)
    finally:
        space.train(was_training)
        with torch.no_grad():
            for name, value in space.named_buffers():
                value.copy_(buffers[name])
    if problem is None:
        _PASSED.add(memo)
    return problem


def _problem(space: SearchSpace, samples: int) -> str | None:
    # opacus (with scipy and torch.distributed.tensor) costs about as much to import as
    # torch; every ClientApp process imports this module, and only DP-FNAS's check needs it
    with root_logger_kept():  # opacus's import adds a root handler: every flwr line twice
        from opacus.validators import ModuleValidator

    errors = ModuleValidator.validate(space, strict=False)
    if errors:
        return "opacus ModuleValidator: " + "; ".join(dict.fromkeys(str(e) for e in errors))
    params = dict(space.named_parameters())
    device = next(iter(params.values())).device
    generator = torch_stream(0, "per-sample-check")
    shape = (samples, *space.input_shape)
    if space.input_dtype.is_floating_point:
        inputs = torch.randn(shape, generator=generator).to(space.input_dtype)
    else:
        inputs = torch.randint(0, 2, shape, generator=generator, dtype=space.input_dtype)
    inputs = inputs.to(device)
    try:
        with torch.no_grad():
            batch = space(inputs)
            alone = space(inputs[:1])
    except Exception as err:  # noqa: BLE001 - any failure is the reason to refuse
        return f"the mixed forward(x) fails: {type(err).__name__}: {err}"
    if batch.dim() != 2 or batch.shape[0] != samples:
        return f"forward(x) must give logits (batch, classes), got {tuple(batch.shape)}"
    if not torch.allclose(batch[:1], alone, rtol=1e-4, atol=1e-5):
        return "a sample's output depends on the other samples of its batch (BatchNorm?)"
    targets = torch.arange(samples, device=device) % batch.shape[1]
    try:
        fast = per_sample_gradients(space, params, inputs, targets)
    except Exception as err:  # noqa: BLE001 - any failure is the reason to refuse
        return f"the per-sample gradients fail: {type(err).__name__}: {err}"
    bad = [name for name, value in fast.items() if not torch.isfinite(value).all()]
    if bad:
        return f"the per-sample gradients of {bad} are not finite"
    # the slow, obviously correct reference: the first sample's gradient on its own
    loss = nn.functional.cross_entropy(space(inputs[:1]), targets[:1])
    reference = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    for (name, value), slow in zip(params.items(), reference, strict=True):
        expected = torch.zeros_like(value) if slow is None else slow
        if not torch.allclose(fast[name][0], expected, rtol=1e-3, atol=1e-5):
            return f"the per-sample gradient of {name!r} differs from its sample's own"
    return None
