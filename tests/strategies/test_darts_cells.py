"""Is the normal cell searched? FedNAS's and DP-FNAS's quick presets derived the same
normal half: their 1-cell net has a reduction cell only, so ``alpha_normal`` never gets a
gradient and its half of the genotype is the seeded initial alphas'. A net with both cells
moves both alphas, and each half is derived from its own."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedorasflwr.methods.fednas.client import search_supernet
from fedorasflwr.methods.fednas.summary import summary
from fedorasflwr.protocol import ARRAYS, CONFIG, space_to_config
from fedorasflwr.search_spaces import build_space
from fedorasflwr.search_spaces.darts import (
    derive_genotype,
    searched_cells,
    unsearched_lines,
    unsearched_note,
)

NORMAL, REDUCE = "net.alpha_normal", "net.alpha_reduce"


def _searched(cells: int, client_data) -> tuple[dict, dict]:
    """One local FedNAS search epoch (the real client code) of a ``cells``-cell space on
    MNIST digits (the stem halves them to 14 px, as the presets'): the alphas before and after."""
    torch.manual_seed(0)
    space = build_space(
        "darts", channels=2, cells=cells, input_height=28, input_width=28, stem_stride=2
    )
    before = {k: v.clone() for k, v in space.state_dict().items()}
    config = {
        "seed": 0,
        "server-round": 1,
        "local-epochs": 1,
        "batch-size": 64,
        "lr": 0.05,
        "momentum": 0.9,
        "weight-decay": 0.0,
        "arch-lr": 0.05,
        "arch-weight-decay": 0.0,
        "mixed-flops": 1,
        **space_to_config(space.spec),
    }
    content = RecordDict({ARRAYS: ArrayRecord(space.state_dict()), CONFIG: ConfigRecord(config)})
    reply = search_supernet(content, client_data, partition_id=0)
    return before, reply.array_records[ARRAYS].to_torch_state_dict()


def test_a_three_cell_search_moves_both_alphas(client_data) -> None:
    assert searched_cells(3) == ("normal", "reduce") and unsearched_note(3) == ""
    before, after = _searched(3, client_data)
    for key in (NORMAL, REDUCE):
        assert (after[key] - before[key]).abs().max() > 1e-3, key  # init is 1e-3 x N(0, 1)


def test_the_quick_presets_one_cell_net_has_no_normal_cell_to_search(client_data) -> None:
    # the finding: no gradient reaches alpha_normal, so its half is the initial alphas'
    assert searched_cells(1) == searched_cells(2) == ("reduce",)
    before, after = _searched(1, client_data)
    assert torch.equal(after[NORMAL], before[NORMAL])
    assert (after[REDUCE] - before[REDUCE]).abs().max() > 1e-3
    # and the summary says so beside the genotype
    space = {"spec": {"name": "darts", "cells": 1}}
    lines = summary({"genotype": "g", "space": space})
    assert lines[1] == unsearched_note(1) and lines[1].startswith("normal cell: none in this")
    assert unsearched_lines({"spec": {"name": "darts", "cells": 3}}) == []
    assert unsearched_lines({"spec": {"name": "my_space"}}) == []


def test_each_half_is_derived_from_its_own_alphas() -> None:
    generator = torch.Generator().manual_seed(1)
    normal, reduce = (torch.randn(14, 8, generator=generator) for _ in range(2))
    first = derive_genotype(normal, reduce)
    moved = derive_genotype(normal, torch.randn(14, 8, generator=generator))
    assert moved.normal == first.normal and moved.reduce != first.reduce
    moved = derive_genotype(torch.randn(14, 8, generator=generator), reduce)
    assert moved.reduce == first.reduce and moved.normal != first.normal
    assert derive_genotype(reduce, normal) == type(first)(first.reduce, first.normal)
