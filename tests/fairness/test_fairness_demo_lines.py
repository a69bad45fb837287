"""The demo's summary lines: the cost lines print a median only with its interval, and never the
one bulk flow's share; the HTTPS line names its paths and what its interval covers."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from iwscope_lab.demo import cost_lines, https_lines

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services


def _phase(mix: tuple[int, ...], short: dict[str, Any]) -> Any:
    point = {
        "flow": "short",
        "iw": mix[0],
        "errors": 0,
        "fct_p50_ms": 812.0,
        "retrans_flows": 2,
        "joined_flows": short["n"],
        "retrans_flow_share_ci": (0.02, 0.3),
        **short,
    }
    background = {"flow": "background", "iw": 3, "n": 1, "errors": 0, "throughput_bps": 3e6}
    return SimpleNamespace(mix=mix, points=[background, point])


def test_median_with_interval_and_n_too_small_without_one() -> None:
    lines = cost_lines([_phase((3,), {"n": 24, "fct_p50_ci_ms": (640.0, 990.0)}), _phase((10,), {"n": 4, "fct_p50_ci_ms": None})])
    iw3, iw10, bulk = lines
    assert "24 completed, median completion 812.0 ms [640, 990]" in iw3 and "2 of 24 retransmitted [2, 30] %" in iw3
    assert "4 completed, median completion: n too small" in iw10 and "812" not in iw10
    assert "n too small" in bulk and "%" not in bulk.split(":", 1)[1]


def test_the_https_line_names_its_paths_and_the_within_path_caveat(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's HTTPS campaign runs on one path: its interval is within-path noise only, and says so."""
    import contextlib

    import iwscope.analysis

    caveat = "1 path (< 5): the interval reflects within-path noise only, about the measured paths, not a population of paths"
    row = SimpleNamespace(
        bucket="<=20 KB", too_small=False, abs_ms=90.4, abs_ci_low=88.3, abs_ci_high=92.5, n_pairs=30, n_paths=1, note=caveat
    )
    monkeypatch.setattr(iwscope.analysis, "tls_by_flight", lambda session, filters: [row])
    stack = SimpleNamespace(session=contextlib.nullcontext)
    line = https_lines(stack, 7)[0]
    assert "90.4 ms faster [88.3, 92.5] over 30 pairs on 1 path (1 path (< 5): the interval reflects within-path noise" in line
