"""Every test checks something: each ``def test_*`` under tests/ holds an assertion (issue 53 item 7).

A test that runs code and checks nothing passes whatever the code does. What counts as a check, read from the
test's own body (nested functions included):

- an ``assert`` statement;
- ``pytest.raises``, ``pytest.warns``, ``pytest.deprecated_call`` or ``pytest.fail``;
- a call of a helper named ``assert_*``, ``check_*`` or ``expect_*`` (a leading underscore allowed; the bare
  names ``expect`` and ``check`` too), such as ``np.testing.assert_allclose`` or the serving tests' ``expect``.

A helper that checks under another name is not seen; rename it, or list the test in ``EXCEPTIONS`` with the
reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PYTEST_CHECKS = frozenset({"raises", "warns", "deprecated_call", "fail"})
HELPER_WORDS = ("assert", "check", "expect")
EXCEPTIONS: dict[str, str] = {}  # "path/relative/to/tests.py::test_name" -> why it checks without an assertion


def _is_check(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute):
        name = func.attr
        if isinstance(func.value, ast.Name) and func.value.id == "pytest" and name in PYTEST_CHECKS:
            return True
    elif isinstance(func, ast.Name):
        name = func.id
    else:
        return False
    bare = name.lstrip("_")
    return any(bare == word or bare.startswith(f"{word}_") for word in HELPER_WORDS)


def _checks(test: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(node, ast.Assert) or (isinstance(node, ast.Call) and _is_check(node))
               for node in ast.walk(test))


def unchecked_tests(root: Path = TESTS) -> list[str]:
    """``path::name`` of each test function under ``root`` whose body checks nothing."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_") \
                    and not _checks(node):
                found.append(f"{path.relative_to(root).as_posix()}::{node.name}")
    return found


def test_every_test_function_asserts_something() -> None:
    unchecked = [t for t in unchecked_tests() if t not in EXCEPTIONS]
    assert not unchecked, "tests that check nothing (add an assert, or see this module's doc):\n" + \
        "\n".join(unchecked)


def test_the_exceptions_still_exist_and_still_need_listing() -> None:
    stale = set(EXCEPTIONS) - set(unchecked_tests())
    assert not stale, f"listed as exceptions but gone or checking now: {sorted(stale)}"


def test_the_reader_tells_checking_tests_from_the_others(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(
        "import numpy as np\nimport pytest\n\n"
        "def test_asserts():\n    assert 1\n\n"
        "def test_raises():\n    with pytest.raises(ValueError):\n        int('x')\n\n"
        "def test_helper():\n    np.testing.assert_array_equal([1], [1])\n\n"
        "def test_nested():\n    def inner():\n        assert True\n    inner()\n\n"
        "def test_private_checker():\n    _check_answer(1)\n\n"
        "async def test_nothing_async():\n    print('ran')\n\n"
        "def test_nothing():\n    check_list = [1]\n    print(check_list)\n\n"
        "def test_other_pytest_call():\n    pytest.importorskip('numpy')\n")
    assert unchecked_tests(tmp_path) == ["test_sample.py::test_nothing_async", "test_sample.py::test_nothing",
                                         "test_sample.py::test_other_pytest_call"]
