"""Server-side strategies: each a ``flwr.serverapp.strategy.Strategy`` needing only a ``Grid``.

>>> from fedorasflwr.strategies import FedorAS, DecNAS, FDNAS, CFDNAS, DPFNAS, SeededFedAvg
>>> from fedorasflwr.strategies.aggregation import opa
"""

from .aggregation import opa
from .base import FederatedNASStrategy, NodeProfile, StageFailedError
from .cfdnas import CFDNAS
from .decnas import DecNAS, DecNASResult
from .dpfnas import DPFNAS
from .fdnas import FDNAS
from .fedavg import SeededFedAvg
from .fedoras import FedorAS, FedorASResult

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
