"""The typed public surface: every public name of ``hybrid`` visible to a type checker with its real type,
and pyright's type-completeness figure for the package kept from falling."""

from __future__ import annotations

import ast
import importlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import hybrid

# pyright --verifytypes hybrid --ignoreexternal, measured when this check was added (docs/typing.md);
# raise these when the surface improves, never lower them to let a change through
COMPLETENESS_FLOOR = 0.85  # measured 0.864 (2314 of 2677 exported symbols fully known), less a margin
TOP_LEVEL_KNOWN_FLOOR = 35  # names of hybrid.__all__ whose type pyright knows completely (of 45 + __version__)

EAGER = {"HybridError", "ConfigError", "ModelError", "BackendError", "RunError", "BundleError", "QuantizationError",
         "ServingError", "__version__"}


def _type_checking_imports() -> dict[str, str]:
    """Public name -> "module:attribute" for each import in hybrid/__init__.py's ``if TYPE_CHECKING:`` block."""
    tree = ast.parse(Path(hybrid.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING")
    found = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom), ast.dump(node)
        for alias in node.names:
            found[alias.asname or alias.name] = f"{node.module}:{alias.name}"
    return found


def _lazy_as_imports() -> dict[str, str]:
    """hybrid._LAZY in the same form ("hybrid.utils" is ``from hybrid import utils``)."""
    out = {}
    for name, target in hybrid._LAZY.items():
        module, _, attr = target.partition(":")
        out[name] = target if attr else f"{module.rpartition('.')[0]}:{module.rpartition('.')[2]}"
    return out


def test_every_lazy_name_is_visible_to_a_type_checker():
    assert _type_checking_imports() == _lazy_as_imports()


def test_all_lists_exactly_the_public_names():
    assert hybrid.__all__ == sorted(hybrid.__all__)
    assert set(hybrid.__all__) == EAGER | set(hybrid._LAZY)
    assert dir(hybrid) == sorted(hybrid.__all__)


def test_every_public_name_resolves_to_what_the_type_checker_sees():
    for name, target in _type_checking_imports().items():
        module, _, attr = target.partition(":")
        assert getattr(hybrid, name) is getattr(importlib.import_module(module), attr), name


def test_errors_and_returned_types_are_exported():
    assert all(issubclass(getattr(hybrid, n), hybrid.HybridError) for n in EAGER - {"__version__"})
    cm = hybrid.compile(_tiny(), target="reference")
    assert isinstance(cm, hybrid.CompiledModel) and isinstance(cm.plan, hybrid.Plan)
    assert all(isinstance(s, hybrid.Segment) for s in cm.plan.segments)
    assert all(isinstance(s, hybrid.TensorSpec) for s in cm.signature.inputs)
    assert isinstance(cm.signature, hybrid.Signature) and isinstance(hybrid.init(), hybrid.RuntimeConfig)
    assert all(isinstance(d, hybrid.Device) for d in hybrid.devices())


def _tiny():
    from tests._models import matmul_add

    return matmul_add()


# ------------------------------------------------------------------------------------- pyright --verifytypes
def _verifytypes(tmp_path: Path) -> dict:
    """pyright's --verifytypes report on the hybrid under test, or a skip when pyright cannot run here
    (the pip package fetches pyright's JavaScript through npm on first use unless it is cached)."""
    exe = shutil.which("pyright")
    if exe is None:
        pytest.skip("pyright is not installed (it is in the dev extra)")
    src = Path(hybrid.__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([exe, "--verifytypes", "hybrid", "--ignoreexternal", "--outputjson"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=500)
    start = run.stdout.find("{")
    if start < 0:
        pytest.skip(f"pyright did not run (exit {run.returncode}): {(run.stderr or run.stdout).strip()[:300]}")
    report = json.loads(run.stdout[start:])
    assert report["typeCompleteness"]["packageRootDirectory"] == str(src / "hybrid")
    return report["typeCompleteness"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_type_completeness_does_not_fall(tmp_path):
    report = _verifytypes(tmp_path)
    assert report["pyTypedPath"], "src/hybrid/py.typed marks the package as typed"
    score = report["completenessScore"]
    counts = report["exportedSymbolCounts"]
    assert score >= COMPLETENESS_FLOOR, f"type completeness fell to {score:.4f} ({counts})"
    top = {s["name"].removeprefix("hybrid."): s for s in report["symbols"] if s["name"].count(".") == 1}
    missing = set(hybrid.__all__) - {"__version__"} - set(top)
    assert not missing, f"public names a type checker cannot see: {sorted(missing)}"
    known = sorted(n for n in hybrid.__all__ if n in top and top[n]["isTypeKnown"] and not top[n]["isTypeAmbiguous"])
    assert len(known) >= TOP_LEVEL_KNOWN_FLOOR, f"only {len(known)} public names fully typed: {known}"
