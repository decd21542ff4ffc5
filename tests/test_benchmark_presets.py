"""The README's preset table quotes ``benchmarks/presets.py``'s recorded run (or a later
``--only`` rerun of a preset): every preset is
in it, each row's seconds and load are that run's, and the figures a row gives for a model are
in that run's points (the run itself is the suite's ``tests/presets``, not repeated here)."""

from __future__ import annotations

import json
import re

import pytest

from tests.test_benchmarks import ROOT

#: the reruns written before result files recorded when they finished (``machine``'s
#: ``finished``, since 2026-12-07), oldest first: the dates of the commits that added them
UNDATED_RERUNS = (
    "presets.heterofl-fjord.json",  # 2026-12-02 08:53
    "presets.fednas-dpfnas.json",  # 2026-12-06 15:14
    "presets.fdnas-cfdnas.json",  # 2026-12-06 19:14
    "presets.cfdnas.json",  # 2026-12-06 23:44
)


def reruns() -> list[dict]:
    """Every later rerun of some presets (``presets.py --only <name>``:
    ``presets.<name>.json``), oldest first: the undated ones in their commits' order, then
    the dated by ``machine.finished``."""
    found = {
        path.name: json.loads(path.read_text())
        for path in (ROOT / "benchmarks/results").glob("presets.*.json")
        if not path.name.endswith(".quick.json")
    }
    undated = sorted(name for name, saved in found.items() if "finished" not in saved["machine"])
    assert undated == sorted(UNDATED_RERUNS), "a new rerun must record when it finished"
    dated = sorted(
        (saved for saved in found.values() if "finished" in saved["machine"]),
        key=lambda saved: saved["machine"]["finished"],
    )
    return [found[name] for name in UNDATED_RERUNS] + dated


SAVED = json.loads((ROOT / "benchmarks/results/presets.json").read_text())
ROWS = {row["preset"]: row for row in SAVED["rows"]}
for rerun in reruns():  # a later rerun replaces its presets' rows
    ROWS |= {row["preset"]: row for row in rerun["rows"]}
README = (ROOT / "README.md").read_text()


def readme_row(preset: str) -> str:
    lines = [line for line in README.splitlines() if f"`configs/quick-{preset}.toml`" in line]
    assert len(lines) == 1, preset
    return lines[0]


def test_every_preset_ran_and_is_in_the_readme() -> None:
    configs = sorted(p.stem.removeprefix("quick-") for p in (ROOT / "configs").glob("quick-*.toml"))
    assert sorted(ROWS) == configs
    assert all(row["exit"] == 0 and row["points"] for row in ROWS.values())


@pytest.mark.parametrize("preset", sorted(ROWS))
def test_the_readme_row_quotes_the_recorded_run(preset: str) -> None:
    row = ROWS[preset]
    line = readme_row(preset)
    seconds, load = re.search(r"\| (\d+) \(([\d.]+)\) \|$", line).groups()
    assert abs(int(seconds) - row["seconds"]) <= 0.5, (seconds, row["seconds"])
    assert float(load) == pytest.approx(row["load-before"][0], abs=0.05)
    recorded = {  # on the global test set, or on the model's own clients (CFDNAS's clusters)
        f"{p[key]:.{digits}f}"
        for p in row["points"]
        for key in ("global_test_accuracy", "test_accuracy")
        for digits in (2, 3)
        if p[key] is not None
    }
    quoted = set(re.findall(r"0\.\d{2,3}(?= on |,|\)| at| down|;|-)", line))
    accuracy = {q for q in quoted if q in recorded}
    assert accuracy, f"{preset}: no recorded accuracy quoted in {line!r}"
