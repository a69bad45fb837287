"""Seed 002's writev vs sendfile at the sender, on a device that offloads (root; veth, curl, tcpdump).

:func:`iwscope_lab.sendpaths.offload_segments` serves 50 KB by each send path over a veth pair
with TSO on, then off, and reads Debian's ``tcpdump`` of the origin's device: what TCP handed
the device.  The seed: "with Nagle and cork switched off, writev tends to send fewer and larger
segments, which is great for TSO, while sendfile prefers smaller segments".  Seen on this kernel
(6.18, 3 fetches each): writev 4 packets per response (7,240, 7,240, 14,480, 21,158 B), sendfile
6 (the 118-byte head alone, then 7,240, 7,240, 1,448, 15,928, 18,144), a write per MSS 35 of
1,448; with TSO off every path 35 (36 for sendfile: its head) packets of at most the MSS.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from iwscope_lab.sendpaths import (
    HEAD_ALONE_BYTES,
    IW,
    SIZE,
    OffloadRun,
    offload_segments,
    send_paths_html,
    send_paths_markdown,
    sender_segments,
)

FETCHES = 3


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[tuple[str, bool], OffloadRun]]:
    yield {(run.send_path, run.tso): run for run in offload_segments(fetches=FETCHES)}


def test_every_response_arrives_whole_and_the_origin_says_how_it_was_sent(runs: dict[tuple[str, bool], OffloadRun]) -> None:
    assert set(runs) == {(path, tso) for path in ("writev", "sendfile", "mss-writes") for tso in (True, False)}
    for (path, tso), run in runs.items():
        assert run.intact and run.responses == FETCHES, run
        assert run.reported == [f"{path}/{'tso' if tso else 'off'}"], run
        assert run.client_mss is not None and run.client_mss >= 1400, run


def test_without_tso_every_path_hands_the_device_mss_sized_packets(runs: dict[tuple[str, bool], OffloadRun]) -> None:
    for path in ("writev", "sendfile", "mss-writes"):
        run = runs[(path, False)]
        assert run.largest is not None and run.client_mss is not None and run.largest <= run.client_mss, run
        assert run.packets_per_response is not None and run.packets_per_response >= SIZE / run.client_mss, run


def test_with_tso_writev_sends_fewer_larger_segments_than_sendfile(runs: dict[tuple[str, bool], OffloadRun]) -> None:
    writev, sendfile, per_mss = runs[("writev", True)], runs[("sendfile", True)], runs[("mss-writes", True)]
    mss = writev.client_mss
    assert mss is not None and writev.largest is not None and writev.packets_per_response is not None
    assert sendfile.packets_per_response is not None and per_mss.packets_per_response is not None
    # writev: head and body in one call, handed to the device as super-segments of several MSS
    assert writev.largest > 2 * mss and writev.first_sizes[0] >= mss, writev
    assert writev.packets_per_response < runs[("writev", False)].packets_per_response, writev  # type: ignore[operator]
    # sendfile: the head leaves alone (TCP_NODELAY, no cork), so more and smaller segments
    assert sendfile.first_sizes[0] < HEAD_ALONE_BYTES and writev.first_sizes[0] >= HEAD_ALONE_BYTES, (sendfile, writev)
    assert sendfile.packets_per_response > writev.packets_per_response, (sendfile, writev)
    # a write per MSS: the first window's writes each leave as one segment
    assert all(size <= mss for size in per_mss.first_sizes[:IW]), per_mss
    assert per_mss.packets_per_response > sendfile.packets_per_response, per_mss


def test_sender_segments_counts_the_servers_data_by_size() -> None:
    # ``outgoing`` is the client's direction on both sides: the server's data are the zeros
    head_alone = {"outgoing": [1, 0, 0, 0, 1, 0, 0], "length": [0, 0, 118, 1448, 0, 1448, 700]}
    whole = {"outgoing": [1, 0, 1, 0, 0], "length": [120, 0, 0, 1448, 1448]}
    segments = sender_segments([head_alone, whole])
    assert (segments.traces, segments.mss, segments.full, segments.smaller, segments.larger) == (2, 1448, 4, 2, 0)
    assert (segments.head_alone, segments.largest, segments.packets_per_trial) == (1, 1448, 3)
    assert segments.common_sizes[0] == (1448, 4)
    assert sender_segments([]).mss is None


def test_the_report_tables_show_every_condition(runs: dict[tuple[str, bool], OffloadRun]) -> None:
    point = {
        "send_path": "sendfile",
        "gso": True,
        "campaign_id": 1,
        "trials": 2,
        "latency_mean_ms": None,
        "latency_low_ms": None,
        "latency_high_ms": None,
        "latency_median_ms": 139.0,
        "reported": {"sendfile/gso": 2},
        "segments": dataclasses.asdict(sender_segments([{"outgoing": [0, 0], "length": [118, 1448]}])),
        "note": "n too small (2 trials)",
    }
    summary = {
        "title": "T",
        "points": [point],
        "offload_title": "O",
        "offload": [dataclasses.asdict(run) for run in runs.values()],
    }
    table = send_paths_markdown(summary)
    assert "| sendfile | on | sendfile/gso x2 | 2 | n too small (2 trials) | 139.0 ms | 2 | 1 / 1 / 0 | 1 of 1 |" in "\n".join(
        table
    )
    assert (
        sum(
            line.startswith("| writev |") or line.startswith("| sendfile |") or line.startswith("| mss-writes |")
            for line in table
        )
        == 7
    )
    html = send_paths_html(summary)
    assert html.count("<tr>") == 2 + 1 + len(runs) and "<h3>O</h3>" in html
