"""DP-FNAS's server-side validation: the mixed supernet on the server's held-out slice."""

from __future__ import annotations

import copy

from flwr.app import ArrayRecord, MetricRecord
from torch.utils.data import TensorDataset

from ...arrays import state_dict_of
from ...search_spaces import SearchSpace
from ...training import evaluate, ordered_loader, torch_device

__all__ = ["MixedSupernetEvaluator"]


class MixedSupernetEvaluator:
    """``(iteration, arrays) -> MetricRecord``: accuracy and loss of the mixed (softmax
    over every operation) supernet ``arrays`` on ``dataset``.

    DP-FNAS's default ``evaluate_fn`` when the strategy gets ``server_data``.  Scored on a
    copy of ``space`` (built without drawing from torch's RNG), loaded at each call."""

    def __init__(self, space: SearchSpace, dataset: TensorDataset, batch_size: int = 256) -> None:
        self.space = copy.deepcopy(space)
        self.loader = ordered_loader(dataset, batch_size)

    def __call__(self, iteration: int, arrays: ArrayRecord) -> MetricRecord:
        device = torch_device()
        self.space.load_state_dict(state_dict_of(arrays))
        self.space.to(device).eval()
        result = evaluate(self.space, self.loader, device)
        return MetricRecord({"val-accuracy": result.accuracy, "val-loss": result.loss})
