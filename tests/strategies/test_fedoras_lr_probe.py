"""FedorAS's Stage-1 lr probe (``fedoras.lr-probe``, issue 40): the supernet stepped on a
fresh random path per step (``SampledPaths``), the run's settings with the rate it keeps."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from fedorasflwr.config import bound_settings, parse_run_config
from fedorasflwr.methods.fedoras.runner import probed_supernet_recipe
from fedorasflwr.runs import build_supernet
from fedorasflwr.search_spaces import SampledPaths, build_space
from fedorasflwr.seeding import numpy_generator
from tests.runconfig import pyproject_run_config, tiny_fedoras

#: tests.runconfig.tiny_fedoras leaves the probe off
ON = {"fedoras.lr-probe": True}

WORDS = (3, 4)


def test_each_forward_runs_the_next_seeded_path_and_a_copy_replays_them():
    torch.manual_seed(0)
    image = {"num_classes": 10, "in_channels": 1, "input_height": 28, "input_width": 28}
    space = build_space("cnn_s", width=0.25, **image).eval()
    sampler = SampledPaths(space, numpy_generator(WORDS))
    replay = copy.deepcopy(sampler)  # what probe_lr's fresh net per rate is
    rng = numpy_generator(WORDS)
    paths = [space.sample_path(rng) for _ in range(4)]
    assert len(set(paths)) > 1  # the steps do not all run one path
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        for path in paths:
            expected = space(x, path)
            assert torch.equal(sampler(x), expected)
            assert torch.equal(replay(x), expected)


def test_the_probe_is_a_run_config_flag_on_by_default():
    assert parse_run_config(pyproject_run_config()).method_settings.lr_probe is True
    config = pyproject_run_config() | {"fedoras.lr-probe": False}
    assert parse_run_config(config).method_settings.lr_probe is False
    with pytest.raises(ValueError, match="'fedoras.lr-probe' = 'yes'"):
        parse_run_config(pyproject_run_config() | {"fedoras.lr-probe": "yes"})


def test_a_stage1_rate_that_blows_up_is_halved_and_only_the_rate_changes(data_cache):
    """lr 3.2 with momentum 0.9 throws the supernet's loss far above 2 ln 10 on MNIST-5k's
    server slice: the probe halves it; the settings it returns differ in Stage 1's lr only,
    and the supernet it probed is left as it was."""
    settings = parse_run_config(tiny_fedoras(data_cache, **{**ON, "fedoras.lr": 3.2}))
    space = build_supernet(settings)
    before = copy.deepcopy(space.state_dict())
    probed, probe = probed_supernet_recipe(settings, space)
    assert probe is not None and probe.configured == 3.2 and probe.steps == 48
    assert probe.lr < 3.2 and [lr for lr, _ in probe.tried][0] == 3.2
    train = settings.method_settings.train
    assert probed.method_settings == replace(
        settings.method_settings, train=replace(train, lr=probe.lr)
    )
    assert probed.values == settings.values  # the run config as given: the checkpoint's binding
    for key, value in space.state_dict().items():
        assert torch.equal(value, before[key])
    assert probed_supernet_recipe(settings, space)[1] == probe  # same seed, same choice


def test_off_or_without_a_server_slice_the_settings_are_as_given(data_cache):
    off = parse_run_config(tiny_fedoras(data_cache, **{"fedoras.lr-probe": False}))
    assert probed_supernet_recipe(off, build_supernet(off)) == (off, None)
    no_slice = parse_run_config(tiny_fedoras(data_cache, **{**ON, "data.server-fraction": 0.0}))
    probed, probe = probed_supernet_recipe(no_slice, build_supernet(no_slice))
    assert probe is None and probed.method_settings.train == no_slice.method_settings.train


def test_the_probe_off_binds_a_checkpoint_as_before_the_key_existed():
    """A FedorAS checkpoint written before ``fedoras.lr-probe`` trained Stage 1 at lr as
    given: a resume with the probe off binds without the key; the default binds it, so such
    a checkpoint is refused naming the key."""
    off = parse_run_config(pyproject_run_config() | {"fedoras.lr-probe": False})
    on = parse_run_config(pyproject_run_config())
    assert "fedoras.lr-probe" not in bound_settings("fedoras", off.values)
    assert bound_settings("fedoras", on.values)["fedoras.lr-probe"] is True


def test_a_server_slice_the_caller_loaded_is_the_one_probed(data_cache):
    """``run_fedoras`` loads the server's slice once and hands it to the probe: the same
    choice as the probe's own load, and a different slice is what it steps on."""
    from fedorasflwr.data import load_server_data

    settings = parse_run_config(tiny_fedoras(data_cache, **{**ON, "fedoras.lr": 3.2}))
    space = build_supernet(settings)
    server = load_server_data(settings.data)
    assert probed_supernet_recipe(settings, space, server) == probed_supernet_recipe(
        settings, space
    )
    half = torch.utils.data.TensorDataset(*(t[: len(server) // 2] for t in server.tensors))
    other = probed_supernet_recipe(settings, space, half)[1]
    assert other is not None and other.tried != probed_supernet_recipe(settings, space)[1].tried
