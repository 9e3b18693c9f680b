"""`dt cluster list`'s output, with the machine's jobs replaced: it says so when there are none.

The real listing reads namespaces and links that another run may be making at
the same moment, so what it finds is set here; tests/test_cluster.py runs the
real thing end to end where root, ip and tc are there.
"""

from __future__ import annotations

import pytest

from dt.tools import cluster


@pytest.fixture
def listed(monkeypatch, capsys):
    def run(found: list[str], dead: list[str]) -> tuple[int, str]:
        monkeypatch.setattr(cluster, "check_tools", lambda: None)
        monkeypatch.setattr(cluster, "jobs", lambda: list(found))
        monkeypatch.setattr(cluster, "stale", lambda: list(dead))
        code = cluster.main(["list"])
        return code, capsys.readouterr().out

    return run


def test_an_empty_list_says_there_are_no_jobs(listed):
    code, out = listed([], [])
    assert code == 0
    assert out == "dt cluster: no jobs: no namespace, link or state file of a simulated cluster is left\n"


def test_each_job_on_its_line_with_its_owner(listed):
    code, out = listed(["a1b2c3", "d4e5f6"], ["d4e5f6"])
    assert code == 0
    assert out.splitlines() == ["a1b2c3  running", "d4e5f6  stale (owner gone)"]
