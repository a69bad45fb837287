"""The burst model next to the lab: what a first flight does to a drop-tail queue."""

from __future__ import annotations

import pytest

from iwscope.model import first_flight_queue

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services


def test_an_iw32_burst_overflows_ten_packets_and_the_paced_flight_never_queues() -> None:
    burst = first_flight_queue(32, 10e6, 10)
    paced = first_flight_queue(32, 10e6, 10, paced_rtt_s=0.1)
    # The lab measured 22 retransmitted segments per IW32 fetch through this buffer (docs/cost.md).
    assert burst.dropped == 22 and burst.peak_packets == 10
    assert paced.dropped == 0 and paced.peak_packets == 1
    assert abs(burst.peak_delay_ms - 10 * 1500 * 8 / 10e6 * 1e3) < 1e-9


def test_a_bdp_buffer_holds_the_burst_and_turns_it_into_delay() -> None:
    bdp_packets = int(10e6 * 0.1 / 8 / 1500)  # 83
    burst = first_flight_queue(32, 10e6, bdp_packets)
    assert burst.dropped == 0 and burst.peak_packets == 32
    assert 38 < burst.peak_delay_ms < 39  # 32 x 1.2 ms: what a voice packet behind it waits
    assert first_flight_queue(10, 10e6, bdp_packets).peak_delay_ms < burst.peak_delay_ms / 3
