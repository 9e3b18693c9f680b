"""`python -m pytest -m quick` (tests/conftest.py) names tests that exist.

A test renamed or removed would otherwise leave the quick subset silently. Names are read from
the source; a parameter (test[2]) from the session's own collection, where its file was collected
(the full suite: every file).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import QUICK_FILES, QUICK_TESTS

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.quick


def _tests(file: str) -> set[str]:
    body = ast.parse((HERE / file).read_text()).body
    return {node.name for node in body if isinstance(node, ast.FunctionDef) and node.name.startswith("test")}


def test_every_quick_file_and_left_out_test_exists():
    for file, left_out in QUICK_FILES.items():
        assert (HERE / file).is_file(), f"QUICK_FILES names {file}: no such file"
        missing = set(left_out) - _tests(file)
        assert not missing, f"QUICK_FILES leaves out {sorted(missing)}: not tests of {file}"


def test_every_quick_test_exists():
    for name in QUICK_TESTS:
        file, _, test = name.partition("::")
        assert (HERE / file).is_file(), f"QUICK_TESTS names {name}: no file {file}"
        assert test.split("[")[0] in _tests(file), f"QUICK_TESTS names {name}: no such test in {file}"


def test_every_quick_parameter_is_one_the_session_collected(request):
    collected = {f"{Path(str(item.path)).name}::{item.name}" for item in request.session.items}
    files = {name.partition("::")[0] for name in collected}
    for name in QUICK_TESTS:
        if "[" in name and name.partition("::")[0] in files:
            assert name in collected, f"QUICK_TESTS names {name}: its file has no such parameter"
