"""The IW-in-the-wild page's answer text: a lower bound says what cut it (the census's
``max_lower_bound_reason``), so a receive-window bound is not read as the server's IW."""

from __future__ import annotations

import importlib
from types import ModuleType

from iwscope.analysis.iwcheck import answer_of


def test_a_bound_says_what_cut_it(pages: dict[str, ModuleType]) -> None:
    wild = importlib.import_module("iwscope_dashboard.pages.wild")
    cut = answer_of([("lower_bound", 44, 1448, "receive_window")] * 2)
    assert wild._iw_text(cut) == ">= 44, cut by the probe's receive window (the server's IW may be larger) (n too small)"
    ended = answer_of([("lower_bound", 7, 1448, "object_ended")])
    assert wild._iw_text(ended) == ">= 7, the object ended inside the window (n too small)"
    determined = answer_of([("ok", 32, 1448, ""), ("lower_bound", 32, 1448, "receive_window")])
    assert wild._iw_text(determined) == ">= 32 (n too small)"
    assert wild._iw_text(answer_of([("ok", 10, 1448, "")] * 3)) == "10"
