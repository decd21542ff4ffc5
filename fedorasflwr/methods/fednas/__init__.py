"""FedNAS (He et al., 2020): federated DARTS, FedAvg of the weights and the alphas.

See ``strategy.py``, ``client.py`` and docs/fednas.md.
"""
