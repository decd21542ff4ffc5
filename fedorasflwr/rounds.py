"""The rounds rule (issue 40): every default and preset's rounds were sized on MNIST-5k; on a
dataset whose clients hold fewer rows, the same rounds give each client fewer SGD steps.

``rounds-scale = "auto"`` (the default) multiplies each round key of the running method by

    scale = max(1, R_ref / R)

where ``R`` is the rows the clients share on the run's dataset (outside the server slice and
a carved global test set) and ``R_ref`` the same on MNIST-5k at the run's own data settings:
each client then takes at least the SGD steps over the run that the settings give it on
MNIST-5k (the same local epochs over fewer rows are fewer steps; the rounds make them up).
On MNIST-5k the scale is 1 exactly, and it is never below 1 (a larger dataset already
gives more steps). A round key is multiplied and rounded up; 0 (a stage that is off) stays 0.

The rule applies to image data whose client rows are known without loading them (the
catalog's offline sets, an image folder); it leaves the rounds as set, saying why, on text
(its presets are sized on text), with ``data.partitioner = "sampled"`` (every client holds
``data.partition-size`` rows on any dataset) and where the size is unknown (an online
dataset). DP-FNAS's private search iterations (``dpfnas.iterations``) are never scaled:
each one spends privacy budget, which only the user may decide to spend.

A number instead of ``"auto"`` multiplies every one of those round keys by it, on any data
(``1``: the rounds as set). ``parse_with_rounds_rule`` is what the ServerApp and
``python -m fedorasflwr.compare`` parse a run config with; ``result.json``'s
``settings.rounds_rule`` records what it did.

Measured on a folder of 32x32 shapes (``docs/running.md``, "The rounds rule")."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .config import RunSettings, parse_run_config
from .data import DataSpec
from .data.catalog import carved_global_fraction, dataset_entry, num_client_samples
from .data.folder import FOLDER_PREFIX, inspect_folder
from .methods import ROUND_KEYS

__all__ = [
    "REFERENCE_DATASET",
    "RULE_KEYS",
    "RoundsRule",
    "client_rows",
    "parse_with_rounds_rule",
    "rounds_rule",
]

#: the dataset every default and preset's rounds were sized on
REFERENCE_DATASET = "mnist5k"

#: round keys the rule scales, per method: ``methods.ROUND_KEYS`` (what ``compare``'s budget
#: scales) and FedorAS's rand-init rounds, less DP-FNAS's private iterations
RULE_KEYS: dict[str, tuple[str, ...]] = {
    method: tuple(key for key in keys if key != "dpfnas.iterations")
    + (("fedoras.rand-init-rounds",) if method == "fedoras" else ())
    for method, keys in ROUND_KEYS.items()
}


@dataclass(frozen=True)
class RoundsRule:
    """What the rule found for a run: ``scale`` (1.0: rounds as set), the ``setting`` it
    came from (``"auto"`` or a number), the client rows ``rows`` of the run's dataset and
    ``reference_rows`` of MNIST-5k (``None`` where not used), why (one line), and each round
    key's value as set and as run (``rounds``: key -> [set, run])."""

    scale: float
    setting: float | str
    why: str
    rows: int | None = None
    reference_rows: int | None = None
    rounds: dict[str, list[int]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """``result.json``'s ``settings.rounds_rule``."""
        return {
            "setting": self.setting,
            "scale": self.scale,
            "why": self.why,
            "rows": self.rows,
            "reference_rows": self.reference_rows,
            "rounds": {key: list(pair) for key, pair in self.rounds.items()},
        }

    def line(self) -> str:
        """The console's line: the scale, why, and each round key that moved."""
        moved = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in self.rounds.items() if a != b)
        return f"rounds x{self.scale:.3g} ({self.why})" + (f": {moved}" if moved else "")


def client_rows(spec: DataSpec) -> int | None:
    """Rows the clients share on ``spec``'s dataset (outside the server slice and a carved
    global test set): exact for the catalog's datasets of known size; for an image folder
    from its image count, floored as one stratum (within the class count of the per-class
    split); ``None`` where only loading the data would tell."""
    known = num_client_samples(spec)
    if known is not None or not spec.dataset.startswith(FOLDER_PREFIX):
        return known
    total = inspect_folder(spec.dataset).num_images
    rest = total - math.floor(spec.server_fraction * total + 1e-9)
    # a folder has no test split: a global test set is carved from the rest, as the catalog's
    return rest - math.floor(carved_global_fraction(spec) * rest + 1e-9)


def rounds_rule(settings: RunSettings) -> RoundsRule:
    """The scale ``settings.rounds_scale`` gives on ``settings.data`` (module docstring)."""
    setting = settings.rounds_scale
    if setting != "auto":
        return RoundsRule(float(setting), setting, "rounds-scale as set")
    spec = settings.data
    entry = dataset_entry(spec.dataset)
    if entry is None or entry.kind != "image":
        return RoundsRule(1.0, setting, "auto: text data, rounds as set")
    if spec.partitioner == "sampled":
        why = "auto: data.partitioner 'sampled' gives every client data.partition-size rows"
        return RoundsRule(1.0, setting, why)
    rows = client_rows(spec)
    if rows is None or rows <= 0:
        why = f"auto: the size of {spec.dataset!r} is unknown before loading it, rounds as set"
        return RoundsRule(1.0, setting, why)
    reference = num_client_samples(replace(spec, dataset=REFERENCE_DATASET))
    assert reference is not None  # MNIST-5k's size is in the catalog
    scale = max(1.0, reference / rows)
    why = f"auto: {reference} client rows of {REFERENCE_DATASET} / {rows} of this dataset"
    return RoundsRule(scale, setting, why, rows, reference)


def _scaled(value: int, scale: float) -> int:
    """``value`` times ``scale``, rounded up (0, a stage that is off, stays 0)."""
    return math.ceil(value * scale - 1e-9) if value > 0 else value


def parse_with_rounds_rule(cfg: Mapping[str, Any]) -> RunSettings:
    """``parse_run_config(cfg)`` with the run's round keys (`RULE_KEYS`) multiplied by
    `rounds_rule`'s scale, and what it did in ``settings.rounds_rule``: what the ServerApp
    runs. The scaled keys are parsed (and so checked) as given ones would be, and they are
    the ones ``settings.values`` binds a checkpoint to."""
    settings = parse_run_config(cfg)
    rule = rounds_rule(settings)
    keys = [key for key in RULE_KEYS[settings.method] if key in settings.values]
    rounds = {key: int(settings.values[key]) for key in keys}
    scaled = {key: _scaled(value, rule.scale) for key, value in rounds.items()}
    if scaled != rounds:
        settings = parse_run_config({**cfg, **scaled})
    rule = replace(rule, rounds={key: [rounds[key], scaled[key]] for key in keys})
    return replace(settings, rounds_rule=rule.summary())
