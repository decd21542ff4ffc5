"""DP-FNAS (Singh et al., 2020).

Server side: ``strategy`` (``DPFNAS``), ``privacy`` (accounting).
Client side: ``client``, ``secure_random`` (the parties' DP randomness).
Both: ``contract`` (keys and step counts they agree on), ``per_sample`` (per-sample
gradients, and the check a space must pass).
"""
