"""HTTP/3's handshake in the model (``iwscope.model._quic``): how many round trips the server's
handshake flight takes from each IW, against what aioquic did in the lab.

The recorded bursts below are the server's datagrams per round trip of one fetch each, from
``iwprobe``'s own datagram log (``fetch_h3``) in ``quic_lab(rtt_ms=80, rate_bps=5e6,
chain_kb=16)``, 2026-11-28: the first round is the amplification limit (three datagrams for the
client's 1,200), then slow start from the IW.
"""

from __future__ import annotations

import pytest

from iwscope.model import predict_h3_total, predict_https_total, predict_quic_saving, quic_handshake_rounds
from iwscope.model._quic import AMPLIFICATION_FACTOR, QUIC_DATAGRAM_BYTES

pytestmark = pytest.mark.unit

#: IW -> the handshake's bursts (datagrams, bytes) before the client's request, as recorded.
RECORDED = {3: ((3, 3_600), (6, 7_200), (6, 6_368)), 10: ((3, 3_600), (12, 13_567))}


@pytest.mark.parametrize("iw", sorted(RECORDED))
def test_the_rounds_are_the_recorded_ones(iw: int) -> None:
    flight = sum(size for _, size in RECORDED[iw])
    assert quic_handshake_rounds(flight, iw) == len(RECORDED[iw])


def test_a_flight_within_the_first_round_takes_one_and_the_limit_binds_every_iw() -> None:
    limit = AMPLIFICATION_FACTOR * QUIC_DATAGRAM_BYTES
    assert all(quic_handshake_rounds(limit, iw) == 1 for iw in (3, 10, 32))
    assert all(quic_handshake_rounds(limit + 1, iw) == 2 for iw in (3, 10, 32))  # the limit, not the window
    assert quic_handshake_rounds(3_000, 1) == 2  # a window of one datagram: 1,200, then 2,400
    # slow start from IW 3: 3 + 6 + 12 + 24 datagrams' worth
    assert [quic_handshake_rounds(n * QUIC_DATAGRAM_BYTES, 3) for n in (9, 10, 21, 22, 45)] == [2, 3, 3, 4, 4]


def test_a_chain_beyond_the_limit_keeps_http3_ahead_by_about_a_round_trip() -> None:
    """The demo's path (80 ms, 5 Mbit/s) and chain (16.4 KB over TLS, 17.2 KB of QUIC handshake):
    HTTP/3 saves about the TCP handshake's round trip at IW 3 and 10, as measured through the stack
    (60.7 [21.7, 147.8] and 50.1 [13.9, 264.1] ms, docs/quic.md), and its own IW 10 is a round trip
    faster than IW 3 (measured 79.4 [66.7, 101.4] ms)."""
    rtt, rate = 0.080, 5e6
    savings = {iw: predict_quic_saving(1_000, iw, rtt, rate, 16_400, 17_170) for iw in (3, 10)}
    assert all(0.5 * rtt < saving < rtt for saving in savings.values()), savings
    h3 = {iw: predict_h3_total(1_000, iw, rtt, rate, 17_170) for iw in (3, 10)}
    assert h3[3] - h3[10] == pytest.approx(rtt, abs=0.005)
    # the TCP side: TLS's 16.4 KB flight takes three rounds from IW 3, two from IW 10
    assert predict_https_total(1_000, 3, rtt, rate, 16_400) - predict_https_total(1_000, 10, rtt, rate, 16_400) == pytest.approx(
        rtt, abs=0.01
    )
