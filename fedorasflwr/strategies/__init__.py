"""The public strategies, re-exported from ``fedorasflwr.methods`` and ``fedorasflwr.federation``.

Each is a ``flwr.serverapp.strategy.Strategy`` needing only a ``Grid``.

>>> from fedorasflwr.strategies import FedorAS, DecNAS, FDNAS, CFDNAS, DPFNAS, SeededFedAvg
>>> from fedorasflwr.strategies import opa
"""

from ..federation.aggregation import opa
from ..federation.base import FederatedNASStrategy, NodeProfile, StageFailedError
from ..federation.fedavg import SeededFedAvg
from ..methods.decnas.strategy import DecNAS, DecNASResult
from ..methods.dpfnas.strategy import DPFNAS
from ..methods.fdnas.cfdnas import CFDNAS
from ..methods.fdnas.strategy import FDNAS
from ..methods.fedoras.strategy import FedorAS, FedorASResult

__all__ = [
    "CFDNAS",
    "DPFNAS",
    "DecNAS",
    "DecNASResult",
    "FDNAS",
    "FedorAS",
    "FedorASResult",
    "FederatedNASStrategy",
    "NodeProfile",
    "SeededFedAvg",
    "StageFailedError",
    "opa",
]
