"""The package's import graph, read from the source with `ast` (every import counts, lazy and TYPE_CHECKING ones
included): no import cycle at all (across packages or inside one), and the packages keep their boundaries
(`diffuserve.distributed` knows process groups and channels only, never the engine or the model)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import diffuserve

ROOT = Path(diffuserve.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module an `from X import ...` names (relative imports resolved against `module`)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    """{module: the diffuserve modules it imports}. `from pkg import name` counts as importing `pkg.name` when
    that is a module, else `pkg`."""
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(node, module, path.name == "__init__.py")
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    targets.add(submodule if submodule in paths else source)
        graph[module] = {t for t in targets if t in paths and t != module}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components (iterative); a component of more than one module is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    components.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components


def _package(module: str) -> str:
    return module.rsplit(".", 1)[0] if (ROOT.parent / module.replace(".", "/")).with_suffix(".py").is_file() else module


def test_the_checker_finds_a_cycle_by_hand():
    graph = {"a.x": {"b.y"}, "b.y": {"c.z"}, "c.z": {"a.x"}, "d": {"a.x"}}
    assert sorted(map(sorted, (c for c in strongly_connected(graph) if len(c) > 1))) == [["a.x", "b.y", "c.z"]]
    assert all(len(c) == 1 for c in strongly_connected({"a": {"b"}, "b": set()}))


def test_the_graph_sees_lazy_imports():
    graph = import_graph()
    assert "diffuserve.engine.engine_setup" in graph["diffuserve.engine.llm_engine"]
    assert graph["diffuserve.cli.serve"] >= {"diffuserve.engine.llm_engine"}  # imported inside run()


def test_no_import_cycle_crosses_packages():
    crossing = [sorted(c) for c in strongly_connected(import_graph()) if len({_package(m) for m in c}) > 1]
    assert crossing == [], f"import cycles through several packages: {crossing}"


def test_no_import_cycle_inside_a_package():
    """Not even between two modules of one package: a module's dependencies form a tree a reader can follow."""
    cycles = [sorted(c) for c in strongly_connected(import_graph()) if len(c) > 1]
    assert cycles == [], f"import cycles: {cycles}"


BOUNDARIES = [  # (package, packages it must never import), from docs/architecture.md
    ("diffuserve.distributed", ("diffuserve.engine", "diffuserve.model")),
    ("diffuserve.model", ("diffuserve.engine", "diffuserve.server")),
    ("diffuserve.server", ("diffuserve.model",)),
    ("diffuserve.planner", ("diffuserve.engine", "diffuserve.server")),  # model/config.py is stdlib-only, shared
]


@pytest.mark.parametrize(("package", "forbidden"), BOUNDARIES)
def test_package_boundaries(package, forbidden):
    leaks = {
        module: sorted(t for t in targets if t.startswith(forbidden))
        for module, targets in import_graph().items()
        if module.startswith(package)
    }
    assert {m: t for m, t in leaks.items() if t} == {}
