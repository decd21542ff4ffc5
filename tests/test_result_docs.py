"""Every result a strategy's ``start`` returns, and every dataclass inside it, is exported from
``fedorasflwr.strategies`` and documented field by field in its method's page: a table under
the class's bold name whose first column is exactly the dataclass's fields."""

from __future__ import annotations

import dataclasses
import re

import pytest

import fedorasflwr.strategies as strategies
from tests.runconfig import ROOT

#: page -> the classes whose field tables it holds
PAGES = {
    "docs/fedoras.md": (
        "FedorASResult",
        "Tier",
        "TierSearch",
        "Scored",
        "TierModel",
        "TierTest",
    ),
    "docs/fdnas.md": ("FDNASResult", "DerivedNet"),
    "docs/dpfnas.md": ("DPFNASResult", "PartyPrivacy", "MechanismPrivacy"),
    "docs/decnas.md": ("DecNASResult", "GlobalModel"),
    "docs/fednas.md": ("FedNASResult",),
    "docs/latency.md": ("LatencyTable", "LatencyValidation"),
    "docs/baselines.md": ("WidthResult", "TierWidth"),
}
#: dataclasses exported from fedorasflwr.strategies that are no result: a node's profile, and
#: the methods' settings (each page's table of run-config keys documents them: a field is its
#: key in snake_case, a stage's recipe a ``TrainingRecipe``)
NOT_RESULTS = {
    "NodeProfile",
    "FedorASSettings",
    "FDNASSettings",
    "DPFNASSettings",
    "DecNASSettings",
    "FedNASSettings",
    "HeteroFLSettings",
    "FjORDSettings",
}


def documented_fields(page: str, name: str) -> list[str]:
    """The first column of the table that follows the line opening with ``**`name`**``."""
    lines = (ROOT / page).read_text().splitlines()
    heading = f"**`{name}`**"
    starts = [i for i, line in enumerate(lines) if line.startswith(heading)]
    assert len(starts) == 1, f"{page}: {len(starts)} lines start with {heading}, expected one"
    rows = []
    for line in lines[starts[0] + 1 :]:
        if rows and not line.startswith("|"):
            break
        if line.startswith("|"):
            rows.append(line)
    assert rows[:1] and rows[0].startswith("| field |"), f"{page}: no field table under {name}"
    names = [re.match(r"\| `(\w+)` \|", row) for row in rows[2:]]
    assert all(names), f"{page}: a row of {name}'s table does not open with a `field`"
    return [m.group(1) for m in names if m is not None]


def test_every_exported_result_dataclass_has_a_page():
    exported = {
        name
        for name in strategies.__all__
        if dataclasses.is_dataclass(getattr(strategies, name)) and name not in NOT_RESULTS
    }
    paged = {name for names in PAGES.values() for name in names}
    assert exported == paged
    for name in ("FedorASResult", "FDNASResult", "DPFNASResult", "DecNASResult"):
        assert name in strategies.__all__


@pytest.mark.parametrize(
    ("page", "name"), [(page, name) for page, names in PAGES.items() for name in names]
)
def test_every_field_is_documented_in_its_page(page, name):
    fields = [f.name for f in dataclasses.fields(getattr(strategies, name))]
    documented = documented_fields(page, name)
    missing = [f for f in fields if f not in documented]
    stale = [f for f in documented if f not in fields]
    assert not missing and not stale, f"{page} {name}: undocumented {missing}, not fields {stale}"
    assert len(documented) == len(set(documented)), f"{page} {name}: a field twice"
