"""A census answer that is only a lower bound says why it stopped there (issue 35's receive window):
a bound the probe's own receive window set is not the server's IW (the page's wording:
tests/dashboard/test_dashboard_wild_text.py)."""

from __future__ import annotations

from iwscope.analysis.iwcheck import answer_of


def test_a_bound_cut_by_the_receive_window_says_so() -> None:
    rows = [
        ("lower_bound", 44, 1448, "receive_window"),
        ("lower_bound", 44, 1448, "receive_window"),
        ("lower_bound", 20, 1448, "object_ended"),
    ]
    answer = answer_of(rows)
    assert (answer.too_small, answer.max_lower_bound, answer.max_lower_bound_reason) == (True, 44, "receive_window")


def test_a_bound_from_a_determined_value_has_no_reason() -> None:
    answer = answer_of([("ok", 32, 1448, ""), ("lower_bound", 32, 1448, "receive_window"), ("lower_bound", 12, 1448, "loss")])
    assert (answer.max_lower_bound, answer.max_lower_bound_reason) == (32, "")
    # enough determined records: an IW, no bound
    named = answer_of([("ok", 10, 1448, "")] * 3 + [("lower_bound", 44, 1448, "receive_window")])
    assert (named.iw_segments, named.max_lower_bound, named.max_lower_bound_reason) == (10, None, "")
