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

from collections.abc import Iterator

import pytest

from iwscope_lab.sendpaths import HEAD_ALONE_BYTES, IW, SIZE, OffloadRun, offload_segments

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
