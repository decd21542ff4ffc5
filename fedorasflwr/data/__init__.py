"""Data layer: offline and online datasets, flwr-datasets partitioners, per-client splits.

>>> spec = DataSpec(dataset="mnist5k", partitioner="dirichlet", alpha=0.1)
>>> spec.check_partitionable(20)                     # fails early, naming the run-config key
>>> info = dataset_info(spec)                        # image, 10 classes, (1, 28, 28)
>>> client = load_client_data(spec, partition_id=3, num_partitions=20)
>>> server = load_server_data(spec)                  # held out before partitioning
>>> test = load_global_test(DataSpec(global_test=True))  # the server's global test set

Importing this package and loading from the disk cache need only torch; the
``datasets`` / ``flwr_datasets`` machinery is imported when a partition is built.
"""

from .catalog import DatasetInfo, dataset_info
from .loading import ClientData, load_client_data, load_global_test, load_server_data
from .spec import DataSpec
from .text import OOV_ID, VOCAB

__all__ = [
    "OOV_ID",
    "VOCAB",
    "ClientData",
    "DataSpec",
    "DatasetInfo",
    "dataset_info",
    "load_client_data",
    "load_global_test",
    "load_server_data",
]
