"""The client side of ``query.decnas_latency``: this node's layer-wise latency table of a
prunable net (NetAdapt's look-up table, ``fedorasflwr.methods.decnas.latency``), measured
once and cached on the node's disk as ``query.latency``'s tables are
(``fedorasflwr.clients.latency``: same directory, key, digest and atomic writes; the key's
spec carries the net's spec and the grid's points).
"""

from __future__ import annotations

import torch
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from .. import latency
from ..latency import LatencyRequest, LatencyTable
from ..methods.decnas.latency import GRID_KEY, LayerLayout, layer_layout, measure_layer_table
from ..protocol import CONFIG, LATENCY, METRICS, space_from_config
from .latency import cached

__all__ = ["answer_layer_latency", "cached_layer_table"]


def cached_layer_table(
    layout: LayerLayout, request: LatencyRequest, device: torch.device | None = None
) -> tuple[LatencyTable, bool]:
    """This node's table of ``layout`` (from its cache, else measured and stored, one
    measurement per host as in ``cached_table``), and whether it was measured now."""
    return cached(
        layout,  # type: ignore[arg-type]  # spec and num_options
        request,
        device,
        lambda d: measure_layer_table(layout, request, device=d),
    )


def answer_layer_latency(content: RecordDict) -> RecordDict:
    """The reply to ``query.decnas_latency``: the records of a ``query.latency`` reply
    (``metrics``: the units' entries as ``option-ms``, the fixed part, the validation;
    ConfigRecord ``latency``: device, statistic)."""
    config = content.config_records[CONFIG]
    request = LatencyRequest.from_config(config)
    spec = space_from_config(config)
    points = int(spec.pop(GRID_KEY))
    table, measured = cached_layer_table(layer_layout(spec, points), request)
    return RecordDict(
        {
            METRICS: MetricRecord(latency.table_metrics(table, measured=measured)),
            LATENCY: ConfigRecord(latency.table_config(table)),
        }
    )
