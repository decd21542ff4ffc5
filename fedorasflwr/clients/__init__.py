"""The client side of each method, re-exported from ``fedorasflwr.methods.<method>.client``.

>>> from fedorasflwr.clients import decnas, dpfnas, fdnas, fedoras
>>> fedoras.train_supernet  # the handler body of ``train.fedoras_supernet``
"""

from ..methods.decnas import client as decnas
from ..methods.dpfnas import client as dpfnas
from ..methods.fdnas import client as fdnas
from ..methods.fedoras import client as fedoras

__all__ = ["decnas", "dpfnas", "fdnas", "fedoras"]
