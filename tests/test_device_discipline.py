"""One device per group: every buffer dt sends lives on its group's device.

NCCL moves only GPU tensors; a CPU tensor created inside a collective, a layer
or the trainer and then sent hangs or fails only on a GPU machine. So every
tensor factory call (torch.empty, zeros, tensor, ...) in the code that talks
to a group must say where the tensor goes (`device=`), or say why it stays on
the host with a `# host:` comment on its line. The tools and benchmarks,
which build their own inputs on the device they measure, are not checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FACTORIES = {"empty", "zeros", "ones", "full", "tensor", "arange", "randn", "rand", "randint", "as_tensor",
             "empty_strided", "frombuffer", "linspace"}
NOT_CHECKED = ("tools", "bench", "learn")


def _unplaced(path: Path, root: Path = ROOT) -> list[str]:
    lines = path.read_text().splitlines()
    out = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in FACTORIES and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "torch"
                and not any(k.arg == "device" for k in node.keywords)
                and "# host:" not in lines[node.lineno - 1]):
            out.append(f"{path.relative_to(root)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return out


def test_every_tensor_dt_makes_says_which_device():
    files = [p for p in sorted((ROOT / "dt").rglob("*.py"))
             if not any(part in NOT_CHECKED for part in p.relative_to(ROOT / "dt").parts)]
    unplaced = [line for p in files for line in _unplaced(p)]
    assert not unplaced, "tensors made without device= (or a '# host:' reason):\n" + "\n".join(unplaced)


def test_the_check_finds_an_unplaced_tensor(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nx = torch.zeros(3)\ny = torch.zeros(3, device='cpu')\n"
                   "z = torch.ones(2)  # host: only printed\n")
    assert _unplaced(bad, tmp_path) == ["bad.py:2: x = torch.zeros(3)"]
