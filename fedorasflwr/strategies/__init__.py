"""The public strategies, re-exported from ``fedorasflwr.methods`` and ``fedorasflwr.federation``.

Each is a ``flwr.serverapp.strategy.Strategy`` needing only a ``Grid``.

>>> from fedorasflwr.strategies import FedorAS, DecNAS, FDNAS, CFDNAS, DPFNAS, SeededFedAvg
>>> from fedorasflwr.strategies import opa
>>> from fedorasflwr.strategies import FedorASSettings, FDNASSettings, DecNASSettings
"""

from ..federation.aggregation import opa
from ..federation.base import FederatedNASStrategy, NodeProfile, StageFailedError
from ..federation.fedavg import SeededFedAvg
from ..methods.decnas.settings import DecNASSettings
from ..methods.decnas.strategy import DecNAS, DecNASResult
from ..methods.dpfnas.settings import DPFNASSettings
from ..methods.dpfnas.strategy import DPFNAS
from ..methods.fdnas.cfdnas import CFDNAS
from ..methods.fdnas.settings import FDNASSettings
from ..methods.fdnas.strategy import FDNAS
from ..methods.fedoras.settings import FedorASSettings
from ..methods.fedoras.strategy import FedorAS, FedorASResult

__all__ = [
    "CFDNAS",
    "DPFNAS",
    "DecNAS",
    "DecNASResult",
    "DecNASSettings",
    "DPFNASSettings",
    "FDNAS",
    "FDNASSettings",
    "FedorAS",
    "FedorASResult",
    "FedorASSettings",
    "FederatedNASStrategy",
    "NodeProfile",
    "SeededFedAvg",
    "StageFailedError",
    "opa",
]
