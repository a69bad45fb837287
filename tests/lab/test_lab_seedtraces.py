"""Seed 002's plots (``iwscope lab reproduce --only seed002``): the time saved read off a traced
round -- the last data packet at the receiver, IW 3 minus IW 10 -- and the report's table.  The
lab run itself is ``iwscope lab reproduce --quick --only seed002`` (about 45 s, by hand; its
numbers are in docs/lab.md)."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from iwprobe._capture import ACK, SYN, Packet
from iwprobe._trace import Trace
from iwscope_lab.seedtraces import _plot_saved_ms, last_data_ms, seed_traces_html, seed_traces_markdown

pytestmark = pytest.mark.unit

MSS = 1448


def _trace(iw: int, segments: int, rtt_ms: float) -> dict[str, Any]:
    """Slow start from ``iw`` over a lossless path: each flight one RTT after the last."""
    rtt = int(rtt_ms * 1e6)
    client, server = 1_000, 9_000
    packets = [
        Packet(0, True, client, 0, SYN, 0, 64240, 1460, 7),
        Packet(rtt, False, server, client + 1, SYN | ACK, 0, 65160, 1460, 7),
        Packet(rtt + 10_000, True, client + 1, server + 1, ACK, 120, 502),
    ]
    sent, window, start = 0, iw, 2 * rtt
    while sent < segments:
        for index in range(min(window, segments - sent)):
            packets.append(Packet(start + index * 100_000, False, server + 1 + (sent + index) * MSS, client + 121, ACK, MSS, 509))
        sent += min(window, segments - sent)
        window, start = window * 2, start + rtt
    return Trace.from_packets(packets, rcv_mss=MSS, min_rtt_us=rtt // 1000).to_dict()


def _trial(iw: int, trace: dict[str, Any] | None) -> SimpleNamespace:
    traces = [SimpleNamespace(side="receiver", trace=trace)] if trace is not None else []
    return SimpleNamespace(trial_id=uuid.uuid4(), arm_iw=iw, traces=traces)


def test_the_plot_reads_one_rtt_saved_where_iw10_takes_a_round_less() -> None:
    # 7 segments (10 KB): IW 3 needs flights of 3 + 4 (two rounds), IW 10 one.
    iw3, iw10 = _trace(3, 7, 33.0), _trace(10, 7, 33.0)
    assert last_data_ms(iw10) == pytest.approx(66.0 + 0.6)  # two RTTs (handshake, request) + the flight's spread
    traced = SimpleNamespace(trial=_trial(10, iw10), twins=[_trial(3, iw3)])
    assert _plot_saved_ms(traced) == pytest.approx((3 * 33.0 + 0.3) - (2 * 33.0 + 0.6))  # IW 3's second flight of 4


def test_no_reading_without_both_arms_traced() -> None:
    traced = SimpleNamespace(trial=_trial(10, _trace(10, 7, 33.0)), twins=[_trial(3, None)])
    assert _plot_saved_ms(traced) is None
    assert last_data_ms({"t_us": [0, 10], "outgoing": [1, 1], "length": [0, 100]}) is None  # nothing received


def test_the_report_says_n_too_small_and_links_the_figures() -> None:
    point = {
        "rtt_ms": 33,
        "size": 10_000,
        "n_pairs": 2,
        "measured_saved_ms": None,
        "measured_low_ms": None,
        "measured_high_ms": None,
        "median_iw3_ms": 101.6,
        "median_iw10_ms": 68.7,
        "plotted_trial": None,
        "plot_saved_ms": 33.4,
        "figures": ["seed002-10k-33ms-recv.html"],
        "note": "n too small (2 paired rounds)",
    }
    summary = {
        "title": "Time-sequence plots",
        "points": [
            point,
            {**point, "measured_saved_ms": 33.0, "measured_low_ms": 32.0, "measured_high_ms": 33.9, "n_pairs": 4, "note": ""},
        ],
    }
    table = seed_traces_markdown(summary)
    assert "n too small (2 paired rounds)" in table[4] and "33.4 ms" in table[4]
    assert "33.0 ms [32.0, 33.9]" in table[5]
    html = seed_traces_html(summary)
    assert html.count("<a href='seed002-10k-33ms-recv.html'>") == 2 and html.count("<tr>") == 3
