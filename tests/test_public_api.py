"""The public API is what the docs show: every ``from fedorasflwr... import ...`` line in
README.md, docs/ and the examples' READMEs imports, a name that moved still imports from its
old path with a ``DeprecationWarning``, and the package's version is the one in
pyproject.toml and CHANGELOG.md."""

from __future__ import annotations

import importlib
import re
import tomllib
import warnings
from pathlib import Path

import pytest

import fedorasflwr
from fedorasflwr import config

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCS += sorted((ROOT / "examples").glob("*/README.md"))
#: ``from fedorasflwr[.x] import A, B as C`` (one line; a trailing comment allowed)
IMPORT = re.compile(r"from (fedorasflwr[\w.]*) import ([\w ,]+?)\s*(?:#|`|$|\))", re.MULTILINE)


def doc_imports() -> list[tuple[str, str, str]]:
    """``(doc, module, name)`` for every name a doc imports from this package."""
    out = set()
    for doc in DOCS:
        for module, names in IMPORT.findall(doc.read_text()):
            for name in names.split(","):
                name = name.split(" as ")[0].strip()
                if name and name != "...":
                    out.add((doc.name, module, name))
    return sorted(out)


def test_the_docs_import_something() -> None:
    found = doc_imports()
    assert len(found) >= 20, found  # the pattern still reads the docs
    assert ("README.md", "fedorasflwr.strategies", "FedorAS") in found


@pytest.mark.parametrize(("doc", "module", "name"), doc_imports())
def test_every_name_the_docs_import_imports(doc: str, module: str, name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # a doc shows no deprecated path
        warnings.filterwarnings("ignore", module="(click|typer|flwr).*")
        imported = importlib.import_module(module)
    assert hasattr(imported, name), f"{doc}: from {module} import {name}"


@pytest.mark.parametrize("old", sorted(config.MOVED))
def test_a_moved_name_still_imports_from_its_old_path_with_a_warning(old: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"fedorasflwr.config.{old} moved"):
        value = getattr(config, old)
    module, name = config.MOVED[old].split(":")
    assert value is getattr(importlib.import_module(module), name)


def test_the_settings_classes_old_import_path_is_the_same_class() -> None:
    from fedorasflwr.strategies import DecNASSettings

    with pytest.warns(DeprecationWarning):
        from fedorasflwr.config import DecNASSettings as OldPath
    assert OldPath is DecNASSettings


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NotAName'"):
        config.NotAName  # noqa: B018


def test_the_version_is_one_in_pyproject_and_the_changelog() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert fedorasflwr.__version__ == project["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", fedorasflwr.__version__)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{fedorasflwr.__version__}]" in changelog
