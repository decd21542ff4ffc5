"""Server plumbing every method shares.

- ``base``: ``FederatedNASStrategy`` (node profiles, one exchange with the nodes,
  checkpoints, the ledger), ``NodeProfile``, ``sample_nodes``;
- ``replies``: checks of a reply's arrays and metrics, and of their bounds;
- ``aggregation``: OPA (per-key count-weighted mean) and the robust rules;
- ``fedavg``: ``SeededFedAvg``, the FedAvg stage the methods' final training runs;
- ``polling``: ``PromptGrid``, a grid that collects replies as they arrive (Flower's
  polls every 3 s).

The package's ``__init__`` imports nothing, so a module here loads only what it uses.
"""
