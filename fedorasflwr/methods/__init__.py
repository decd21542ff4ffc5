"""One package per method: its strategy and stages (server) and ``client.py`` (client).

- ``fedoras``: FedorAS (Dudziak et al., 2022): supernet, tiered search, fine-tuning;
- ``decnas``: DecNAS: NetAdapt-style pruning, grouped candidates;
- ``fdnas``: FDNAS and CFDNAS (He et al., 2020): DARTS-style search over MBConv;
- ``dpfnas``: DP-FNAS (Singh et al., 2020): differentially private DARTS.

Rules (``tests/test_layout.py``): a method imports no other method; a server module
(anything but ``client.py``) imports no client module.  Shared server code lives in
``fedorasflwr.federation``, the torch loops both sides use in ``fedorasflwr.training``.
Each package's ``__init__`` imports nothing, so a ClientApp loads only ``client.py`` and
what it imports.
"""
