"""FedorAS client: Stage-1 local supernet training (paper §3.1, Eq. 3-4).

Per batch the client samples one path of the subspace it received within its
tier's FLOPs budget and takes one SGD step on it, counting the samples that
went through each option.  It returns the fixed parts and the options it
touched, with those counts, for OPA.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from torch import nn

from ..costs import training_flops
from ..data import ClientData
from ..protocol import ARRAYS, METRICS, space_from_config
from ..search_spaces import SearchSpace, build_space
from .training import flatten_logits, seeded_loader, torch_device

__all__ = ["load_supernet", "train_supernet"]


def load_supernet(config: Mapping[str, Any], arrays: ArrayRecord) -> SearchSpace:
    """Build the supernet named in ``config`` and load the (partial) ``arrays`` into it."""
    space = build_space(**space_from_config(config))
    state = arrays.to_torch_state_dict()
    unknown = set(state) - set(space.state_dict())
    if unknown:
        raise ValueError(
            f"received {len(unknown)} key(s) unknown to the supernet, e.g. {sorted(unknown)[0]!r}"
        )
    space.load_state_dict(state, strict=False)
    return space


def train_supernet(content: RecordDict, data: ClientData, partition_id: int) -> RecordDict:
    """Run the local Stage-1 epochs described by ``content``'s config; return the reply."""
    config: ConfigRecord = content.config_records["config"]
    space = load_supernet(config, content.array_records[ARRAYS])
    subspace = space.subspace_from_mask([int(v) for v in config["subspace-mask"]])
    max_flops = float(config["max-flops"])
    words = (int(config["seed"]), int(config["server-round"]), partition_id)
    rng = np.random.default_rng(words)
    device = torch_device()
    space.to(device).train()
    optimizer = torch.optim.SGD(
        space.parameters(),
        lr=float(config["lr"]),
        momentum=float(config["momentum"]),
        weight_decay=float(config["weight-decay"]),
    )
    criterion = nn.CrossEntropyLoss()
    offsets = np.cumsum([0, *space.num_options()])
    counts = np.zeros(offsets[-1], dtype=np.int64)
    loss_sum, examples, flops = 0.0, 0, 0
    loader = seeded_loader(data.train, int(config["batch-size"]), words)
    for _ in range(int(config["local-epochs"])):
        for inputs, targets in loader:
            path = space.sample_path(rng, max_flops=max_flops, subspace=subspace)
            optimizer.zero_grad(set_to_none=True)
            logits, flat = flatten_logits(space(inputs.to(device), path), targets.to(device))
            loss = criterion(logits, flat)
            loss.backward()
            optimizer.step()
            batch = int(inputs.shape[0])
            counts[offsets[:-1] + np.asarray(path)] += batch
            loss_sum += float(loss.detach()) * batch
            examples += batch
            flops += training_flops(space.cost(path).flops, batch)
    keys = set(space.fixed_keys())
    for layer, size in enumerate(space.num_options()):
        for option in range(size):
            if counts[offsets[layer] + option] > 0:
                keys.update(space.op_keys(layer, option))
    state = {k: v.detach().cpu() for k, v in space.state_dict().items() if k in keys}
    metrics = MetricRecord(
        {
            "num-examples": examples,
            "train-loss": loss_sum / max(examples, 1),
            "train-flops": flops,
            "option-counts": counts.tolist(),
        }
    )
    return RecordDict({ARRAYS: ArrayRecord(state), METRICS: metrics})
