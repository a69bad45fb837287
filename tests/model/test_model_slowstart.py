"""The slow-start model against hand-computed cases."""

import pytest

from iwscope.model import explain_gap, predict, rto_after_handshake_s, slow_start_rounds

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services


@pytest.mark.parametrize(
    ("size", "iw", "rounds"),
    [
        (1448, 3, 1),  # one segment
        (3 * 1448, 3, 1),  # exactly the initial window
        (3 * 1448 + 1, 3, 2),
        (9 * 1448, 3, 2),  # 3 + 6 = 9 segments in two rounds
        (10 * 1448, 3, 3),
        (10 * 1448, 10, 1),
        (30 * 1448, 10, 2),  # 10 + 20
        (31 * 1448, 10, 3),
    ],
)
def test_rounds_follow_window_doubling(size: int, iw: int, rounds: int) -> None:
    assert slow_start_rounds(size, iw) == rounds


def test_fast_path_latency_is_rounds_times_rtt() -> None:
    """On a 100 Mbit/s, 200 ms path serialisation is negligible: latency ~ rounds x RTT."""
    iw3 = predict(9000, 3, 0.2, 100e6)
    iw10 = predict(9000, 10, 0.2, 100e6)
    assert iw3.rounds == 2 and iw10.rounds == 1
    assert iw3.server_latency_s == pytest.approx(0.4, abs=0.005)
    assert iw10.server_latency_s == pytest.approx(0.2, abs=0.005)
    # The client sees the handshake and the request's trip on top: one more RTT.
    assert iw3.client_total_s - iw3.server_latency_s == pytest.approx(0.2, abs=0.005)


def test_small_object_gains_nothing() -> None:
    assert predict(3000, 3, 0.2, 100e6).server_latency_s == pytest.approx(predict(3000, 10, 0.2, 100e6).server_latency_s)


def test_bandwidth_bound_path_gains_nothing_from_iw() -> None:
    """At 56 kbit/s a 9 KB response is serialisation-bound (the replication's low-bandwidth finding)."""
    iw3 = predict(9000, 3, 0.07, 56e3)
    iw10 = predict(9000, 10, 0.07, 56e3)
    assert iw10.bandwidth_bound
    # 9,150 B of response = 6 full packets of 1,500 B + one of 514 B: 1.359 s on the wire,
    # then 35 ms to the client and a 52 B ACK (7.4 ms at 56 kbit/s) + 35 ms back.
    expected = (6 * 1500 + 514) * 8 / 56e3 + 0.035 + 52 * 8 / 56e3 + 0.035
    assert iw3.server_latency_s == pytest.approx(expected, rel=1e-6)
    assert iw10.server_latency_s == pytest.approx(expected, rel=1e-6)


def test_high_rtt_flags_syn_rto() -> None:
    assert predict(9000, 10, 1.0, 1.2e6).syn_rto_expected
    assert not predict(9000, 10, 0.5, 1.2e6).syn_rto_expected


def test_rto_from_the_handshake_follows_linux() -> None:
    # first sample m: rttvar = max(2m, 200 ms), RTO = m + rttvar
    assert rto_after_handshake_s(0.07) == pytest.approx(0.27)
    assert rto_after_handshake_s(0.3) == pytest.approx(0.9)


def test_slow_link_predicts_a_spurious_rto() -> None:
    # 70 ms: one 1500-byte packet takes 214 ms at 56 kbit/s, the first ACK comes after ~292 ms,
    # the RTO from the ~91 ms handshake is ~291 ms. At 256 kbit/s the ACK is back in ~119 ms.
    slow = predict(9000, 3, 0.07, 56e3)
    assert slow.first_ack_s == pytest.approx((1500 * 8 + 52 * 8) / 56e3 + 0.07, rel=1e-6)
    assert slow.spurious_rto_expected
    assert "spurious RTO" in (explain_gap(slow.server_latency_s * 1.15, slow) or "")
    assert not predict(9000, 3, 0.07, 256e3).spurious_rto_expected
    assert not predict(9000, 10, 0.3, 56e3).spurious_rto_expected  # the longer handshake RTT covers it
