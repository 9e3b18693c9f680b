"""The layout is part of the product: dependencies point one way, down, with no cycle.

Every import in dt/ (function-local ones included: a cycle hidden in a
function body is still a cycle) is read from the source, and three rules
are checked:

1. layers: a module imports only from its own layer or the ones below it;
2. no cycle between modules;
3. no private cross-import: nothing named `_x` is taken from another module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dt"

# Bottom up. A module may import from any layer at or below its own.
LAYERS = [
    ("dt.layout", "dt.hosts", "dt.units", "dt.args"),  # index arithmetic, units, what people type: no torch
    ("dt.cost",),  # what things cost, as arithmetic; the saved machine figures
    ("dt.device", "dt.device_memory"),  # one device per rank; timing and live bytes true on a GPU
    ("dt.transport",),  # the wire
    ("dt.launcher",),  # processes and process groups
    ("dt.collectives",),  # every collective, from the wire
    ("dt.backend",),  # dt as a torch.distributed backend ("dt"), on the collectives
    ("dt", "dt.parallel"),  # the parallelisms; `dt` itself re-exports collectives and the mesh
    ("dt.record",),  # a command's run kept as a dated record (benchmarks/): every command's --record
    ("dt.models",),
    ("dt.train",),
    ("dt.plan",),  # `dt plan`: the whole-step model, on the trainer's rules
    ("dt.bench",),
    ("dt.learn",),  # exercises, the judge, the quiz: on top of everything they teach
    ("dt.tools", "dt.__main__"),
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> int:
    best, found = -1, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            inside = module == name or (name != "dt" and module.startswith(name + "."))
            if inside and len(name) > best:
                best, found = len(name), i
    assert found >= 0, f"{module} belongs to no layer: add it to LAYERS"
    return found


def _resolve(module: str, name: str | None) -> str:
    """The most specific dt module an import names (`from dt.x import y`: dt.x.y if it is one)."""
    if name is not None and f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    return module


def _imports(module: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(imported dt module, names taken from it, line) for every import in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "dt" or alias.name.startswith("dt."):
                    out.append((alias.name, [], node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base == "dt" or base.startswith("dt."):
                for alias in node.names:
                    out.append((_resolve(base, alias.name), [alias.name], node.lineno))
    return out


EDGES = {m: _imports(m, p) for m, p in MODULES.items()}


def test_every_module_has_a_layer():
    for m in MODULES:
        _layer(m)


def test_dependencies_point_down():
    wrong = []
    for m, imports in EDGES.items():
        for target, _, line in imports:
            if target in MODULES and _layer(target) > _layer(m):
                wrong.append(f"{MODULES[m].relative_to(ROOT)}:{line}: {m} (layer {_layer(m)}) imports "
                             f"{target} (layer {_layer(target)})")
    assert not wrong, "imports that point up:\n" + "\n".join(wrong)


def test_no_import_cycles():
    graph = {m: {t for t, _, _ in imports if t in MODULES and t != m} for m, imports in EDGES.items()}
    # A package's __init__ importing its children is how packages work; a child
    # importing its own package's __init__ back would be the cycle.
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_private_cross_imports():
    wrong = []
    for m, imports in EDGES.items():
        for target, names, line in imports:
            for name in names:
                if name.startswith("_") and not name.startswith("__") and target != m:
                    wrong.append(f"{MODULES[m].relative_to(ROOT)}:{line}: {name} from {target}")
    # module._private through an imported module
    for path in MODULES.values():
        tree = ast.parse(path.read_text())
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dt"):
                for a in node.names:
                    if f"{node.module}.{a.name}" in MODULES:
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("dt") and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: "
                             f"{node.value.id}.{node.attr} ({aliases[node.value.id]})")
    assert not wrong, "private names used across modules:\n" + "\n".join(wrong)


@pytest.mark.parametrize("old", sorted(__import__("dt").MOVED))
def test_moved_modules_keep_their_old_import_path(old):
    import importlib

    import dt

    assert importlib.import_module(old) is importlib.import_module(dt.MOVED[old])


def test_files_stay_short():
    """A reader's budget: no file in dt/ over 500 lines (the goal is ~400)."""
    long = {str(p.relative_to(ROOT)): n for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, f"files past a reader's budget: {long}"
