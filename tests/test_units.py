"""dt.units' words for counts and unset settings: '1 process', not '1 processes'; '-', not 'None'."""

from __future__ import annotations

from dt.units import fmt_optional, plural


def test_a_count_agrees_with_its_noun():
    assert [plural(n, "process") for n in (0, 1, 2)] == ["0 processes", "1 process", "2 processes"]
    assert [plural(n, "thread") for n in (1, 4)] == ["1 thread", "4 threads"]
    assert plural(1200, "step") == "1,200 steps" and plural(2, "index", "indices") == "2 indices"


def test_an_unset_setting_is_a_dash_or_what_it_means():
    assert fmt_optional(None) == "-" and fmt_optional(None, "none (no drops)") == "none (no drops)"
    assert fmt_optional(1.25) == "1.25" and fmt_optional(0) == "0"
