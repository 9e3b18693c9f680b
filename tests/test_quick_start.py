"""The README's quick start: two commands do all the set-up, and every `dt` command it names exists."""

from __future__ import annotations

import re
from pathlib import Path

from dt.tools import cli

README = Path(__file__).resolve().parent.parent / "README.md"
INSTALL = "pip install -r requirements.txt -e . && "


def _quick_start_blocks() -> list[list[str]]:
    section = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [[line.split("  #")[0].strip() for line in b.splitlines() if line.strip()] for b in blocks]


def test_two_commands_install_and_run_the_study_and_the_tests():
    setup = _quick_start_blocks()[0]
    assert setup == [INSTALL + "dt bench scaling --quick", INSTALL + "python -m pytest"]


def test_every_quick_start_command_is_a_dt_command():
    for block in _quick_start_blocks():
        for line in block:
            words = line.split(" && ")[-1].split()
            if words[0] != "dt":
                continue
            if words[1] == "bench":
                assert words[2] in cli.BENCHES, line
            else:
                assert words[1] in cli.COMMANDS, line
