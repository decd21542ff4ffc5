"""The package's layout rules, checked on its import statements (``ast``, nothing imported).

- a server module (``federation``, ``runs``, a method's modules but ``client.py``, ``server_app``,
  the ``strategies`` re-exports) reaches no client module (a method's ``client.py``,
  ``client_app``, the ``clients`` re-exports), directly or through other modules;
- a method's package reaches no other method's package;
- no import circles: every import counts, including those inside functions and
  under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fedorasflwr"
ROOT = PACKAGE.name


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return modules()[name].name == "__init__.py"


@cache
def imports(name: str) -> frozenset[str]:
    """The package's modules that module ``name`` imports (any import statement in it)."""
    known = modules()
    tree = ast.parse(known[name].read_text(), filename=str(known[name]))
    package = name if _is_package(name) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # ``from pkg import sub`` imports the module ``pkg.sub`` when there is one
            targets = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                for alias in node.names
            ]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return frozenset(found)


def reachable(start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in imports(todo.pop()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _method(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "methods" else None


def is_client(name: str) -> bool:
    return (
        name.endswith(".client")
        and _method(name) is not None
        or name in (f"{ROOT}.client_app", f"{ROOT}.clients")
    )


def is_server(name: str) -> bool:
    if is_client(name):
        return False
    top = name.split(".")[1] if "." in name else ""
    return top in ("federation", "runs", "server_app", "strategies") or _method(name) is not None


def test_the_walk_sees_the_layout() -> None:
    names = set(modules())
    assert {f"{ROOT}.federation.base", f"{ROOT}.training", f"{ROOT}.server_app"} <= names
    for method in ("fedoras", "decnas", "fdnas", "dpfnas", "fednas"):
        assert f"{ROOT}.methods.{method}.strategy" in names
        assert is_client(f"{ROOT}.methods.{method}.client")
    assert f"{ROOT}.methods.fedoras.client" in reachable(f"{ROOT}.client_app")
    assert f"{ROOT}.methods.fedoras.strategy" in reachable(f"{ROOT}.methods.fedoras.runner")


def test_the_server_app_is_a_thin_dispatcher() -> None:
    """server_app imports no method: it names each method's runner by import path, a
    server module of that method, imported when the method runs."""
    from fedorasflwr.server_app import RUNNERS

    assert [m for m in reachable(f"{ROOT}.server_app") if _method(m)] == []
    for method, path in RUNNERS.items():
        module = path.partition(":")[0]
        assert module in modules() and is_server(module), (method, path)
        package = {"cfdnas": "fdnas", "heterofl": "widths", "fjord": "widths"}.get(method, method)
        assert _method(module) == package


def test_no_server_module_reaches_a_client_module() -> None:
    offences = {
        name: sorted(filter(is_client, reachable(name))) for name in modules() if is_server(name)
    }
    assert {k: v for k, v in offences.items() if v} == {}


def test_no_method_reaches_another_method() -> None:
    offences = {}
    for name in modules():
        method = _method(name)
        others = {m for m in map(_method, reachable(name)) if m not in (None, method)}
        if method is not None and others:
            offences[name] = sorted(others)
    assert offences == {}


def circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in imports(name):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == name:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in modules():
        if name not in index:
            visit(name)
    return found


def test_no_import_circles() -> None:
    assert circles() == []


def test_every_seeded_generator_comes_from_the_named_streams():
    """One seeding helper: no module but ``seeding`` makes a generator or seeds torch itself
    (``default_rng``, ``manual_seed``, ``Generator``); the others name a purpose."""
    makers = {"default_rng", "manual_seed", "Generator", "RandomState", "seed"}
    found = []
    for name, path in modules().items():
        if name == f"{ROOT}.seeding":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = ast.unparse(node.func.value)
                if node.func.attr in makers and owner.split(".")[0] in {"np", "numpy", "torch"}:
                    found.append(f"{name}:{node.lineno} {ast.unparse(node.func)}")
    assert found == []


#: what names a method: its package's name in any spelling (FedorAS, FDNAS, DP-FNAS, ...)
METHOD_WORDS = ("fedoras", "fdnas", "dpfnas", "decnas", "fednas", "heterofl", "fjord")


def is_shared(name: str) -> bool:
    """A module every method shares: not a method's own, nor a layer that re-exports
    the methods (``strategies``, ``clients``), nor the methods' index (``methods``)."""
    top = name.split(".")[1] if "." in name else ""
    return top not in ("methods", "strategies", "clients")


def method_names(path: Path) -> set[str]:
    """The identifiers of a module (defined, imported, used as names or attributes) that
    name a method; strings (a dispatch table's method names) are not identifiers."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.alias):
            names = [node.asname or node.name.rpartition(".")[2]]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        else:
            continue
        found.update(n for n in names if any(w in n.lower() for w in METHOD_WORDS))
    return found


def test_the_method_name_check_sees_a_method_name(tmp_path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from x import FedorASSettings\ndef plot_dpfnas(): return 'fdnas'\n")
    assert method_names(probe) == {"FedorASSettings", "plot_dpfnas"}


def test_no_method_specific_name_in_shared_modules() -> None:
    """Each method is whole in its folder: its settings, message types, plots and summary
    live in ``methods/<method>/``; a shared module names no method (a method is reached by
    its name as data: ``server_app.RUNNERS``, ``methods.SETTINGS``)."""
    offences = {
        name: sorted(method_names(path))
        for name, path in modules().items()
        if is_shared(name) and method_names(path)
    }
    assert offences == {}
