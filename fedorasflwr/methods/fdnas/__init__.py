"""FDNAS and CFDNAS (He et al., 2020).

Server side: ``strategy`` (``FDNAS``), ``cfdnas`` (``CFDNAS``), ``nets`` (derived nets).
Client side: ``client``.
"""
