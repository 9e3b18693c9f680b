"""`pip install .` (not only -e) must ship every module, so `dt bench ...` works from any install.

A folder of dt/ without __init__.py is a namespace package: an editable install
still imports it from the checkout, but setuptools' find_packages skips it and
the wheel goes out without it. These checks are static and take milliseconds;
CI's `dt bench scaling --quick` runs the real thing.
"""

from __future__ import annotations

import fnmatch
import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _package_dirs() -> set[str]:
    """Every folder under dt/ that holds Python files, as a dotted package name."""
    return {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "dt").rglob("*.py")
            if "__pycache__" not in p.parts}


def test_every_folder_of_dt_is_a_package():
    missing = sorted(d for d in _package_dirs() if not (ROOT / d.replace(".", "/") / "__init__.py").is_file())
    assert not missing, f"folders without __init__.py (left out of a wheel): {missing}"


def test_find_packages_ships_every_folder():
    setuptools = pytest.importorskip("setuptools")
    tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else None
    include = ["dt*"]
    if tomllib is not None:
        cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
        include = cfg["tool"]["setuptools"]["packages"]["find"]["include"]
    found = set(setuptools.find_packages(where=str(ROOT), include=include))
    assert {"dt.bench", "dt.bench.scaling", "dt.bench.scaling.tables", "dt.tools"} <= found
    assert _package_dirs() <= found, f"not packaged: {sorted(_package_dirs() - found)}"


def test_console_script_and_benches_resolve():
    tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else None
    if tomllib is not None:
        scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
        module, _, func = scripts["dt"].partition(":")
        assert callable(getattr(importlib.import_module(module), func))
    from dt.tools.cli import BENCHES

    for name, module in BENCHES.items():
        assert callable(importlib.import_module(module).main), name
        assert module.startswith("dt."), f"bench {name} lives outside the package: {module}"


def test_every_table_file_is_registered():
    from dt.bench.scaling.tables import TABLES

    files = sorted(p.stem for p in (ROOT / "dt/bench/scaling/tables").glob("t*_*.py"))
    ids = sorted(int(re.match(r"t(\d+)_", f).group(1)) for f in files)
    assert ids == sorted(TABLES), "a table file's number and its SPEC.id must agree"
    for f in files:
        spec = importlib.import_module(f"dt.bench.scaling.tables.{f}").SPEC
        assert f.startswith(f"t{spec.id}_") and spec.title and callable(spec.build)


def test_data_files_are_declared_package_data():
    """A JSON file in dt/ ships only if pyproject's package-data names it: find_packages takes .py only."""
    tomllib = pytest.importorskip("tomllib")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    data = [p for p in (ROOT / "dt").rglob("*.json") if "__pycache__" not in p.parts]
    assert data, "no data files found under dt/"
    for path in data:
        package = ".".join(path.parent.relative_to(ROOT).parts)
        patterns = declared.get(package, [])
        assert any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns), (
            f"{path.relative_to(ROOT)} is not in [tool.setuptools.package-data] {package!r}: "
            "a wheel leaves it out")
