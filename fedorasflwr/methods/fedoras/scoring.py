"""FedorAS Stage 2 (paper §3.2): scoring a generation of paths, on the server or federated.

``search_tier`` (``search``) asks for the accuracy of each new
generation; this module answers it in one of two ways:

- **server**: the server-held validation slice, BN statistics recalibrated on
  a calibration part of it (``evaluation.ServerPathScorer``);
- **federated**: the generation's paths are packed into the minimal supernet
  that covers them, sent to ``search-clients`` sampled clients of the tier and
  above, scored on their validation splits (BN recalibrated on a few local
  training batches), and each path's accuracy is the example-weighted mean
  (correct predictions summed over clients / examples summed).

With ``both``, the server's scores drive the search and the federated ones
are recorded beside them; Kendall's tau between the two rankings is reported.

Client contract
---------------
``evaluate.fedoras_paths``
    arrays: the covering subspace's ``state_dict`` entries.  config:
    ``method``, ``subspace-mask``, ``paths`` (flat, layer-major per path),
    ``seed``, ``server-round`` (the generation), ``batch-size``,
    ``calibration-batches`` (0: no recalibration) and ``space.<kwarg>``.
    Reply ``metrics``: ``num-examples`` (validation examples), ``correct`` and
    ``loss-sum`` (one entry per path).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from ...federation.base import sample_nodes
from ...federation.replies import Bound, check_reply
from ...protocol import ARRAYS, CONFIG, METRICS, space_to_config
from ...search_spaces import Subspace
from .context import StageContext
from .evaluation import ServerPathScorer
from .messages import FEDORAS_PATHS

__all__ = [
    "FederatedPathScorer",
    "TierScorer",
    "accepted_scores",
    "covering_subspace",
    "path_messages",
    "pooled_scores",
]

Path = tuple[int, ...]


def covering_subspace(paths: Sequence[Sequence[int]], num_layers: int) -> Subspace:
    """The smallest subspace holding every path: per layer, the options some path uses."""
    return tuple(tuple(sorted({int(p[layer]) for p in paths})) for layer in range(num_layers))


def path_messages(
    context: StageContext,
    grid: Grid,
    arrays: ArrayRecord,
    tier: int,
    paths: Sequence[Path],
    generation: int,
) -> list[Message]:
    """The ``evaluate.fedoras_paths`` messages scoring ``paths`` (generation ``generation``)
    on ``search-clients`` sampled connected clients of ``tier`` and above with a
    validation split: the covering subspace of the supernet ``arrays`` to each."""
    s, space, federation = context.settings, context.space, context.federation
    connected = set(grid.get_node_ids())
    eligible = [p for p in context.eligible(tier) if p.node_id in connected and p.num_val > 0]
    chosen = sample_nodes(
        federation.rng("search-clients", tier, generation), eligible, s.search_clients
    )
    subspace = covering_subspace(paths, len(space.num_options()))
    sub_arrays = ArrayRecord({k: arrays[k] for k in space.subspace_keys(subspace)})
    config = ConfigRecord(
        {
            "method": "fedoras",
            "phase": "search",
            "seed": federation.seed,
            "server-round": generation,
            "subspace-mask": space.subspace_mask(subspace),
            "paths": [int(v) for path in paths for v in path],
            "batch-size": s.train.batch_size,
            "calibration-batches": (s.search_calibration_batches if s.search_recalibrate_bn else 0),
            **space_to_config(space.spec),
        }
    )
    return [
        Message(
            RecordDict({ARRAYS: sub_arrays, CONFIG: config}),
            message_type=FEDORAS_PATHS,
            dst_node_id=p.node_id,
        )
        for p in chosen
    ]


def accepted_scores(
    context: StageContext, stage: str, replies: Iterable[Message], num_paths: int
) -> list[Message]:
    """The path-scoring replies fit to pool (error and malformed ones skipped, logged)."""
    federation = context.federation
    return federation.accept(
        stage,
        replies,
        lambda r: _check_scores(
            r,
            num_paths,
            federation.claim(
                r.metadata.src_node_id, "val", per_sample=context.predictions_per_sample
            ),
        ),
    )


def pooled_scores(replies: Sequence[Message], num_paths: int) -> tuple[list[float], int]:
    """Each path's accuracy over ``replies`` (correct predictions summed / examples
    summed), and the examples."""
    correct = np.zeros(num_paths)
    examples = 0
    for reply in replies:
        metrics = reply.content.metric_records[METRICS]
        correct += np.asarray(metrics["correct"], dtype=float)
        examples += int(metrics["num-examples"])
    return (correct / max(examples, 1)).tolist(), examples


class FederatedPathScorer:
    """Scores one tier's generations on sampled eligible clients' validation splits."""

    def __init__(self, context: StageContext, grid: Grid, arrays: ArrayRecord, tier: int) -> None:
        self.context = context
        self.grid = grid
        self.arrays = arrays
        self.tier = tier
        self.generation = 0
        self.stage = f"search-t{tier + 1}"

    def __call__(self, paths: list[Path]) -> list[float]:
        federation = self.context.federation
        messages = path_messages(
            self.context, self.grid, self.arrays, self.tier, paths, self.generation
        )
        self.generation += 1
        replies = accepted_scores(
            self.context,
            self.stage,
            federation.exchange(self.grid, self.stage, messages),
            len(paths),
        )
        federation.require(self.stage, len(replies), len(messages), at_most_sent=True)
        return pooled_scores(replies, len(paths))[0]


def _check_scores(reply: Message, num_paths: int, claim: Bound) -> str | None:
    reason = check_reply(
        reply,
        counts=("num-examples", "correct", "loss-sum"),
        bounds={"num-examples": claim, "correct": claim},
    )
    if reason is not None:
        return reason
    metrics = reply.content.metric_records[METRICS]
    examples = int(metrics["num-examples"])
    if examples < 1:
        return "num-examples is 0"
    for key in ("correct", "loss-sum"):
        values = metrics[key]
        if not isinstance(values, list) or len(values) != num_paths:
            return f"{key!r} must hold one value per path ({num_paths})"
    if any(c > examples for c in metrics["correct"]):
        return "more correct predictions than examples"
    return None


class TierScorer:
    """The score function of one tier's search: the server's scores when there is a
    server scorer (federated ones, if also given, are recorded in ``federated``),
    else the federated scores."""

    def __init__(
        self, server: ServerPathScorer | None, federated: FederatedPathScorer | None
    ) -> None:
        if server is None and federated is None:
            raise ValueError("a search needs a server or a federated scorer")
        self.server = server
        self.federated = federated
        self.recorded: dict[Path, float] = {}

    def __call__(self, paths: list[Path]) -> list[float]:
        if self.server is None:
            assert self.federated is not None
            return self.federated(paths)
        if self.federated is not None:
            self.recorded.update(zip(paths, self.federated(paths), strict=True))
        return [r.accuracy for r in self.server(paths)]
