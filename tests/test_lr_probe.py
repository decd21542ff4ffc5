"""``training.probe_lr`` (issue 40 item 4): the largest of the configured learning rate and
its halvings whose first SGD steps keep the loss within 2 x ln(classes), checked on a
linear classifier whose first step is computed by hand, and on a net that diverges."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from fedorasflwr.training import probe_lr

WORDS = (0, 1)


def _config(lr: float, batch: int = 4) -> dict[str, float | int]:
    return {"lr": lr, "momentum": 0.0, "weight-decay": 0.0, "batch-size": batch}


def _two_points(scale: float) -> TensorDataset:
    """Two samples, one a class: x = +scale (class 1) and -scale (class 0), one feature."""
    return TensorDataset(torch.tensor([[scale], [-scale]]), torch.tensor([1, 0]))


def _zero_linear() -> nn.Module:
    net = nn.Linear(1, 2, bias=False)
    nn.init.zeros_(net.weight)
    return net


def test_first_step_by_hand_decides_the_rate():
    """A zero linear classifier on x = +-s, one full batch a step: the first loss is ln 2
    for every rate; plain SGD moves each logit by lr * s^2 / 2 toward the right class, so
    the second loss is softplus(-lr * s^2) (margin lr * s^2 between the two logits): it
    never exceeds ln 2, and every rate is kept at once."""
    data = _two_points(3.0)
    probe = probe_lr(_zero_linear, data, _config(1.0), WORDS, num_classes=2, steps=2)
    assert probe.lr == 1.0 and probe.configured == 1.0
    assert probe.bound == pytest.approx(2 * math.log(2))
    ((lr, highest),) = probe.tried
    assert lr == 1.0 and highest == pytest.approx(math.log(2))
    # the next step's loss, by hand, is the one a direct computation gives
    net = _zero_linear()
    optimizer = torch.optim.SGD(net.parameters(), lr=1.0)
    loss = nn.functional.cross_entropy(net(data.tensors[0]), data.tensors[1])
    loss.backward()
    optimizer.step()
    second = nn.functional.cross_entropy(net(data.tensors[0]), data.tensors[1])
    assert float(second.detach()) == pytest.approx(math.log1p(math.exp(-9.0)), rel=1e-3)


class _Overshoot(nn.Module):
    """Logits (0, w * x) with one weight w (start 0), and a constant ``push`` added to w's
    gradient at each step (a tensor hook): the cross-entropy's own gradient at w = 0 is 0 on
    x = 1 with labels 0 and 1, so the first step moves w to -lr * push."""

    def __init__(self, push: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))
        self.w.register_hook(lambda grad: grad + push)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logit = self.w * x[:, 0]
        return torch.stack([torch.zeros_like(logit), logit], dim=1)


def test_halves_until_the_loss_stays_bounded():
    """After the first step w = -lr * push, so the second loss is (softplus(w) +
    softplus(-w)) / 2, about lr * push / 2: with push 40 and the bound 2 ln 2 = 1.39, lr 1
    gives about 20, 0.5 about 10, ..., 0.0625 about 1.3 (computed exactly below); the
    probe keeps the first rate under the bound, and records each one's highest loss."""
    data = TensorDataset(torch.ones(2, 1), torch.tensor([0, 1]))
    make = lambda: _Overshoot(40.0)  # noqa: E731

    def second_loss(lr: float) -> float:
        w = -lr * 40.0
        return (math.log1p(math.exp(w)) + math.log1p(math.exp(-w))) / 2

    probe = probe_lr(make, data, _config(1.0, batch=2), WORDS, num_classes=2, steps=2)
    bound = 2 * math.log(2)
    expected = next(1.0 / 2**k for k in range(6) if second_loss(1.0 / 2**k) <= bound)
    assert probe.lr == expected
    assert [lr for lr, _ in probe.tried] == [1.0 / 2**k for k in range(len(probe.tried))]
    for lr, highest in probe.tried:
        assert highest == pytest.approx(max(math.log(2), second_loss(lr)), rel=1e-5)
    assert all(h > bound for _, h in probe.tried[:-1]) and probe.tried[-1][1] <= bound
    summary = probe.summary()
    assert summary["lr"] == expected and summary["configured"] == 1.0
    assert [t["lr"] for t in summary["tried"]] == [lr for lr, _ in probe.tried]


def test_no_rate_holds_gives_the_smallest_tried():
    data = TensorDataset(torch.ones(2, 1), torch.tensor([0, 1]))
    probe = probe_lr(
        lambda: _Overshoot(1e6), data, _config(1.0, batch=2), WORDS, num_classes=2, halvings=2
    )
    assert probe.lr == 0.25 and [lr for lr, _ in probe.tried] == [1.0, 0.5, 0.25]
    assert all(highest > probe.bound for _, highest in probe.tried)


def test_same_inputs_same_choice_and_the_net_given_is_untouched():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))
    before = copy.deepcopy(net.state_dict())
    torch.manual_seed(1)
    data = TensorDataset(2 * torch.randn(40, 3, 2, 2), torch.randint(0, 3, (40,)))
    config = {**_config(2.0, batch=8), "momentum": 0.9}
    first = probe_lr(lambda: copy.deepcopy(net), data, config, WORDS, num_classes=3)
    again = probe_lr(lambda: copy.deepcopy(net), data, config, WORDS, num_classes=3)
    assert first == again
    assert first.lr < 2.0 and first.steps == 48  # lr 2, momentum 0.9: the first steps blow up
    for key, value in net.state_dict().items():
        assert torch.equal(value, before[key])


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"steps": 0}, "steps = 0"),
        ({"halvings": -1}, "halvings = -1"),
        ({"num_classes": 1}, "num_classes = 1"),
    ],
)
def test_bad_arguments_are_named(kwargs, named):
    options = {"num_classes": 2, **kwargs}
    with pytest.raises(ValueError, match=named):
        probe_lr(_zero_linear, _two_points(1.0), _config(0.1), WORDS, **options)


def test_an_empty_slice_is_refused():
    empty = TensorDataset(torch.zeros(0, 1), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="empty"):
        probe_lr(_zero_linear, empty, _config(0.1), WORDS, num_classes=2)


def test_a_non_finite_loss_counts_as_above_the_bound():
    """A step that makes the loss NaN (w pushed to -inf) is recorded as inf, above the bound,
    and the next rate is tried."""
    data = TensorDataset(torch.ones(2, 1), torch.tensor([0, 1]))
    probe = probe_lr(
        lambda: _Overshoot(float("inf")),
        data,
        _config(1.0, batch=2),
        WORDS,
        num_classes=2,
        halvings=1,
    )
    assert [highest for _, highest in probe.tried] == [float("inf"), float("inf")]
    assert probe.lr == 0.5


def test_a_net_already_above_the_bound_is_not_probed():
    """Before any update the loss is the same at every rate: a net that starts above the
    bound would fail them all, so the configured rate is kept and the probe says so."""
    wrong = TensorDataset(torch.tensor([[10.0], [-10.0]]), torch.tensor([0, 1]))

    def confident_and_wrong() -> nn.Module:
        net = nn.Linear(1, 2, bias=False)
        with torch.no_grad():
            net.weight.copy_(torch.tensor([[-1.0], [1.0]]))  # logit margin 20, wrong class
        return net

    probe = probe_lr(confident_and_wrong, wrong, _config(1.0), WORDS, num_classes=2)
    assert probe.lr == probe.configured == 1.0 and probe.steps == 0
    ((lr, first),) = probe.tried
    assert lr == 1.0 and first == pytest.approx(20.0, rel=1e-3) and first > probe.bound


def test_the_probe_clips_its_steps_as_the_stage_does():
    """``grad-clip`` c: w's first gradient is ``push`` (40), clipped to c = 1, so the first
    step moves w to -lr (not -40 lr) and the second loss is (softplus(-1) + softplus(1)) / 2
    = 0.813 at lr 1, under the bound 2 ln 2: lr 1 is kept, where unclipped it is halved."""
    data = TensorDataset(torch.ones(2, 1), torch.tensor([0, 1]))
    make = lambda: _Overshoot(40.0)  # noqa: E731
    config = {**_config(1.0, 2), "grad-clip": 1.0}
    clipped = probe_lr(make, data, config, WORDS, num_classes=2, steps=2)
    ((lr, highest),) = clipped.tried
    by_hand = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(1.0))) / 2
    assert lr == clipped.lr == 1.0 and highest == pytest.approx(by_hand, rel=1e-5)
    config = {**config, "grad-clip": 0.0}
    unclipped = probe_lr(make, data, config, WORDS, num_classes=2, steps=2)
    assert unclipped.lr < 1.0
