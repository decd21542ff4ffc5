"""Federated neural architecture search (FedorAS, DecNAS, FDNAS, DP-FNAS) as a Flower app."""
