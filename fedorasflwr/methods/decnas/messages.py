"""DecNAS's message types (docs/protocol.md), both sides: candidates tuned and uploaded,
FedAvg, evaluation, the layer-wise latency table."""

__all__ = [
    "QUERY_DECNAS_LATENCY",
    "DECNAS_TUNE",
    "DECNAS_UPLOAD",
    "DECNAS_TRAIN",
    "DECNAS_EVALUATE",
]

QUERY_DECNAS_LATENCY = "query.decnas_latency"  # a prunable net's layer table (decnas/latency.py)
DECNAS_TUNE = "train.decnas_tune"  # train and validate a candidate; keep the weights
DECNAS_UPLOAD = "train.decnas_upload"  # send the kept weights (survivors only)
DECNAS_TRAIN = "train.decnas_fedavg"  # FedAvg of GM_0, the tuned GMs, baselines
DECNAS_EVALUATE = "evaluate.decnas"
