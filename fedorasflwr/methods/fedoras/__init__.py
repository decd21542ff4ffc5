"""FedorAS (Dudziak et al., 2022).

Server side: ``strategy`` (``FedorAS``), ``tiers``, ``search`` (NSGA-II per tier),
``scoring`` (Stage-2 path scoring), ``finetune`` (Stage 3), ``evaluation`` (path accuracy).
Client side: ``client``.
"""
