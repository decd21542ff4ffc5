"""What ``python -m fedorasflwr.compare`` compares: one shared setting, the methods, the
budget rule, each method's own keys; read from one TOML file and the command line and
checked whole before any training.

The file is a run config (the keys of ``pyproject.toml``'s ``[tool.flwr.app.config]``, as in
``configs/quick-*.toml``) that every method gets, plus two tables of its own:

- ``[compare]``: ``methods`` (a list or a comma-separated string; default: every method of
  ``fedorasflwr.methods.METHODS``), ``budget`` (``"rounds"`` or ``"flops"``), ``rounds``
  (budget ``rounds``: every round key of every method set to it; 0: each method's own),
  ``reference`` and ``tolerance`` (budget ``flops``), ``nodes``;
- ``[methods.<method>]``: run-config keys for that method only (``fedoras.rounds``,
  ``space.name``, ...), for instance to make budgets comparable. The data, the seed, the
  output directory and the method itself are the shared setting's: a method table may not
  set them.

The command's other inputs are checked here too, before anything runs: ``--app-dir``
(``read_spec``: a Flower app's directory for engine runs), ``--out`` (``check_out``) and
``--timeout`` (``check_timeout``).
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import check_known_keys, parse_run_config
from ..data.folder import absolute_folder
from ..methods import METHODS, ROUND_KEYS

__all__ = [
    "BUDGETS",
    "COMPARE_KEYS",
    "CompareSpec",
    "app_run_config",
    "check_out",
    "check_timeout",
    "read_spec",
    "with_rounds",
]

#: the budget rules: ``rounds`` (each method's rounds as set: its own, or ``[compare]
#: rounds``) and ``flops`` (each method's round keys scaled so that its clients' training
#: FLOPs, from its ledger, match the reference method's within the tolerance)
BUDGETS = ("rounds", "flops")
#: the keys of the ``[compare]`` table (and the command line's flags of the same names)
COMPARE_KEYS = ("methods", "budget", "rounds", "reference", "tolerance", "nodes")
#: run-config keys that make the shared setting: no method table may set them
SHARED_ONLY = ("method", "seed", "output-dir", "resume-from")
SHARED_PREFIXES = ("data.",)

ConfigValue = str | int | float | bool


@dataclass(frozen=True)
class CompareSpec:
    """A checked comparison (``read_spec``).

    ``shared``: the run-config overrides every method gets; ``overrides``: each method's
    own (``[methods.<method>]``); ``budget``: one of ``BUDGETS``; ``rounds``: with budget
    ``rounds``, every round key set to it (0: each method's own); ``reference`` and
    ``tolerance``: with budget ``flops``, the method whose client training FLOPs the others
    match, and the relative difference accepted without scaling; ``nodes``: simulated
    clients (SuperNodes, or nodes of the in-process grid)."""

    shared: dict[str, ConfigValue]
    methods: tuple[str, ...]
    overrides: dict[str, dict[str, ConfigValue]] = field(default_factory=dict)
    budget: str = "rounds"
    rounds: int = 0
    reference: str = ""
    tolerance: float = 0.25
    nodes: int = 20

    def run_config(self, method: str) -> dict[str, ConfigValue]:
        """The run-config overrides of ``method``'s run: the shared setting, the method's
        own table, ``method``."""
        return {**self.shared, **self.overrides.get(method, {}), "method": method}

    def document(self) -> dict[str, Any]:
        return {
            "methods": list(self.methods),
            "budget": self.budget,
            "rounds": self.rounds,
            "reference": self.reference,
            "tolerance": self.tolerance,
            "nodes": self.nodes,
            "shared": dict(self.shared),
            "overrides": {m: dict(v) for m, v in self.overrides.items() if m in self.methods},
        }


def app_run_config(app_dir: Path) -> dict[str, ConfigValue]:
    """``[tool.flwr.app.config]`` of the app in ``app_dir`` flattened as Flower hands it to
    the apps (sub-tables become dotted keys); empty when ``app_dir`` has no such table
    (the parser's own defaults apply then: they are the same)."""
    path = Path(app_dir) / "pyproject.toml"
    if not path.is_file():
        return {}
    table = tomllib.loads(path.read_text()).get("tool", {}).get("flwr", {})
    return _flatten(table.get("app", {}).get("config", {}), where=str(path))


def _flatten(table: Mapping[str, Any], where: str, prefix: str = "") -> dict[str, ConfigValue]:
    flat: dict[str, ConfigValue] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, where, f"{name}."))
        elif isinstance(value, bool | int | float | str):
            flat[name] = value
        else:
            raise ValueError(
                f"{where}: key {name!r} = {value!r}: allowed: a str, int, float or bool"
            )
    return flat


def _methods(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        names = [m.strip() for m in value.split(",") if m.strip()]
    elif isinstance(value, list) and all(isinstance(m, str) for m in value):
        names = [m.strip() for m in value]
    else:
        raise ValueError(f"{where} = {value!r}: allowed: a list of method names or 'a,b,...'")
    if not names:
        raise ValueError(f"{where} = {value!r}: name at least one method")
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise ValueError(f"{where}: unknown method {unknown[0]!r}; allowed: {', '.join(METHODS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"{where} = {value!r}: a method is named twice")
    return tuple(names)


def _number(value: Any, where: str, kind: type, allowed: str, check: Any) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) or not check(value):
        raise ValueError(f"{where} = {value!r}: allowed: {allowed}")
    return value


def read_spec(
    path: Path | None,
    flags: Mapping[str, Any] | None = None,
    app_dir: Path = Path("."),
    *,
    engine: bool = False,
) -> CompareSpec:
    """The comparison of the TOML file ``path`` (``None``: no file, every default), with
    the command line's ``flags`` (``COMPARE_KEYS`` -> value; ``None`` values ignored)
    winning over its ``[compare]`` table, and ``flags["dataset"]`` (``--dataset``) over the
    file's ``data.dataset``; every method's whole run config checked as its
    run would check it (``config.parse_run_config`` over the app's defaults, the dataset's
    shape and classes, whether ``nodes`` clients can all get data) so that a bad key or
    value of any method raises ``ValueError`` here, naming it, before anything runs.

    ``app_dir`` must be a directory; with ``engine`` (the methods run on the simulation
    engine, which runs the app there), a Flower app's: a ``pyproject.toml`` with
    ``[tool.flwr.app]`` (``launch.values.check_run_values``, the launcher's own check).
    In process, a directory without one gives the parser's defaults."""
    _check_app_dir(app_dir)
    where = "compare"
    content: dict[str, Any] = {}
    if path is not None:
        where = str(path)
        try:
            content = tomllib.loads(Path(path).read_text())
        except OSError as error:
            raise ValueError(f"cannot read {path}: {error.strerror or error}") from error
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{path}: {error}") from error
    table = content.pop("compare", {})
    tables = content.pop("methods", {})
    if not isinstance(table, dict) or not isinstance(tables, dict):
        raise ValueError(f"{where}: [compare] and [methods.<method>] must be tables")
    unknown = sorted(set(table) - set(COMPARE_KEYS))
    if unknown:
        raise ValueError(
            f"{where}: [compare] key {unknown[0]!r} is unknown; allowed: {', '.join(COMPARE_KEYS)}"
        )
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    dataset = flags.pop("dataset", None)  # --dataset: the shared data.dataset, replaced
    given = {**table, **flags}

    shared = _flatten(content, where)
    if dataset is not None:
        shared["data.dataset"] = dataset
    # a relative folder: is the user's, from here (as each method's run resolves it)
    shared = absolute_folder(shared, Path.cwd())
    _check_keys(shared, where)
    for key in ("method",):
        if key in shared:
            raise ValueError(
                f"{where}: run config key {key!r} = {shared[key]!r}: the comparison runs every "
                "method it lists; name them in [compare] methods (or --methods)"
            )
    overrides: dict[str, dict[str, ConfigValue]] = {}
    for method, keys in tables.items():
        if method not in METHODS:
            raise ValueError(
                f"{where}: [methods.{method}]: unknown method {method!r}; "
                f"allowed: {', '.join(METHODS)}"
            )
        if not isinstance(keys, dict):
            raise ValueError(f"{where}: [methods.{method}] must be a table of run-config keys")
        own = _flatten(keys, f"{where} [methods.{method}]")
        _check_keys(own, f"{where} [methods.{method}]")
        for key in own:
            if key in SHARED_ONLY or key.startswith(SHARED_PREFIXES):
                raise ValueError(
                    f"{where} [methods.{method}]: run config key {key!r} belongs to the shared "
                    "setting (the data, the seed and where results go are the same for every "
                    "method): set it outside the [methods.*] tables"
                )
        overrides[method] = own

    methods = _methods(given.get("methods", list(METHODS)), f"{where}: [compare] methods")
    budget = given.get("budget", "rounds")
    if budget not in BUDGETS:
        raise ValueError(
            f"{where}: [compare] budget = {budget!r}: allowed: one of {', '.join(BUDGETS)}"
        )
    spec = CompareSpec(
        shared=shared,
        methods=methods,
        overrides=overrides,
        budget=budget,
        rounds=_number(
            given.get("rounds", 0),
            f"{where}: [compare] rounds",
            int,
            "an int >= 0 (0: each method's own rounds)",
            lambda v: v >= 0,
        ),
        reference=str(given.get("reference", methods[0])),
        tolerance=_number(
            given.get("tolerance", 0.25),
            f"{where}: [compare] tolerance",
            float,
            "a relative difference > 0, e.g. 0.25",
            lambda v: math.isfinite(v) and v > 0,
        ),
        nodes=_number(
            given.get("nodes", 20),
            f"{where}: [compare] nodes",
            int,
            "an int >= 2",
            lambda v: v >= 2,
        ),
    )
    if spec.reference not in spec.methods:
        raise ValueError(
            f"{where}: [compare] reference = {spec.reference!r}: allowed: one of the compared "
            f"methods ({', '.join(spec.methods)})"
        )
    if spec.rounds and spec.budget != "rounds":
        raise ValueError(
            f"{where}: [compare] rounds = {spec.rounds}: only with budget 'rounds' "
            "(budget 'flops' scales each method's rounds itself)"
        )
    for method in spec.methods:
        _check_method(spec, method, app_dir, where, engine=engine)
    return spec


def _check_app_dir(app_dir: Path) -> None:
    if not Path(app_dir).is_dir():
        what = "is no directory" if Path(app_dir).exists() else "does not exist"
        raise ValueError(
            f"--app-dir {str(app_dir)!r} {what}; allowed: the directory of a Flower app "
            "(its pyproject.toml with [tool.flwr.app]), default: the current directory"
        )


def _check_method(
    spec: CompareSpec, method: str, app_dir: Path, where: str, *, engine: bool
) -> None:
    """``method``'s run config over the app's defaults, checked as its run checks it
    before any training (the launcher's check on the engine, the same steps in process)."""
    from ..data import dataset_info
    from ..launch.values import AppDirError, check_run_values

    values = with_rounds(spec, method, spec.run_config(method))
    try:
        if engine:
            check_run_values(app_dir, values, spec.nodes)
            return
        settings = parse_run_config({**app_run_config(app_dir), **values})
        dataset_info(settings.data)
        settings.data.check_partitionable(spec.nodes)
    except AppDirError:
        raise
    except ValueError as error:
        raise ValueError(f"{where}: method {method!r}: {error}") from error


def check_timeout(timeout: float | None) -> float | None:
    """``--timeout`` (seconds per method on the engine; ``None``: no limit), checked."""
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(
            f"--timeout = {timeout!r}: allowed: seconds per method, a finite number > 0 "
            "(leave it out for no limit)"
        )
    return timeout


#: the attempts a method's runs are kept under (``<out>/<method>/<attempt>/``)
ATTEMPTS = ("run", "scaled")


def check_out(out: Path, spec: CompareSpec) -> Path:
    """``out`` made absolute, checked before anything is written: a directory, or a path
    that can become one (its nearest existing parent a directory this process may write
    in); inside it, each method's directories (``<method>/run``, ``<method>/scaled``) and
    the leaderboard's files not in the way (a file where a directory goes, or the other
    way round).  Creates nothing.

    Raises
    ------
    ValueError
        Naming ``--out``, the path at fault and what is allowed.
    """
    out = Path(out).absolute()
    allowed = "allowed: a directory, or a path where one can be made"
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file, not a directory; {allowed}")
    parent = next(p for p in (out, *out.parents) if p.exists() or p == p.parent)
    if not parent.is_dir():
        raise ValueError(
            f"--out {str(out)!r}: {str(parent)!r} is a file, no directory can be made under "
            f"it; {allowed}"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {str(out)!r}: cannot write in {str(parent)!r}; {allowed}")
    folders = [out / m for m in spec.methods] + [
        out / m / a for m in spec.methods for a in ATTEMPTS
    ]
    for path in folders:
        if path.exists() and not path.is_dir():
            raise ValueError(
                f"--out {str(out)!r}: {str(path)!r} is a file where the comparison keeps a "
                "method's runs (a directory); move it away or choose another --out"
            )
    for name in LEADERBOARD_FILES:
        if (out / name).is_dir():
            raise ValueError(
                f"--out {str(out)!r}: {str(out / name)!r} is a directory where the "
                "leaderboard is written (a file); move it away or choose another --out"
            )
    return out


#: what the comparison writes in ``out`` besides each method's directory
LEADERBOARD_FILES = ("leaderboard.md", "leaderboard.json", "leaderboard.png")


def _check_keys(values: Mapping[str, Any], where: str) -> None:
    try:
        check_known_keys(values)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from error


def with_rounds(
    spec: CompareSpec, method: str, config: Mapping[str, ConfigValue]
) -> dict[str, ConfigValue]:
    """``config`` with budget ``rounds``' ``[compare] rounds`` applied to each of
    ``method``'s round keys (``methods.ROUND_KEYS``), exactly: the rounds rule off
    (``rounds-scale`` 1, ``fedorasflwr.rounds``); as it is otherwise."""
    if spec.budget != "rounds" or not spec.rounds:
        return dict(config)
    return {**config, **{key: spec.rounds for key in ROUND_KEYS[method]}, "rounds-scale": 1.0}
