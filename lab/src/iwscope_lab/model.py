"""What TCP slow start predicts for one short transfer: the yardstick next to every measurement.

Two views of the same transfer over a path with round-trip propagation delay ``rtt_s``, a
bottleneck of ``rate_bps`` (towards the client) and no loss:

* :func:`slow_start_rounds` -- the textbook count: how many round trips a response of
  ``size`` bytes needs when the window starts at ``iw`` segments and doubles every round.
* :func:`predict` -- a small packet-level simulation of the same thing that also serialises
  every packet at the bottleneck (in both directions, so a 56 kbit/s uplink delays ACKs) and
  grows the window per acknowledged segment as Linux does in slow start (the receiver acks
  every segment at the start of a connection: quick-ack mode). It gives the server-side
  response latency (request read to last byte acknowledged, the IW10 paper's metric) and
  the client-side total time (connect + request + response), which is what the probe sees.

The lab's link emulator serialises a packet at the configured rate and then delays it by
the one-way propagation delay; the model does the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: TCP payload per segment with timestamps on a 1500-byte MTU (1500 - 20 IP - 32 TCP).
DEFAULT_MSS = 1448
#: IP + TCP header bytes per packet (with the timestamp option).
HEADER_BYTES = 52
#: Bytes of the HTTP response header the origin sends before the body (approximately).
HTTP_HEADER_BYTES = 150
#: Bytes of the HTTP request the probe sends.
HTTP_REQUEST_BYTES = 160
#: Linux's initial SYN retransmission timeout (RFC 6298 says 1 s).
INITIAL_RTO_S = 1.0
#: Linux's lower bound of the RTO variance term (``TCP_RTO_MIN``, 200 ms).
RTO_MIN_S = 0.2


def rto_after_handshake_s(handshake_rtt_s: float) -> float:
    """The data RTO Linux derives from the one RTT sample of the handshake:
    ``srtt + max(2 * srtt, TCP_RTO_MIN)`` (``tcp_rtt_estimator`` on its first sample sets
    ``mdev = 2 * m`` and ``rttvar = max(mdev, rto_min)``; ``tcp_set_rto``: ``srtt + rttvar``)."""
    return handshake_rtt_s + max(2.0 * handshake_rtt_s, RTO_MIN_S)


def slow_start_rounds(size: int, iw: int, mss: int = DEFAULT_MSS) -> int:
    """Round trips slow start needs to send ``size`` bytes: the least k with iw*(2^k - 1) >= segments."""
    if size <= 0:
        return 0
    segments = math.ceil(size / mss)
    return max(1, math.ceil(math.log2(segments / iw + 1)))


@dataclass(frozen=True)
class Prediction:
    """The model's view of one transfer."""

    #: Segments of the response (header + body).
    segments: int
    #: Round trips from :func:`slow_start_rounds`.
    rounds: int
    #: Request read to last response byte acknowledged, seconds (server side).
    server_latency_s: float
    #: SYN sent to connection established, seconds.
    connect_s: float
    #: Trial start to last response byte received, seconds (client side).
    client_total_s: float
    #: True when the RTT reaches the initial SYN RTO, so the SYN is retransmitted and the
    #: measurement departs from this model (the lab does not hide it).
    syn_rto_expected: bool
    #: True when the bottleneck, not the window, dominates (the burst of the initial window
    #: takes longer to serialise than one RTT).
    bandwidth_bound: bool
    #: When the first data ACK reaches the server (s after the request is read), and the RTO
    #: then running (:func:`rto_after_handshake_s` of the handshake RTT).
    first_ack_s: float
    rto_s: float

    @property
    def spurious_rto_expected(self) -> bool:
        """The first ACK cannot come back before the RTO fires: on slow links one full
        segment's serialisation plus the RTT outlasts an RTO computed from the tiny handshake
        packets (at 70 ms, below about 60 kbit/s). Loss-free paths then retransmit."""
        return self.first_ack_s > self.rto_s


def _serialise_s(nbytes: int, rate_bps: float | None) -> float:
    return 0.0 if not rate_bps else nbytes * 8.0 / rate_bps


def predict(
    size: int,
    iw: int,
    rtt_s: float,
    rate_bps: float | None,
    *,
    up_rate_bps: float | None = None,
    mss: int = DEFAULT_MSS,
    header_bytes: int = HTTP_HEADER_BYTES,
) -> Prediction:
    """Predict server- and client-side latency of fetching ``size`` body bytes at IW ``iw``.

    ``rate_bps`` is the bottleneck towards the client (``None``: unlimited); ``up_rate_bps``
    the one towards the server (default: the same).  Propagation delay is split evenly.
    """
    if iw < 1:
        raise ValueError("iw must be at least 1")
    up_rate = rate_bps if up_rate_bps is None else up_rate_bps
    one_way = rtt_s / 2.0
    total_bytes = size + header_bytes
    segments = max(1, math.ceil(total_bytes / mss))
    sizes = [min(mss, total_bytes - i * mss) for i in range(segments)]
    ack_delay = _serialise_s(HEADER_BYTES, up_rate) + one_way

    # Packet-level slow start.  Time 0 = the server has read the request.
    cwnd = float(iw)
    next_seg = 0
    in_flight: list[int] = []  # segments sent, not yet acked, in order
    link_free_at = 0.0  # bottleneck (server -> client) busy until
    ack_times: list[tuple[float, int]] = []  # (arrival at server, segment index)
    last_ack_at = 0.0
    now = 0.0
    acked = 0
    while acked < segments:
        while next_seg < segments and len(in_flight) < int(cwnd):
            start = max(now, link_free_at)
            link_free_at = start + _serialise_s(sizes[next_seg] + HEADER_BYTES, rate_bps)
            arrive_client = link_free_at + one_way
            ack_times.append((arrive_client + ack_delay, next_seg))
            in_flight.append(next_seg)
            next_seg += 1
        ack_times.sort()
        now, seg = ack_times.pop(0)
        in_flight.remove(seg)
        acked += 1
        cwnd += 1.0  # slow start: one segment per acknowledged segment
        last_ack_at = now
    server_latency = last_ack_at

    syn_bytes = 60 + 14  # SYN with options, plus a little for the SYN-ACK difference
    connect = _serialise_s(syn_bytes, up_rate) + _serialise_s(syn_bytes, rate_bps) + rtt_s
    request = _serialise_s(HTTP_REQUEST_BYTES + HEADER_BYTES, up_rate) + one_way
    # The client has the last byte one ACK trip before the server hears of it.
    client_total = connect + request + server_latency - ack_delay
    burst_s = _serialise_s(min(iw, segments) * (mss + HEADER_BYTES), rate_bps)
    first_ack = _serialise_s(sizes[0] + HEADER_BYTES, rate_bps) + one_way + ack_delay
    return Prediction(
        segments=segments,
        rounds=slow_start_rounds(total_bytes, iw, mss),
        server_latency_s=server_latency,
        connect_s=connect,
        client_total_s=client_total,
        syn_rto_expected=rtt_s >= INITIAL_RTO_S,
        bandwidth_bound=burst_s > rtt_s,
        first_ack_s=first_ack,
        rto_s=rto_after_handshake_s(connect),
    )


def explain_gap(measured_s: float, predicted: Prediction) -> str | None:
    """A known reason why a measurement can differ from the model, or ``None``."""
    if predicted.syn_rto_expected:
        return "RTT >= 1 s initial SYN RTO: the SYN is retransmitted and the server's window restarts"
    if predicted.spurious_rto_expected:
        return (f"spurious RTO: the first ACK needs one full segment at the bottleneck plus the RTT "
                f"({1000 * predicted.first_ack_s:.0f} ms), longer than the RTO derived from the handshake RTT "
                f"({1000 * predicted.rto_s:.0f} ms); the retransmission and window collapse are outside the model")
    if predicted.bandwidth_bound and measured_s > predicted.server_latency_s:
        return "bandwidth-bound: queueing of the initial burst at the bottleneck"
    if measured_s < predicted.server_latency_s * 0.9:
        return "faster than slow start predicts: delayed-ACK or window growth differs from the model"
    return None


@dataclass(frozen=True)
class BurstQueue:
    """What one first flight does to a drop-tail bottleneck queue (see :func:`first_flight_queue`)."""

    #: Packets of the flight the bottleneck dropped.
    dropped: int
    #: Most packets waiting or in serialisation at once.
    peak_packets: int
    #: Queueing delay (ms) a packet of another flow meets when it arrives at the peak.
    peak_delay_ms: float


def first_flight_queue(iw: int, bottleneck_bps: float, buffer_packets: int | None, *, paced_rtt_s: float = 0.0,
                       access_bps: float = 1e9, packet_bytes: int = DEFAULT_MSS + HEADER_BYTES) -> BurstQueue:
    """The queue ``iw`` full-size packets build at a bottleneck of ``bottleneck_bps`` with a
    drop-tail buffer of ``buffer_packets`` (the one in serialisation included, as the lab's
    emulator counts; None = unlimited), arriving back to back at ``access_bps`` (a burst) or
    one every ``paced_rtt_s / iw`` (initial spreading).  Acknowledgements come a round trip
    later, so nothing else of the flow joins the queue meanwhile."""
    service = packet_bytes * 8 / bottleneck_bps
    gap = paced_rtt_s / iw if paced_rtt_s > 0 else packet_bytes * 8 / access_bps
    departures: list[float] = []  # serialisation end of every accepted packet
    dropped = peak = 0
    for index in range(iw):
        arrival = index * gap
        waiting = sum(1 for end in departures if end > arrival)
        if buffer_packets is not None and waiting + 1 > buffer_packets:
            dropped += 1
            continue
        start = max(arrival, departures[-1]) if departures else arrival
        departures.append(start + service)
        peak = max(peak, waiting + 1)
    return BurstQueue(dropped=dropped, peak_packets=peak, peak_delay_ms=peak * service * 1e3)
