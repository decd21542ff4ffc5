"""Width-scaled sub-models and slice aggregation, against hand-computed arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedorasflwr.search_spaces.widths import (
    aggregate_slices,
    parse_widths,
    sub_arrays,
    width_costs,
    width_net,
    width_shapes,
)

MNIST = {"num_classes": 10, "in_channels": 1, "input_height": 28, "input_width": 28}


def test_slices_are_averaged_over_the_clients_that_hold_them() -> None:
    # a 2x3 weight and a 3-vector; client a (width 1, 1 example) holds all,
    # client b (2 examples) the leading 1x2 / 2, client c (1 example) the leading 2x2 / 2
    global_arrays = {"w": np.full((2, 3), 9.0, dtype=np.float32), "b": np.full(3, 9.0)}
    a = {"w": np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), "b": np.array([1.0, 2.0, 3.0])}
    b = {"w": np.array([[10.0, 20.0]]), "b": np.array([10.0, 20.0])}
    c = {"w": np.array([[0.0, 0.0], [8.0, 8.0]]), "b": np.array([0.0, 0.0])}
    out = aggregate_slices(global_arrays, [(a, 1.0, 1), (b, 0.5, 2), (c, 0.66, 1)])
    # w[0,0]: (1*1 + 2*10 + 1*0) / 4 = 5.25; w[0,1]: (2 + 40 + 0) / 4 = 10.5
    # w[0,2]: only a -> 3; w[1,0]: (4 + 8) / 2 = 6; w[1,1]: (5 + 8) / 2 = 6.5; w[1,2]: 6
    np.testing.assert_allclose(out["w"], [[5.25, 10.5, 3.0], [6.0, 6.5, 6.0]])
    np.testing.assert_allclose(out["b"], [5.25, 10.5, 3.0])
    assert out["w"].dtype == np.float32


def test_entries_nobody_trained_keep_their_global_value() -> None:
    global_arrays = {"w": np.arange(6.0).reshape(2, 3), "n": np.array(7.0)}
    small = {"w": np.array([[4.0]]), "n": np.array(1.0)}
    out = aggregate_slices(global_arrays, [(small, 0.25, 3)])
    np.testing.assert_array_equal(out["w"], [[4.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
    assert float(out["n"]) == 1.0  # a scalar is held by every client
    np.testing.assert_array_equal(global_arrays["w"], np.arange(6.0).reshape(2, 3))
    assert aggregate_slices(global_arrays, [])["w"].tolist() == global_arrays["w"].tolist()


@pytest.mark.parametrize(
    "update, words",
    [
        ({"w": np.zeros((3, 1))}, "leading corner"),
        ({"w": np.zeros(2)}, "leading corner"),
        ({"v": np.zeros((1, 1))}, "names differ"),
    ],
)
def test_a_misshapen_update_is_refused(update, words) -> None:
    with pytest.raises(ValueError, match=words):
        aggregate_slices({"w": np.zeros((2, 2))}, [(update, 0.5, 1)])


def test_a_bad_width_or_weight_is_refused() -> None:
    arrays = {"w": np.zeros((1, 1))}
    with pytest.raises(ValueError, match="width"):
        aggregate_slices({"w": np.zeros((2, 2))}, [(arrays, 1.5, 1)])
    with pytest.raises(ValueError, match="num_examples"):
        aggregate_slices({"w": np.zeros((2, 2))}, [(arrays, 0.5, 0)])


def test_the_sub_model_is_the_leading_corner_of_the_full_one() -> None:
    full = width_net(MNIST, 1.0)
    shapes = width_shapes(MNIST, 0.5)
    assert shapes["blocks.0.conv.weight"] == (16, 1, 3, 3)  # input channels whole
    assert shapes["blocks.1.conv.weight"] == (16, 16, 3, 3)
    assert shapes["classifier.weight"][0] == 10  # classes whole
    arrays = {k: v.numpy() for k, v in full.state_dict().items()}
    small = width_net(MNIST, 0.5)
    small.load_state_dict({k: torch.from_numpy(v) for k, v in sub_arrays(arrays, shapes).items()})
    # the corner cut: the sub-model's first conv is the full one's first 16 filters
    np.testing.assert_array_equal(
        small.state_dict()["blocks.0.conv.weight"].numpy(), arrays["blocks.0.conv.weight"][:16]
    )
    # and the classifier's columns are the leading channels' features (channel-major)
    x = torch.randn(2, 1, 28, 28)
    small.eval()
    assert small(x).shape == (2, 10)


def test_width_one_round_trips_and_costs_grow_with_width() -> None:
    arrays = {k: v.numpy() for k, v in width_net(MNIST, 1.0).state_dict().items()}
    back = aggregate_slices(arrays, [(sub_arrays(arrays, width_shapes(MNIST, 1.0)), 1.0, 5)])
    for name, value in arrays.items():
        np.testing.assert_allclose(back[name], value, rtol=1e-6)
    small, large = width_costs(MNIST, 0.25), width_costs(MNIST, 1.0)
    assert 0 < small["macs"] < large["macs"] and small["flops"] == 2 * small["macs"]
    assert 0 < small["params"] < large["params"]


def test_width_ladders_are_checked() -> None:
    assert parse_widths("0.25, 0.5,1.0", "x.widths") == (0.25, 0.5, 1.0)
    for bad in ("0.5,0.25", "0,1", "1.5", "a,b", ""):
        with pytest.raises(ValueError, match="x.widths"):
            parse_widths(bad, "x.widths")
    with pytest.raises(ValueError, match="width"):
        width_net(MNIST, 1.5)
