"""Local training and evaluation loops used by both sides (every method's client and the
server's own validation): seeded loaders, device choice, loss/accuracy over any logits shape.

Device
------
Every loop (training, evaluation, per-sample gradients, search, on both sides) asks
:func:`torch_device` where to compute.  It returns the device set for the current
call by :func:`using_device` (the ClientApp's :func:`device_mod` sets it per message
from the node config's ``device``, else the run config's top-level ``device``; the
ServerApp sets it from the run config), else CUDA when present, else the CPU.
Settings: ``auto`` (CUDA when present), ``cpu``, ``cuda`` or ``cuda:<index>``.

Deterministic kernels
---------------------
Where that device is CUDA, the run config's ``deterministic`` (default true) makes the
process's kernels deterministic (:func:`use_deterministic_kernels`): same seed, same
result on a GPU too.  :func:`apply_determinism` is called wherever the device is chosen
(the ClientApp's :func:`device_mod`, the ServerApp); false, or a CPU device, leaves
PyTorch's flags alone.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from .costs import training_flops
from .seeding import torch_generator

if TYPE_CHECKING:
    from flwr.app import Context, Message

__all__ = [
    "clip_gradients",
    "DETERMINISTIC_KEY",
    "DEVICE_KEY",
    "apply_determinism",
    "check_deterministic_setting",
    "check_device_setting",
    "device_mod",
    "device_setting",
    "resolve_device",
    "using_device",
    "EvalResult",
    "LocalTraining",
    "LrProbe",
    "probe_lr",
    "evaluate",
    "local_sgd",
    "flatten_logits",
    "has_batchnorm",
    "recalibrate_batchnorm",
    "refresh_batchnorm",
    "reply_state",
    "ordered_loader",
    "seeded_loader",
    "held_out_metrics",
    "torch_device",
    "use_deterministic_kernels",
]


DEVICE_KEY = "device"
"""Node-config and (top-level) run-config key: ``auto``, ``cpu``, ``cuda`` or ``cuda:<n>``."""

_DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
_CURRENT: contextvars.ContextVar[torch.device | None] = contextvars.ContextVar(
    "fedorasflwr_device", default=None
)


def check_device_setting(value: object, where: str = "run config 'device'") -> str:
    """``value`` if it is a device setting, else ``ValueError`` naming ``where`` and the
    allowed values (checks the spelling only, not that the device exists)."""
    if not isinstance(value, str) or not _DEVICE_PATTERN.fullmatch(value):
        raise ValueError(f"{where} = {value!r}: allowed: auto, cpu, cuda or cuda:<index>")
    return value


def resolve_device(setting: str, where: str = "run config 'device'") -> torch.device:
    """The ``torch.device`` of a setting: ``auto`` is CUDA when present, else the CPU.

    Raises
    ------
    ValueError
        For an unknown setting, or ``cuda`` on a machine without CUDA (or without
        that device index).
    """
    check_device_setting(setting, where)
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(setting)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"{where} = {setting!r}, but CUDA is not available here: use auto or cpu"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"{where} = {setting!r}, but this machine has {torch.cuda.device_count()} "
                "CUDA device(s)"
            )
    return device


def device_setting(node_config: Mapping[str, Any], run_config: Mapping[str, Any]) -> str:
    """This node's device setting: the node config's ``device`` wins (devices are per
    node), else the run config's ``device``, else ``auto``."""
    if DEVICE_KEY in node_config:
        return check_device_setting(node_config[DEVICE_KEY], "node config 'device'")
    return check_device_setting(run_config.get(DEVICE_KEY, "auto"))


@contextlib.contextmanager
def using_device(device: torch.device | str) -> Iterator[torch.device]:
    """Within the block (this thread / task), :func:`torch_device` returns ``device``."""
    token = _CURRENT.set(torch.device(device))
    try:
        yield torch.device(device)
    finally:
        _CURRENT.reset(token)


def torch_device() -> torch.device:
    """Where every loop computes: the device of the enclosing :func:`using_device`,
    else CUDA when present, else the CPU."""
    current = _CURRENT.get()
    if current is not None:
        return current
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


DETERMINISTIC_KEY = "deterministic"
"""Run-config key: on CUDA, deterministic kernels and no TF32 (default true)."""

CUBLAS_WORKSPACE = ":4096:8"
"""``CUBLAS_WORKSPACE_CONFIG`` for deterministic cuBLAS (PyTorch's reproducibility notes)."""


def check_deterministic_setting(value: object) -> bool:
    """``value`` if it is a bool, else ``ValueError`` naming the key and what is allowed."""
    if not isinstance(value, bool):
        raise ValueError(f"run config {DETERMINISTIC_KEY!r} = {value!r}: allowed: true or false")
    return value


def use_deterministic_kernels() -> None:
    """Make this process's CUDA kernels deterministic and exact, as PyTorch's
    reproducibility notes say: ``CUBLAS_WORKSPACE_CONFIG`` (unless already set),
    ``torch.use_deterministic_algorithms(True, warn_only=True)`` (an op without a
    deterministic implementation warns, naming itself, rather than stopping the run),
    cuDNN deterministic with benchmarking off, and TF32 off for matmul and cuDNN.
    Needs no GPU (the flags are plain process settings)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def apply_determinism(device: torch.device, deterministic: bool) -> bool:
    """:func:`use_deterministic_kernels` when ``device`` is CUDA and ``deterministic``;
    otherwise PyTorch's flags are left as they are.  Returns whether it applied them."""
    if check_deterministic_setting(deterministic) and device.type == "cuda":
        use_deterministic_kernels()
        return True
    return False


def device_mod(msg: Message, context: Context, call_next: Callable[..., Message]) -> Message:
    """ClientApp mod: handle ``msg`` on this node's device (:func:`device_setting`), with
    deterministic kernels there when the run config's ``deterministic`` says so."""
    setting = device_setting(context.node_config, context.run_config)
    where = "node config 'device'" if DEVICE_KEY in context.node_config else "run config 'device'"
    device = resolve_device(setting, where)
    apply_determinism(
        device, check_deterministic_setting(context.run_config.get(DETERMINISTIC_KEY, True))
    )
    with using_device(device):
        return call_next(msg, context)


def seeded_loader(dataset: Dataset, batch_size: int, words: Sequence[int]) -> DataLoader:
    """A single-process, shuffling ``DataLoader`` whose order is fixed by stream ``words``
    (:func:`fedorasflwr.seeding.stream_words`)."""
    return DataLoader(
        dataset, batch_size=batch_size, shuffle=True, generator=torch_generator(words)
    )


def ordered_loader(dataset: Dataset, batch_size: int = 256) -> DataLoader:
    """A single-process ``DataLoader`` in the dataset's order (evaluation)."""
    return DataLoader(dataset, batch_size=batch_size, shuffle=False)


def flatten_logits(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """(B, C) / (B, T, V) logits and matching targets -> (N, C) and (N,)."""
    return logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)


@dataclass(frozen=True)
class EvalResult:
    """Summed loss, correct predictions and predictions counted."""

    loss_sum: float
    correct: int
    count: int

    @property
    def loss(self) -> float:
        return self.loss_sum / max(self.count, 1)

    @property
    def accuracy(self) -> float:
        return self.correct / max(self.count, 1)


@torch.no_grad()
def evaluate(
    forward: Callable[[Tensor], Tensor], loader: DataLoader, device: torch.device
) -> EvalResult:
    """Cross-entropy and accuracy of ``forward`` over ``loader`` (every position for text)."""
    loss_sum, correct, count = 0.0, 0, 0
    criterion = nn.CrossEntropyLoss(reduction="sum")
    for inputs, targets in loader:
        logits, flat_targets = flatten_logits(forward(inputs.to(device)), targets.to(device))
        loss_sum += float(criterion(logits, flat_targets))
        correct += int((logits.argmax(dim=1) == flat_targets).sum())
        count += int(flat_targets.numel())
    return EvalResult(loss_sum, correct, count)


@torch.no_grad()
def recalibrate_batchnorm(
    model: nn.Module,
    forward: Callable[[Tensor], Tensor],
    batches: Iterable[Tensor],
    device: torch.device,
) -> None:
    """Re-estimate BatchNorm running statistics of the modules ``forward`` uses.

    A supernet's per-option BN statistics were accumulated under many different
    upstream paths, so scoring one path with them is misleading (SPOS, FedorAS
    §3.2).  Running statistics are reset and replaced by the pooled statistics of each
    BN's input over all of ``batches``: the mean and the unbiased variance over every
    sample and position seen, whatever the batch sizes (PyTorch's ``momentum=None``
    would average per-batch figures instead, weighting a short last batch like a full
    one and leaving out how far the batch means differ).  Inputs are normalised by
    their batch statistics during the pass (train mode), as PreciseBN does.  Only the
    BNs on the path see data; the others keep their reset values (reload the weights
    before training again).
    """
    norms = [
        m
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]
    sums: dict[nn.Module, list[Tensor | int]] = {}

    def add(module: nn.Module, count: int, mean: Tensor, biased_var: Tensor) -> None:
        # per batch: count * mean and count * (var + mean^2), summed in float64
        mean = mean.detach().double()
        total = sums.setdefault(module, [0.0, 0.0, 0])
        total[0] = total[0] + mean * count
        total[1] = total[1] + (biased_var.detach().double() + mean * mean) * count
        total[2] += count

    def batch_figures(module: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> None:
        # a stock BatchNorm at momentum 1 leaves in its running buffers exactly its batch's
        # mean and unbiased variance, which its forward computed anyway: no second pass
        count = args[0].numel() // args[0].shape[1]
        unbiased = module.running_var
        add(module, count, module.running_mean, unbiased * ((count - 1) / count))

    def batch_pass(module: nn.Module, args: tuple[Tensor, ...]) -> None:
        # a BatchNorm with its own forward: the batch's figures from its input
        x = args[0].detach().reshape(args[0].shape[0], args[0].shape[1], -1)
        count = x.shape[0] * x.shape[2]
        mean = x.sum(dim=(0, 2), dtype=torch.float64) / count
        squares = (x * x).sum(dim=(0, 2), dtype=torch.float64) / count
        add(module, count, mean, squares - mean * mean)

    stock = nn.modules.batchnorm._BatchNorm.forward
    momenta = {m: m.momentum for m in norms}
    hooks = []
    for m in norms:
        m.reset_running_stats()
        if type(m).forward is stock:
            m.momentum = 1.0
            hooks.append(m.register_forward_hook(batch_figures))
        else:
            hooks.append(m.register_forward_pre_hook(batch_pass))
    model.train()
    try:
        for inputs in batches:
            forward(inputs.to(device))
    finally:
        for hook in hooks:
            hook.remove()
        for m, momentum in momenta.items():
            m.momentum = momentum
        model.eval()
    for m, (total, squares, count) in sums.items():
        mean = total / count
        var = (squares / count - mean * mean).clamp_min(0.0) * (count / max(count - 1, 1))
        m.running_mean.copy_(mean.to(m.running_mean.dtype))
        m.running_var.copy_(var.to(m.running_var.dtype))


def has_batchnorm(model: nn.Module) -> bool:
    """Whether ``model`` holds a BatchNorm module (its running statistics need refreshing)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def refresh_batchnorm(net: nn.Module, dataset: Dataset, batch_size: int = 256) -> int:
    """Re-estimate ``net``'s BatchNorm running statistics for its current weights: pooled
    over one pass of ``dataset`` in order, in ``batch_size`` batches, on
    :func:`torch_device` (:func:`recalibrate_batchnorm`); ``net`` ends in eval mode.

    Why: BatchNorm's running statistics are an exponential average (momentum 0.1) that
    starts at mean 0, variance 1.  After the few local steps of a few federated rounds
    (a client with 200 samples in batches of 64 takes 4 per epoch) they still hold much
    of their initial value and lag the moving weights, so a model judged in eval mode is
    not the model trained (issue 28: DecNAS's GM_0 predicted one class for every sample).

    Returns the samples forwarded: ``len(dataset)``, or 0 for a net without BatchNorm
    (nothing is done)."""
    if not has_batchnorm(net):
        return 0
    device = torch_device()
    net.to(device)
    batches = (inputs for inputs, _ in ordered_loader(dataset, batch_size))
    recalibrate_batchnorm(net, net, batches, device)
    return len(dataset)


def reply_state(net: nn.Module, received: Mapping[str, Any]) -> dict[str, Tensor]:
    """``net``'s ``state_dict`` on the CPU, each tensor in the dtype it was received in.

    Flower's FedAvg returns integer buffers (BatchNorm's ``num_batches_tracked``)
    as floats after a round; replying in the received dtypes keeps replies
    consistent with what the server sent.
    """
    state = {}
    for key, value in net.state_dict().items():
        dtype = torch.from_numpy(np.zeros(0, dtype=received[key].dtype)).dtype
        state[key] = value.detach().cpu().to(dtype)
    return state


@dataclass(frozen=True)
class LocalTraining:
    """What ``local_sgd`` did: mean training loss and samples seen (over all epochs), and the
    samples forwarded (no gradient) to refresh BatchNorm statistics (0: none)."""

    loss: float
    seen: int
    calibrated: int = 0

    def flops(self, forward_flops: int) -> int:
        """FLOPs spent, for a net of ``forward_flops`` per sample: training (forward and
        backward) of the samples seen plus the forwards that refreshed BatchNorm."""
        return training_flops(forward_flops, self.seen) + forward_flops * self.calibrated


def clip_gradients(parameters: Iterable[nn.Parameter], max_norm: float) -> None:
    """Scale the gradients of ``parameters`` so that their joint L2 norm is at most
    ``max_norm`` (``torch.nn.utils.clip_grad_norm_``); ``max_norm`` 0: leave them."""
    if max_norm > 0:
        nn.utils.clip_grad_norm_(
            [p for p in parameters if p.grad is not None], max_norm, foreach=True
        )


def sgd(parameters: Any, config: Mapping[str, Any]) -> torch.optim.SGD:
    """The clients' SGD: ``lr``, ``momentum`` and ``weight-decay`` (0 if absent) of a
    message's ``config``, on ``parameters``."""
    return torch.optim.SGD(
        parameters,
        lr=float(config["lr"]),
        momentum=float(config["momentum"]),
        weight_decay=float(config.get("weight-decay", 0.0)),
    )


def local_sgd(
    net: nn.Module, dataset: Dataset, config: Mapping[str, Any], words: Sequence[int]
) -> LocalTraining:
    """``local-epochs`` epochs of SGD on ``dataset`` in ``batch-size`` batches, order fixed by
    ``words``; ``lr``, ``momentum``, ``weight-decay`` (0 if absent) and ``grad-clip`` (max
    L2 norm of the whole gradient; 0 or absent: none) from ``config``.
    Cross-entropy over any logits shape (every position for text).

    ``net`` is trained in place on :func:`torch_device`: like ``nn.Module.to``, this moves
    the caller's module there, and it stays there (read its weights with ``.cpu()``).  It
    ends in eval mode with its BatchNorm running statistics re-estimated for its final
    weights on ``dataset`` (:func:`refresh_batchnorm`, one more forward pass without
    gradients), so that every reply, and every model judged in eval mode, carries the
    statistics of its own weights."""
    device = torch_device()
    net.to(device).train()
    optimizer = sgd(net.parameters(), config)
    criterion = nn.CrossEntropyLoss()
    loader = seeded_loader(dataset, int(config["batch-size"]), words)
    max_norm = float(config.get("grad-clip", 0.0))
    loss_sum, seen = 0.0, 0
    for _ in range(int(config["local-epochs"])):
        for inputs, targets in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(*flatten_logits(net(inputs.to(device)), targets.to(device)))
            loss.backward()
            clip_gradients(net.parameters(), max_norm)
            optimizer.step()
            loss_sum += float(loss.detach()) * len(targets)
            seen += len(targets)
    calibrated = refresh_batchnorm(net, dataset, int(config["batch-size"]))
    net.eval()
    return LocalTraining(loss_sum / max(seen, 1), seen, calibrated)


def held_out_metrics(
    net: nn.Module, dataset: Dataset, calibration: Dataset | None = None
) -> dict[str, float | int]:
    """``net``'s loss and accuracy on ``dataset`` (a client's test split) as reply metrics:
    ``num-examples``, ``correct``, ``loss-sum``, ``loss`` and ``accuracy``.

    With ``calibration`` (the client's training split), ``net``'s BatchNorm statistics are
    first re-estimated on it for the received weights (:func:`refresh_batchnorm`): a
    FedAvg aggregate carries the mean of statistics the clients computed for their own
    local weights, not for the mean of those weights.  FedorAS's federated path scoring
    does the same (BN recalibrated on local training batches)."""
    if calibration is not None:
        refresh_batchnorm(net, calibration)
    device = torch_device()
    net.to(device).eval()
    result = evaluate(net, ordered_loader(dataset), device)
    return {
        "num-examples": result.count,
        "correct": result.correct,
        "loss-sum": result.loss_sum,
        "loss": result.loss,
        "accuracy": result.accuracy,
    }


@dataclass(frozen=True)
class LrProbe:
    """What `probe_lr` found: the learning rate it kept (``lr``), the one configured, the
    loss bound, the probe steps per rate (0: not probed, the untrained loss already above
    the bound), and for each rate it tried (the configured one first, then halved) the
    highest training loss of its probe steps, up to the first one above the bound."""

    lr: float
    configured: float
    bound: float
    steps: int
    tried: tuple[tuple[float, float], ...]

    def summary(self) -> dict[str, Any]:
        """The result document's ``lr-probe`` entry."""
        return {
            "configured": self.configured,
            "lr": self.lr,
            "bound": self.bound,
            "steps": self.steps,
            "tried": [{"lr": lr, "max-loss": loss} for lr, loss in self.tried],
        }


def probe_lr(
    make_net: Callable[[], nn.Module],
    dataset: Dataset,
    config: Mapping[str, Any],
    words: Sequence[int],
    *,
    num_classes: int,
    steps: int = 48,
    halvings: int = 5,
    bound_factor: float = 2.0,
) -> LrProbe:
    """The largest of ``config["lr"]``, its half, its quarter, ... (``halvings`` times at
    most) at which ``steps`` SGD steps from a fresh ``make_net()`` on ``dataset`` never
    raise the training loss above ``bound_factor`` x ln(``num_classes``), the loss of an
    untrained net's uniform guess; the smallest tried where none holds. A rate stops at
    its first loss above the bound (its recorded highest loss is that one). A net whose
    loss before any update is already above the bound cannot be judged: the configured
    rate is kept, with ``steps`` 0 and that loss as the one entry of ``tried``.

    The rule of issue 40 (``benchmarks/lr_stability.py`` measures it): a rate whose first
    updates throw the loss far above the uniform guess is the one that leaves a net at
    chance on a dataset harder than the one it was chosen on (the ConvNet at lr 0.05 with
    momentum 0.9: MNIST recovers, 32x32 shapes never do). A guard against that blow-up,
    not a proof of stability: a rate can keep its first steps bounded and diverge later.
    Same net, data and ``words``, same choice (the batches are drawn from the stream
    ``words``, on the CPU or :func:`torch_device`).

    ``config``: ``lr``, ``momentum``, ``weight-decay`` (as :func:`sgd`), ``batch-size`` and
    optionally ``grad-clip`` (a max gradient norm, as :func:`clip_gradients`); ``dataset``:
    data the caller may train on (the server's slice).
    """
    if steps < 1 or halvings < 0 or bound_factor <= 0 or num_classes < 2:
        raise ValueError(
            f"probe_lr: steps = {steps} (>= 1), halvings = {halvings} (>= 0), "
            f"bound_factor = {bound_factor} (> 0), num_classes = {num_classes} (>= 2)"
        )
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise ValueError("probe_lr: the probe's dataset is empty")
    device = torch_device()
    bound = bound_factor * float(np.log(num_classes))
    configured = float(config["lr"])
    criterion = nn.CrossEntropyLoss()
    max_norm = float(config.get("grad-clip", 0.0))
    tried: list[tuple[float, float]] = []
    for k in range(halvings + 1):
        lr = configured / 2**k
        net = make_net().to(device).train()
        optimizer = sgd(net.parameters(), {**config, "lr": lr})
        highest, done = 0.0, 0
        while done < steps:
            for inputs, targets in seeded_loader(dataset, int(config["batch-size"]), words):
                optimizer.zero_grad(set_to_none=True)
                loss = criterion(*flatten_logits(net(inputs.to(device)), targets.to(device)))
                loss.backward()
                clip_gradients(net.parameters(), max_norm)
                optimizer.step()
                value = float(loss.detach())
                if done == 0 and value > bound:  # before any update: no rate can pass
                    return LrProbe(configured, configured, bound, 0, ((configured, value),))
                highest = max(highest, value if np.isfinite(value) else float("inf"))
                done += 1
                if done == steps or highest > bound:
                    break
            if highest > bound:
                break
        tried.append((lr, highest))
        if highest <= bound:
            return LrProbe(lr, configured, bound, steps, tuple(tried))
    return LrProbe(tried[-1][0], configured, bound, steps, tuple(tried))
