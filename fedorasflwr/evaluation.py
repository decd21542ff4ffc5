"""Server-side validation of a supernet on the held-out slice no client trains on."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord
from torch.utils.data import Subset, TensorDataset

from .clients.training import evaluate, recalibrate_batchnorm, seeded_loader, torch_device
from .search_spaces import SearchSpace

__all__ = ["SupernetEvaluator"]


class SupernetEvaluator:
    """Accuracy of the supernet over a fixed set of random paths.

    The same ``num_paths`` uniformly sampled paths (fixed by ``seed``) are scored
    every time, so the curve over rounds compares like with like.  Before a path
    is scored its BatchNorm statistics are re-estimated on a calibration part
    of the server slice (``calibration_fraction``, seeded), and it is scored on
    the rest: the two parts are disjoint.  Returns the mean, min and max
    accuracy and the mean loss as a ``MetricRecord``.
    """

    def __init__(
        self,
        space: SearchSpace,
        dataset: TensorDataset,
        *,
        num_paths: int,
        seed: int,
        calibration_fraction: float = 0.2,
        batch_size: int = 256,
    ) -> None:
        self.space = space
        order = np.random.default_rng([seed, 11]).permutation(len(dataset))
        cut = max(1, int(round(calibration_fraction * len(dataset))))
        self.calibration = dataset.tensors[0][torch.as_tensor(order[:cut])].split(batch_size)
        scored = Subset(dataset, order[cut:].tolist())
        self.loader = seeded_loader(scored, batch_size, (seed,), shuffle=False)
        rng = np.random.default_rng([seed, 7])
        self.paths = [space.sample_path(rng) for _ in range(num_paths)]
        self.device = torch_device()

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        self.space.load_state_dict(arrays.to_torch_state_dict())
        self.space.to(self.device)
        results = []
        for path in self.paths:

            def forward(x, p=path):
                return self.space(x, p)

            recalibrate_batchnorm(self.space, forward, self.calibration, self.device)
            results.append(evaluate(forward, self.loader, self.device))
        accuracies = [r.accuracy for r in results]
        return MetricRecord(
            {
                "accuracy": float(np.mean(accuracies)),
                "accuracy-min": float(np.min(accuracies)),
                "accuracy-max": float(np.max(accuracies)),
                "loss": float(np.mean([r.loss for r in results])),
            }
        )
