"""``python -m fedorasflwr.compare``: several methods on one shared setting (data, clients,
split, seed) under one budget rule (equal rounds, or equal client training FLOPs from each
run's ledger), then one leaderboard of every method's models: ``leaderboard.md``,
``leaderboard.json`` and ``leaderboard.png`` (docs/compare.md).

- `spec`: the comparison read from one TOML file and the command line, checked whole
  before anything runs (``read_spec``);
- `execute`: one method's run, on the simulation engine through the launcher or on the
  in-process grid; a finished run of the same settings is reused (``run_method``);
- `leaderboard`: the rows (each method's ``points`` of its result.json), the budget spent
  per method, the files;
- `cli`: the command line and ``compare``, the whole comparison.
"""

from .cli import compare, main
from .spec import BUDGETS, CompareSpec, read_spec

__all__ = ["BUDGETS", "CompareSpec", "compare", "main", "read_spec"]
