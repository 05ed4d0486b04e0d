"""The import graph of src/hybrid: grimp's (the library import-linter reads it with) and one read here from the source.

Beyond the layer contracts of pyproject's [tool.importlinter], which see only what sits above what:
nothing inside the package reaches the facade (``import hybrid``, whose lazy ``__getattr__`` hides what it
resolves from the contracts) but the CLI and ``__main__``; and no two modules import each other, directly
or around a circle, with no exception: function-level imports count (a lazy import still ties two modules
together for a reader), in grimp's graph (type-checking imports included) and in the one built here by
walking every module's syntax tree (every ``import`` and ``from ... import`` at any depth, but those under
``if TYPE_CHECKING:``, which never run), so the check does not rest on one library's reading alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

import hybrid

# the modules that may use the public facade (``import hybrid``): the command line sits above it
FACADE_USERS = ("hybrid.__main__", "hybrid.cli")
SRC = Path(hybrid.__file__).parent


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
    _assert_no_circles(edges)


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Every module under ``root`` (the ``hybrid`` package folder): dotted name -> (file, is a package)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imported_names(module: str, package: bool, tree: ast.Module) -> set[str]:
    """The dotted names ``tree`` imports at any depth (functions, methods, branches) but ``if TYPE_CHECKING:``."""
    names: set[str] = set()
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            todo.extend(node.orelse)  # the else branch runs
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per extra dot
                anchor = module.split(".") if package else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # ``from x import y``: module x.y when there is one, else attribute y of x (resolved by the caller)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        todo.extend(ast.iter_child_nodes(node))
    return names


def _source_graph(root: Path) -> dict[str, set[str]]:
    """hybrid's modules -> the hybrid modules each imports, read from the source (see the module docstring)."""
    modules = _modules(root)

    def owner(name: str) -> str | None:  # the module ``name`` is, or the one that defines it (its longest prefix)
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {}
    for module, (path, package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found = {owner(n) for n in _imported_names(module, package, tree) if n == "hybrid" or n.startswith("hybrid.")}
        edges[module] = {m for m in found if m is not None and m != module}
    return edges


def _assert_no_circles(edges: dict[str, set[str]]) -> None:
    circles = _circles(edges)
    shown = []
    for members in circles:
        inside = set(members)
        pairs = [f"{a} -> {b}" for a in members for b in sorted(edges[a] & inside)]
        shown.append("; ".join(pairs))
    assert not circles, "import circles (the edges among each circle's modules):\n" + "\n".join(shown)


def test_no_import_circles_read_from_the_source() -> None:
    edges = _source_graph(SRC)
    # function-level imports are read: the reference backend imports the optimizer's rules at its first compile
    assert "hybrid.passes.fuse" in edges["hybrid.backends.reference.backend"], "a function-level import was lost"
    _assert_no_circles(edges)


def test_the_source_reading_sees_lazy_and_relative_imports_but_not_type_checking_ones(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.c\n"
                               "def f():\n    from pkg.sub import b\n")
    (root / "c.py").write_text("")
    (root / "sub" / "__init__.py").write_text("from . import b\n")
    (root / "sub" / "b.py").write_text("from .. import a\n")
    modules = _modules(root)
    assert set(modules) == {"pkg", "pkg.a", "pkg.c", "pkg.sub", "pkg.sub.b"}
    read = {m: _imported_names(m, pkg, ast.parse(p.read_text())) for m, (p, pkg) in modules.items()}
    assert "pkg.sub.b" in read["pkg.a"] and "pkg.c" not in read["pkg.a"]
    assert "pkg.sub.b" in read["pkg.sub"] and "pkg.a" in read["pkg.sub.b"]


def test_the_circle_finder_finds_circles() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
