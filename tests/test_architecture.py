"""The layout's rules (docs/architecture.md), checked on the source without importing it.

A static walk of every ``import`` in the project's packages (at any depth:
a function-level or ``TYPE_CHECKING`` import is a dependency too) checks
that there is no import circle among the project's modules, that imports run
down the layers of docs/architecture.md, that no module of the core
(``conformance/`` outside ``contracts/``, and ``chaos/``) imports a family
package, and that no family package imports another. Only explicit
imports count: importing ``a.b.c`` also runs ``a`` and ``a.b``, but a
package's ``__init__`` running before its submodules is how packages work,
not a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("conformance", "chaos", "reference_impl", "benchmarks")
FAMILIES = "conformance.contracts."
REGISTRY = "conformance.contracts"
#: The core: what every family uses (benchmarks and references may name families).
CORE = ("conformance", "chaos")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _imported(name: str, tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, module)`` for every project module ``name``'s source imports."""
    package = name if _is_package(name) else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _known(node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in MODULES:
                    yield node.lineno, submodule
                else:
                    yield from _known(node.lineno, base)


def _known(line: int, dotted: str) -> Iterator[tuple[int, str]]:
    """The longest project module ``dotted`` names (nothing for third-party modules)."""
    parts = dotted.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            yield line, candidate
            return
        parts.pop()


def _graph() -> dict[str, dict[str, int]]:
    graph: dict[str, dict[str, int]] = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: dict[str, int] = {}
        for line, target in _imported(name, tree):
            if target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


GRAPH = _graph()


def _family(module: str) -> str | None:
    """The family package a module belongs to (``conformance.contracts.p2p``), or ``None``."""
    if not module.startswith(FAMILIES):
        return None
    return FAMILIES + module[len(FAMILIES):].split(".")[0]


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        nonlocal counter
        work = [(start, iter(sorted(GRAPH[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(GRAPH[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    return found


def _layer(module: str) -> int | None:
    """The layer of docs/architecture.md a module sits in (higher imports lower)."""
    if module.startswith("reference_impl"):
        return 0
    if (module in ("conformance", "conformance.errors", "conformance.clauses",
                   "conformance.contract")
            or module.startswith(("conformance.supervision", "conformance.testing", "chaos"))
            or (_family(module) is not None and module.endswith((".clauses", ".contract")))):
        return 1
    if module == REGISTRY:
        return 2
    if (module.startswith(("conformance.config", "conformance.reporting", "conformance.drivers"))
            or module in ("conformance.selfcheck", "conformance.selfcheck.mutants")):
        return 3
    if _family(module) is not None:
        return 4
    if module.startswith("conformance.selfcheck"):
        return 5
    if module in ("conformance.cli", "conformance.plugin"):
        return 6
    if module.startswith("benchmarks"):
        return 7
    return None


def test_the_walk_sees_the_project() -> None:
    assert "conformance.cli" in GRAPH
    assert "conformance.contracts.p2p.contract" in GRAPH[REGISTRY]
    assert "conformance.supervision.watchdog" in GRAPH["conformance.contracts.p2p.harness"]


def test_no_import_circles() -> None:
    circles = _cycles()
    described = [
        "; ".join(f"{m}:{GRAPH[m][n]} imports {n}" for m in circle
                  for n in GRAPH[m] if n in circle)
        for circle in circles
    ]
    assert not circles, "import circles (the imports within each):\n" + "\n".join(described)


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in GRAPH if _layer(m) is None]
    assert not unplaced, f"modules outside the layers of docs/architecture.md: {unplaced}"


def test_imports_run_down_the_layers() -> None:
    upwards = [
        f"{module}:{line} (layer {_layer(module)}) imports {target} (layer {_layer(target)})"
        for module, edges in GRAPH.items()
        for target, line in edges.items()
        if (_layer(target) or 0) > (_layer(module) or 0)
    ]
    assert not upwards, "imports against the layers:\n" + "\n".join(upwards)


def test_the_core_names_no_family() -> None:
    offenders = [
        f"{module}:{line} imports {target}"
        for module, edges in GRAPH.items()
        if module.split(".")[0] in CORE and _family(module) is None and module != REGISTRY
        for target, line in edges.items()
        if _family(target) is not None
    ]
    assert not offenders, "the core reaches families only through the registry:\n" + "\n".join(
        offenders
    )


def test_the_core_imports_no_reference_implementation() -> None:
    """A reference implementation is one family's contract in code: the core (the
    driver bridge and the Python driver included) reaches it only through a family."""
    offenders = [
        f"{module}:{line} imports {target}"
        for module, edges in GRAPH.items()
        if module.split(".")[0] in CORE and _family(module) is None and module != REGISTRY
        for target, line in edges.items()
        if target.startswith("reference_impl")
    ]
    assert not offenders, "the core names a reference implementation:\n" + "\n".join(
        offenders
    )


def test_the_core_names_no_family_in_a_string() -> None:
    """``MODULE:ATTR`` strings that name a family or a reference belong in the registry
    (or a family); a core module with one would reach a family past the import walk."""
    offenders = []
    for module, path in MODULES.items():
        if module.split(".")[0] not in CORE or _family(module) is not None or module == REGISTRY:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and node.value.startswith((FAMILIES, "reference_impl"))
                    and ":" in node.value and " " not in node.value):
                offenders.append(f"{module}:{node.lineno} {node.value!r}")
    assert not offenders, "the core names a family's code by string:\n" + "\n".join(offenders)


def test_no_family_imports_another() -> None:
    offenders = [
        f"{module}:{line} imports {target}"
        for module, edges in GRAPH.items()
        if (own := _family(module)) is not None
        for target, line in edges.items()
        if _family(target) not in (None, own)
    ]
    assert not offenders, "a family imports another family:\n" + "\n".join(offenders)


@pytest.mark.parametrize("family", sorted({f for m in GRAPH if (f := _family(m))}))
def test_each_family_has_its_registry_entry(family: str) -> None:
    assert f"{family}.clauses" in GRAPH[REGISTRY] or any(
        target.startswith(f"{family}.") for target in GRAPH[REGISTRY]
    )
