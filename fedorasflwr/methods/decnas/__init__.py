"""DecNAS.

Server side: ``strategy`` (``DecNAS``), ``stages``, ``netadapt``, ``grouping``.
Client side: ``client``.
"""
