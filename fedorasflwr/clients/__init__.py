"""The client side: every method's handlers for a ClientApp of your own, and each method's
client module (re-exported from ``fedorasflwr.methods.<method>.client``).

>>> from fedorasflwr.clients import make_client_app, register
>>> app = make_client_app(load_data)   # load_data(context) -> (train, val, test)
>>> register(my_app, load_data)        # or add them to a ClientApp of your own
>>> from fedorasflwr.clients import decnas, dpfnas, fdnas, fedoras
>>> fedoras.train_supernet  # the handler body of ``train.fedoras_supernet``

See ``docs/library.md``; the messages are those of ``docs/protocol.md``.
"""

from ..methods.decnas import client as decnas
from ..methods.dpfnas import client as dpfnas
from ..methods.fdnas import client as fdnas
from ..methods.fednas import client as fednas
from ..methods.fedoras import client as fedoras
from ..methods.widths import client as widths
from .factory import HANDLERS, make_client_app, node_threads, register
from .node_data import NodeData, data_partition_id, to_client_data

__all__ = [
    "HANDLERS",
    "NodeData",
    "data_partition_id",
    "decnas",
    "dpfnas",
    "fdnas",
    "fednas",
    "fedoras",
    "make_client_app",
    "node_threads",
    "register",
    "to_client_data",
    "widths",
]
