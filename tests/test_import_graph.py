"""The import graph of src/hybrid, built with grimp (the library import-linter reads it with).

Beyond the layer contracts of pyproject's [tool.importlinter], which see only what sits above what:
nothing inside the package reaches the facade (``import hybrid``, whose lazy ``__getattr__`` hides what it
resolves from the contracts) but the CLI and ``__main__``.
"""

from __future__ import annotations

import grimp
import pytest

# the modules that may use the public facade (``import hybrid``): the command line sits above it
FACADE_USERS = ("hybrid.__main__", "hybrid.cli")


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
