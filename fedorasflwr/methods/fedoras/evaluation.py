"""Scoring paths of a supernet: BN recalibration, then accuracy on held-out data.

``score_paths`` is the one routine: the server uses it on its held-out slice
(``SupernetEvaluator`` during Stage 1, ``ServerPathScorer`` in the Stage-2
search) and clients use it on their validation split (federated scoring).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord
from torch import Tensor
from torch.utils.data import DataLoader, Subset, TensorDataset

from ...arrays import state_dict_of
from ...search_spaces import SearchSpace
from ...seeding import numpy_stream
from ...training import (
    EvalResult,
    evaluate,
    ordered_loader,
    recalibrate_batchnorm,
    torch_device,
)

__all__ = ["ServerPathScorer", "SupernetEvaluator", "score_paths"]


def score_paths(
    space: SearchSpace,
    paths: Sequence[Sequence[int]],
    loader: DataLoader,
    calibration: Sequence[Tensor] | None,
    device: torch.device,
) -> list[EvalResult]:
    """Loss and accuracy of each path with the supernet's current weights.

    With ``calibration`` batches, every path's BatchNorm statistics are first
    re-estimated on them (the weights are untouched; the statistics of the
    last path scored stay in ``space``: reload its state before training).
    """
    space.to(device)
    results = []
    for path in paths:

        def forward(x: Tensor, p: tuple[int, ...] = tuple(path)) -> Tensor:
            return space(x, p)

        if calibration is not None:
            recalibrate_batchnorm(space, forward, calibration, device)
        space.eval()
        results.append(evaluate(forward, loader, device))
    return results


class ServerPathScorer:
    """Scores paths on the server's held-out slice, split once into a calibration
    part (``calibration_fraction``, seeded) and a disjoint scored part."""

    def __init__(
        self,
        space: SearchSpace,
        dataset: TensorDataset,
        *,
        seed: int,
        recalibrate: bool = True,
        calibration_fraction: float = 0.2,
        batch_size: int = 256,
    ) -> None:
        if len(dataset) < 2:
            raise ValueError(
                "the server's held-out slice is empty: set run config "
                "'data.server-fraction' > 0 or score the search federated "
                "('fedoras.search-scoring' = \"federated\")"
            )
        self.space = space
        order = numpy_stream(seed, "server-scoring-slice").permutation(len(dataset))
        cut = max(1, int(round(calibration_fraction * len(dataset))))
        inputs = dataset.tensors[0][torch.as_tensor(order[:cut])]
        self.calibration = list(inputs.split(batch_size)) if recalibrate else None
        self.scored = Subset(dataset, order[cut:].tolist())  # disjoint from the calibration
        self.loader = ordered_loader(self.scored, batch_size)

    @property
    def device(self) -> torch.device:
        """Where scoring runs: the current ``torch_device()`` (read at each call)."""
        return torch_device()

    def load(self, arrays: ArrayRecord) -> None:
        self.space.load_state_dict(state_dict_of(arrays))

    def __call__(self, paths: Sequence[Sequence[int]]) -> list[EvalResult]:
        return score_paths(self.space, paths, self.loader, self.calibration, self.device)

    def scored_state(self, arrays: ArrayRecord, path: Sequence[int]) -> dict[str, Tensor]:
        """The supernet ``arrays`` as this scorer scores ``path``: the same weights, the
        path's BatchNorm statistics re-estimated on the calibration batches (when
        recalibrating).  Loads ``arrays`` into the scorer's supernet."""
        self.load(arrays)
        if self.calibration is not None:
            self.space.to(self.device)
            recalibrate_batchnorm(
                self.space, lambda x: self.space(x, tuple(path)), self.calibration, self.device
            )
        return {k: v.detach().cpu() for k, v in self.space.state_dict().items()}


class SupernetEvaluator:
    """Accuracy of the supernet over a fixed set of random paths (Stage-1 curve).

    The same ``num_paths`` uniformly sampled paths (fixed by ``seed``) are scored
    every time, so the curve over rounds compares like with like; each is
    BN-recalibrated and scored by a ``ServerPathScorer``.  Returns the mean, min
    and max accuracy and the mean loss as a ``MetricRecord``.
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
        self.scorer = ServerPathScorer(
            space,
            dataset,
            seed=seed,
            calibration_fraction=calibration_fraction,
            batch_size=batch_size,
        )
        rng = numpy_stream(seed, "server-eval-paths")
        self.paths = [space.sample_path(rng) for _ in range(num_paths)]

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        self.scorer.load(arrays)
        results = self.scorer(self.paths)
        accuracies = [r.accuracy for r in results]
        return MetricRecord(
            {
                "val-accuracy": float(np.mean(accuracies)),
                "val-accuracy-min": float(np.min(accuracies)),
                "val-accuracy-max": float(np.max(accuracies)),
                "val-loss": float(np.mean([r.loss for r in results])),
            }
        )
