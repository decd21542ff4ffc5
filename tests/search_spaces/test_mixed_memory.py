"""The DARTS-style mixed forward of ``benchmarks/fedoras_memory.py`` and its memory accounting."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from fedorasflwr.search_spaces import build_space

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "fedoras_memory.py"
_spec = importlib.util.spec_from_file_location("fedoras_memory", BENCHMARK)
fedoras_memory = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fedoras_memory)

TINY = {
    "cnn_l": {"input_height": 12, "input_width": 12, "width": 0.125, "layers_per_block": 2},
    "cnn_s": {"input_height": 20, "input_width": 17, "width": 0.5},
}


@pytest.fixture(params=sorted(TINY))
def space(request):
    torch.manual_seed(0)
    return build_space(request.param, **TINY[request.param])


def one_hot(space, arch):
    return [torch.eye(n)[o] for n, o in zip(space.num_options(), arch, strict=True)]


def inputs(space, batch=4):
    return torch.randn((batch, *space.input_shape), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("train", [False, True])
def test_one_hot_weights_give_the_single_path_forward(space, train):
    space.train(train)
    x = inputs(space)
    rng = np.random.default_rng(0)
    for _ in range(5):
        arch = space.sample_path(rng)
        with torch.no_grad():
            expected = space(x, arch)
            mixed = fedoras_memory.mixed_forward(space, x, one_hot(space, arch))
        torch.testing.assert_close(mixed, expected)


def test_mixed_forward_sums_every_option_and_trains_the_alphas(space):
    space.eval()
    x = inputs(space)
    alphas = fedoras_memory.ArchitectureWeights(space.num_options())
    weights = alphas()
    assert all(torch.allclose(w, torch.full_like(w, 1 / len(w))) for w in weights)
    mixed = fedoras_memory.mixed_forward(space, x, weights)
    # Uniform weights are not any single path.
    for arch in [
        (0,) * len(space.choices),
        (len(space.choices[0].options) - 1,) * len(space.choices),
    ]:
        assert not torch.allclose(mixed, space(x, arch), atol=1e-4)
    mixed.square().sum().backward()
    assert all(a.grad is not None and a.grad.abs().sum() > 0 for a in alphas.alphas)
    # Every option of every layer received a gradient (all of them ran).
    for choice in space.choices:
        layer = space.net.get_submodule(choice.name)
        for key in layer.option_keys:
            for p in layer.ops[key].parameters():
                assert p.grad is not None


def test_mixed_forward_rejects_wrong_weights_and_spaces(space):
    with pytest.raises(ValueError, match="weight vectors"):
        fedoras_memory.mixed_forward(
            space, inputs(space), one_hot(space, space.sample_path(np.random.default_rng(0)))[:-1]
        )
    rnn = build_space("rnn", vocab_size=20, seq_len=7, width=0.125)
    with pytest.raises(TypeError, match="cnn_l / cnn_s"):
        fedoras_memory.mixed_forward(rnn, torch.zeros(1, 7, dtype=torch.long), [])


def test_saved_activation_bytes_counts_each_storage_once():
    x = torch.randn(10, requires_grad=True)
    with fedoras_memory.saved_activation_bytes() as saved:
        y = x.exp()  # saves its result y
        (y * y).sum()  # saves y twice: counted once
    assert saved["bytes"] == 10 * 4
    weight = torch.nn.Parameter(torch.randn(3, 10))
    with fedoras_memory.saved_activation_bytes([weight]) as saved:
        weight @ x.exp()  # saves weight (excluded) and exp(x) (40 bytes); exp saves its result
    assert saved["bytes"] == 10 * 4


def test_mixed_saves_more_activations_than_any_single_path(space):
    space.train()
    x = inputs(space, batch=8)
    params = list(space.parameters())
    with fedoras_memory.saved_activation_bytes(params) as mixed:
        fedoras_memory.mixed_forward(
            space, x, fedoras_memory.ArchitectureWeights(space.num_options())()
        )
    largest = tuple(len(c.options) - 2 for c in space.choices)  # mbconv_k3_e2
    with fedoras_memory.saved_activation_bytes(params) as single:
        space(x, largest)
    assert 0 < single["bytes"] < mixed["bytes"] / 2
