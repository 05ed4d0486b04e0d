"""The import graph of src/hybrid, built with grimp (the library import-linter reads it with).

Beyond the layer contracts of pyproject's [tool.importlinter], which see only what sits above what:
nothing inside the package reaches the facade (``import hybrid``, whose lazy ``__getattr__`` hides what it
resolves from the contracts) but the CLI and ``__main__``; and no two modules import each other, directly
or around a circle, function-level and type-checking imports included, but through the one upward edge
DESIGN 2.9 writes down: ``CompiledModel.save`` writing a bundle.
"""

from __future__ import annotations

import grimp
import pytest

# the modules that may use the public facade (``import hybrid``): the command line sits above it
FACADE_USERS = ("hybrid.__main__", "hybrid.cli")
# the one circle allowed: CompiledModel.save (DESIGN 2.9 ``cm.save(path)``) writes a bundle, whose format lives
# above the runtime (pyproject's ignore_imports lists it too)
ALLOWED_CYCLE_EDGES = (("hybrid.runtime.compiled", "hybrid.bundle"),)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    # type-checking imports included: a circle a type checker walks is a circle too; no cache (a cache
    # written by another checkout of the same files can be stale)
    return grimp.build_graph("hybrid", exclude_type_checking_imports=False, cache_dir=None)


def test_only_the_cli_imports_the_facade(graph: grimp.ImportGraph) -> None:
    users = graph.find_modules_that_directly_import("hybrid")
    inside = sorted(m for m in users if not any(m == u or m.startswith(u + ".") for u in FACADE_USERS))
    assert not inside, (f"{inside} import the facade (`import hybrid`); call the function's home module "
                        "instead (hybrid.api, hybrid.config, hybrid.runtime.compiler...)")


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles(graph: grimp.ImportGraph) -> None:
    modules = {m for m in graph.modules if m == "hybrid" or m.startswith("hybrid.")}
    edges = {m: {t for t in graph.find_modules_directly_imported_by(m) if t in modules} for m in modules}
    for importer, imported in ALLOWED_CYCLE_EDGES:
        assert imported in edges[importer], f"{importer} -> {imported} is gone: drop it from ALLOWED_CYCLE_EDGES"
        edges[importer].discard(imported)
    circles = _circles(edges)
    shown = []
    for members in circles:
        inside = set(members)
        pairs = [f"{a} -> {b}" for a in members for b in sorted(edges[a] & inside)]
        shown.append("; ".join(pairs))
    assert not circles, "import circles (the edges among each circle's modules):\n" + "\n".join(shown)


def test_the_circle_finder_finds_circles() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
