"""Cardwell, Savage and Anderson's closed form for a short transfer's latency (INFOCOM 2000),
with Padhye et al.'s steady-state rate (PFTK) for what follows slow start: kept beside the
packet model (:mod:`iwscope.model`) for comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from iwscope.model._slowstart import DEFAULT_MSS, HTTP_HEADER_BYTES, INITIAL_RTO_S, rto_after_handshake_s


@dataclass(frozen=True)
class CsaEstimate:
    """The expected latency of one transfer by Cardwell, Savage and Anderson's model, seconds."""

    #: SYN sent to SYN-ACK received, with SYN and SYN-ACK losses and the initial timeout doubling.
    handshake_s: float
    #: The initial slow start, up to the first loss (or the end).
    slow_start_s: float
    #: Recovering from the first loss: a timeout or a fast retransmit, weighted by their odds.
    first_loss_s: float
    #: The rest of the data at the steady-state rate of Padhye et al. (PFTK).
    remaining_s: float
    #: The receiver's delayed ACK of the last segment.
    delayed_ack_s: float
    #: Segments of the response, and how many of them slow start sends in expectation.
    segments: int
    slow_start_segments: float

    @property
    def server_s(self) -> float:
        """Request read to last byte acknowledged: the data transfer."""
        return self.slow_start_s + self.first_loss_s + self.remaining_s + self.delayed_ack_s

    @property
    def client_s(self) -> float:
        """The handshake plus the transfer (the request's half RTT and the last ACK's cancel)."""
        return self.handshake_s + self.server_s


def _timeout_odds(p: float, w: float) -> float:
    """Q(p, w): the probability that a loss in a window of ``w`` segments ends in a timeout
    (fewer than three duplicate ACKs come back), Padhye et al.'s approximation."""
    if w <= 0:
        return 1.0
    q = 1.0 - p
    return min(1.0, (1 - q**3) * (1 + q**3 * (1 - math.pow(q, w - 3))) / (1 - math.pow(q, w)))


def _backoff_factor(p: float) -> float:
    """G(p): the expected length of a sequence of doubling timeouts, in initial timeouts."""
    return 1 + p + 2 * p**2 + 4 * p**3 + 8 * p**4 + 16 * p**5 + 32 * p**6


def csa_latency(
    size: int,
    iw: int,
    rtt_s: float,
    loss: float,
    *,
    mss: int = DEFAULT_MSS,
    header_bytes: int = HTTP_HEADER_BYTES,
    rwnd_segments: int | None = None,
    rto_s: float | None = None,
    syn_timeout_s: float = INITIAL_RTO_S,
    acks_per_segment: int = 1,
    delayed_ack_s: float = 0.0,
) -> CsaEstimate:
    """Cardwell, Savage and Anderson's expected latency ("Modeling TCP Latency", INFOCOM 2000).

    E[T] = E[T_handshake] + E[T_slow start] + E[T_first loss] + E[T_rest] + E[T_delayed ACK],
    with the initial window ``iw`` as w1, the receive window ``rwnd_segments`` as W_max, the
    same ``loss`` forward and back (the handshake's p_f and p_r; the data phase sees only the
    forward loss), ``acks_per_segment`` b = 1 (Linux acks every segment in quick-ack mode, and
    grows cwnd by every segment acknowledged), the RTO ``rto_s`` (default: Linux's from one RTT
    sample, :func:`~iwscope.model.rto_after_handshake_s`) as T0, and the 1 s initial SYN
    timeout as Ts. Its assumptions: rounds of exactly one RTT (no serialisation at a bottleneck,
    so compare it on fast paths), a continuous number of slow-start rounds (log, not its
    ceiling: at no loss it is below :func:`~iwscope.model.predict` unless the segments are
    ``iw * (2^k - 1)``), Reno after the first loss (a timeout with probability Q, else one RTT of
    fast recovery; no tail loss probe, no RACK), and the rest at PFTK's steady-state rate."""
    if iw < 1:
        raise ValueError("iw must be at least 1")
    if not 0.0 <= loss < 0.5:
        raise ValueError(f"loss must be within [0, 0.5), not {loss!r}")
    p, b = loss, acks_per_segment
    d = max(1, math.ceil((size + header_bytes) / mss))
    t0 = rto_after_handshake_s(rtt_s) if rto_s is None else rto_s
    w_max = math.inf if rwnd_segments is None else float(rwnd_segments)
    w1 = min(float(iw), w_max)
    handshake = rtt_s + syn_timeout_s * (2 * (1 - p) / (1 - 2 * p) - 2)
    # Segments slow start sends: up to and including the first lost one, or all d.
    q = 1.0 - p
    d_ss = sum(q**k * p * (k + 1) for k in range(d)) + q**d * d
    gamma = 1 + 1 / b
    w_ss = d_ss * (gamma - 1) / gamma + w1 / gamma
    if w_ss > w_max:
        slow_start = rtt_s * (math.log(w_max / w1, gamma) + 1 + (d_ss - (gamma * w_max - w1) / (gamma - 1)) / w_max)
    else:
        slow_start = rtt_s * math.log(d_ss * (gamma - 1) / w1 + 1, gamma)
    loss_in_slow_start = 1 - q**d
    first_loss = 0.0
    rest = 0.0
    if p > 0:
        timeout = _backoff_factor(p) * t0 / (1 - p)
        odds = _timeout_odds(p, min(w_ss, w_max))
        first_loss = loss_in_slow_start * (odds * timeout + (1 - odds) * rtt_s)
        d_ca = max(0.0, d - d_ss)
        if d_ca > 0:
            rest = d_ca / _pftk_rate(p, rtt_s, t0, w_max, b)
    return CsaEstimate(
        handshake_s=handshake,
        slow_start_s=slow_start,
        first_loss_s=first_loss,
        remaining_s=rest,
        delayed_ack_s=delayed_ack_s,
        segments=d,
        slow_start_segments=d_ss,
    )


def _pftk_rate(p: float, rtt_s: float, t0: float, w_max: float, b: int) -> float:
    """Padhye, Firoiu, Towsley and Kurose's steady-state rate, segments per second."""
    g = _backoff_factor(p)
    a = (2 + b) / (3 * b)
    w = a + math.sqrt(8 * (1 - p) / (3 * b * p) + a * a)
    if w < w_max:
        odds = _timeout_odds(p, w)
        return ((1 - p) / p + w + odds / (1 - p)) / (rtt_s * (b / 2 * w + 1) + odds * g * t0 / (1 - p))
    odds = _timeout_odds(p, w_max)
    return ((1 - p) / p + w_max + odds / (1 - p)) / (
        rtt_s * (b / 8 * w_max + (1 - p) / (p * w_max) + 2) + odds * g * t0 / (1 - p)
    )
