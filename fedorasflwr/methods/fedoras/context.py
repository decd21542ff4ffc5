"""What FedorAS's Stage-2 scoring and Stage-3 fine-tuning use of the running strategy.

The stage code (``scoring``, ``finetune``) takes a :class:`StageContext`, which
``FedorAS.stage_context`` builds after the nodes are profiled and put in tiers,
instead of the strategy itself: the stages see the federation operations, the
space, the settings, the tiers of the nodes and the server's scorer, and nothing
else, and no stage module imports ``strategy``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from flwr.app import ConfigRecord, Message
from flwr.serverapp import Grid

from ...federation.aggregation import Aggregation
from ...federation.base import NodeProfile
from ...federation.replies import Bound
from ...ledger import Ledger
from ...search_spaces import SearchSpace
from .evaluation import ServerPathScorer
from .settings import FedorASSettings

__all__ = ["Federation", "StageContext"]


class Federation(Protocol):
    """The federation operations a stage runs (``FederatedNASStrategy`` provides them)."""

    @property
    def seed(self) -> int: ...

    @property
    def ledger(self) -> Ledger: ...

    @property
    def min_replies(self) -> int: ...

    @property
    def reply_timeout(self) -> float: ...

    @property
    def aggregation(self) -> Aggregation: ...

    def rng(self, purpose: str, *keys: int | str) -> np.random.Generator: ...

    def exchange(self, grid: Grid, stage: str, messages: Sequence[Message]) -> list[Message]: ...

    def accept(
        self, stage: str, replies: Iterable[Message], check: Callable[[Message], str | None]
    ) -> list[Message]: ...

    def claim(self, node_id: int, *splits: str, epochs: int = 1, per_sample: int = 1) -> Bound: ...

    def require(
        self, stage: str, accepted: int, sent: int, *, at_most_sent: bool = False
    ) -> None: ...

    def with_user_config(self, message_type: str, config: Mapping[str, Any]) -> ConfigRecord: ...


@dataclass(frozen=True)
class StageContext:
    """One FedorAS run as its later stages see it.

    ``nodes``: the profiled nodes by node id; ``tier_of``: each one's tier (0 = lowest);
    ``server_scorer``: the server-held validation slice's scorer, when there is one.
    """

    federation: Federation
    space: SearchSpace
    settings: FedorASSettings
    nodes: Mapping[int, NodeProfile]
    tier_of: Mapping[int, int]
    server_scorer: ServerPathScorer | None = None

    def eligible(self, tier: int) -> list[NodeProfile]:
        """The nodes of tier ``tier`` and above: those able to run its model."""
        return [p for p in self.nodes.values() if self.tier_of[p.node_id] >= tier]

    @property
    def predictions_per_sample(self) -> int:
        """Predictions one sample makes (a text window: one per character, ``seq_len``);
        the unit of the counts of the search's scoring and of the tier tests."""
        return int(self.space.spec.get("seq_len", 1))
