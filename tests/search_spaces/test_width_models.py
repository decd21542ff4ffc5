"""A width-scalable model of the user's (issue 43): its slices checked shape by shape, its
costs counted by hand, and the robust slice-wise aggregation against hand-computed arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedorasflwr.federation.aggregation import Aggregation
from fedorasflwr.search_spaces.widths import aggregate_slices, model_costs, width_model_shapes


class Signal(nn.Module):
    """Conv1d(1 -> c1, k5) BN ReLU, Conv1d(c1 -> c2, k5) ReLU, average pool, Linear(c2, 3);
    ``extra``: classifier inputs added below width 1 (no slice of the full model)."""

    def __init__(self, width: float, extra: int = 0) -> None:
        super().__init__()
        c1, c2 = max(1, round(8 * width)), max(1, round(16 * width))
        self.conv1 = nn.Conv1d(1, c1, 5, padding=2)
        self.bn1 = nn.BatchNorm1d(c1)
        self.conv2 = nn.Conv1d(c1, c2, 5, padding=2)
        self.fc = nn.Linear(c2 + (extra if width < 1 else 0), 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return self.fc(x.mean(-1))


def test_every_width_is_checked_to_be_a_leading_corner() -> None:
    shapes = width_model_shapes(Signal, [0.25, 0.5])
    assert sorted(shapes) == [0.25, 0.5, 1.0]
    assert shapes[0.5]["conv2.weight"] == (8, 4, 5)  # the leading 8 of 16 filters, 4 of 8 inputs
    assert shapes[1.0]["conv2.weight"] == (16, 8, 5)
    assert shapes[0.25]["fc.weight"] == (3, 4)  # the classes whole
    with pytest.raises(ValueError) as caught:
        width_model_shapes(lambda w: Signal(w, extra=20), [0.5])
    assert str(caught.value).startswith(
        "model_fn(0.5)'s 'fc.weight' has shape (3, 28), not a leading corner of "
        "model_fn(1.0)'s (3, 16)"
    )


def test_other_names_another_rank_or_no_module_are_refused() -> None:
    def renamed(width: float) -> nn.Module:
        net = Signal(width)
        if width < 1:
            net.head = nn.Linear(1, 1)
        return net

    with pytest.raises(ValueError, match=r"model_fn\(0.5\) has tensors \['head.bias'"):
        width_model_shapes(renamed, [0.5])

    def flattened(width: float) -> nn.Module:
        net = Signal(width)
        if width < 1:
            net.fc.weight = nn.Parameter(torch.zeros(24))
        return net

    with pytest.raises(ValueError, match=r"'fc.weight' has shape \(24,\), not a leading corner"):
        width_model_shapes(flattened, [0.5])
    with pytest.raises(ValueError, match=r"model_fn\(1.0\) returned a dict, not an nn.Module"):
        width_model_shapes(lambda w: {}, [0.5])
    with pytest.raises(ValueError, match="width must be in"):
        width_model_shapes(Signal, [1.5])


def test_costs_are_counted_on_the_users_model() -> None:
    for width, (c1, c2) in {1.0: (8, 16), 0.5: (4, 8)}.items():
        costs = model_costs(Signal(width), width, (1, 64))
        # MACs: conv1 64 positions x c1 filters x 5 taps; conv2 64 x c2 x c1 x 5; fc c2 x 3
        macs = 64 * c1 * 5 + 64 * c2 * c1 * 5 + c2 * 3
        params = (c1 * 5 + c1) + 2 * c1 + (c2 * c1 * 5 + c2) + (3 * c2 + 3)
        assert costs == {"width": width, "flops": 2 * macs, "macs": macs, "params": params}
    net = Signal(1.0).train()
    model_costs(net, 1.0, (1, 64))
    assert net.training  # measured in eval mode, the mode given back


def test_median_and_trimmed_mean_over_each_entrys_holders_by_hand() -> None:
    # a 2x3 weight and a count; a (width 1) holds all, b the leading 1x2, c the leading 2x2
    global_arrays = {"w": np.full((2, 3), 9.0, dtype=np.float32), "n": np.array(7)}
    a = {"w": np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), "n": np.array(1)}
    b = {"w": np.array([[10.0, 20.0]]), "n": np.array(3)}
    c = {"w": np.array([[0.0, 0.0], [8.0, 8.0]]), "n": np.array(4)}
    updates = [(a, 1.0, 1), (b, 0.5, 50), (c, 0.66, 1)]
    median = aggregate_slices(global_arrays, updates, Aggregation("median"))
    # w[0, :2]: held by a, b, c -> median(1, 10, 0) = 1, median(2, 20, 0) = 2;
    # w[1, :2]: a, c -> (4 + 8) / 2, (5 + 8) / 2; w[:, 2]: a only; the counts are ignored
    np.testing.assert_array_equal(median["w"], [[1.0, 2.0, 3.0], [6.0, 6.5, 6.0]])
    assert median["w"].dtype == np.float32 and int(median["n"]) == 3
    # trim 0.34 of 3 values cuts int(1.02) = 1 at each end: the median; of 2 values: none
    trimmed = aggregate_slices(global_arrays, updates, Aggregation("trimmed-mean", 0.34))
    np.testing.assert_array_equal(trimmed["w"], median["w"])
    d = {"w": np.array([[100.0]]), "n": np.array(0)}
    four = aggregate_slices(global_arrays, [*updates, (d, 0.1, 1)], Aggregation("trimmed-mean"))
    # w[0, 0]: 1, 10, 0, 100, trim 0.2 of 4 cuts none: the mean 27.75; w[0, 1]: 3 values
    assert four["w"][0, 0] == np.float32(27.75) and four["w"][0, 1] == np.float32(22 / 3)


def test_a_robust_rule_keeps_the_entries_nobody_held() -> None:
    global_arrays = {"w": np.arange(6.0).reshape(2, 3)}
    out = aggregate_slices(
        global_arrays, [({"w": np.array([[4.0]])}, 0.25, 3)], Aggregation("median")
    )
    np.testing.assert_array_equal(out["w"], [[4.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
    np.testing.assert_array_equal(global_arrays["w"], np.arange(6.0).reshape(2, 3))
