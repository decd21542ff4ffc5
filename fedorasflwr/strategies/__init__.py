"""The public strategies, re-exported from ``fedorasflwr.methods`` and ``fedorasflwr.federation``,
with what their ``start`` returns.

Each is a ``flwr.serverapp.strategy.Strategy`` needing only a ``Grid``.  Each result class
and the dataclasses inside it are documented field by field in its method's page
(docs/fedoras.md, docs/fdnas.md, docs/dpfnas.md, docs/decnas.md, docs/fednas.md; ``LatencyTable``:
docs/latency.md).

>>> from fedorasflwr.strategies import FedorAS, DecNAS, FDNAS, CFDNAS, DPFNAS, SeededFedAvg
>>> from fedorasflwr.strategies import FedorASResult, FDNASResult, DPFNASResult, DecNASResult
>>> from fedorasflwr.strategies import HeteroFL, FjORD, WidthResult  # width baselines
>>> from fedorasflwr.strategies import opa
>>> from fedorasflwr.strategies import FedorASSettings, FDNASSettings, DecNASSettings
"""

from ..federation.aggregation import opa
from ..federation.base import FederatedNASStrategy, NodeProfile, StageFailedError
from ..federation.fedavg import SeededFedAvg
from ..latency import LatencyTable, LatencyValidation
from ..methods.decnas.settings import DecNASSettings
from ..methods.decnas.stages import GlobalModel
from ..methods.decnas.strategy import DecNAS, DecNASResult
from ..methods.dpfnas.privacy import MechanismPrivacy, PartyPrivacy
from ..methods.dpfnas.settings import DPFNASSettings
from ..methods.dpfnas.strategy import DPFNAS, DPFNASResult
from ..methods.fdnas.cfdnas import CFDNAS
from ..methods.fdnas.nets import DerivedNet, FDNASResult
from ..methods.fdnas.settings import FDNASSettings
from ..methods.fdnas.strategy import FDNAS
from ..methods.fednas.settings import FedNASSettings
from ..methods.fednas.strategy import FedNAS, FedNASResult
from ..methods.fedoras.finetune import TierModel, TierTest
from ..methods.fedoras.search import Scored, TierSearch
from ..methods.fedoras.settings import FedorASSettings
from ..methods.fedoras.strategy import FedorAS, FedorASResult
from ..methods.fedoras.tiers import Tier
from ..methods.widths.settings import FjORDSettings, HeteroFLSettings
from ..methods.widths.strategy import FjORD, HeteroFL, TierWidth, WidthResult

__all__ = [
    "FjORD",
    "FjORDSettings",
    "HeteroFL",
    "HeteroFLSettings",
    "TierWidth",
    "WidthResult",
    "CFDNAS",
    "DPFNAS",
    "DPFNASResult",
    "DecNAS",
    "DecNASResult",
    "DPFNASSettings",
    "DecNASSettings",
    "DerivedNet",
    "FDNAS",
    "FDNASResult",
    "FDNASSettings",
    "FedNAS",
    "FedNASResult",
    "FedNASSettings",
    "FedorAS",
    "FedorASResult",
    "FedorASSettings",
    "FederatedNASStrategy",
    "GlobalModel",
    "LatencyTable",
    "LatencyValidation",
    "MechanismPrivacy",
    "NodeProfile",
    "PartyPrivacy",
    "Scored",
    "SeededFedAvg",
    "StageFailedError",
    "Tier",
    "TierModel",
    "TierSearch",
    "TierTest",
    "opa",
]
