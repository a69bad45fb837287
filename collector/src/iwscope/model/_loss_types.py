"""The loss model's constants and result types (public through :mod:`iwscope.model`), and
the simulator's internal codes (:mod:`iwscope.model._loss_handshake` and the modules after it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

#: Congestion controls the model knows (see the module docstring).
CongestionControl = Literal["cubic", "reno", "bbr"]
#: Every congestion control the model plays, in that order.
CONGESTION_CONTROLS: tuple[CongestionControl, ...] = ("cubic", "reno", "bbr")


def congestion_control(name: str) -> CongestionControl:
    """``name`` as a congestion control the model plays (``ValueError`` names the choices)."""
    for known in CONGESTION_CONTROLS:
        if known == name:
            return known
    raise ValueError(f"congestion control {name!r}: one of {', '.join(CONGESTION_CONTROLS)}")


#: A packet dropped on purpose (for tests and what-ifs): (kind, index, transmission), kind one of
#: ``syn``, ``synack``, ``handshake_ack``, ``request`` (index 0, transmission n: the n-th copy,
#: from 0), ``data`` (index: the segment, transmission: its n-th copy) and ``ack`` (index: the
#: n-th ACK the client sends during the response, transmission 0).
Drop = tuple[str, int, int]

#: Trials per :func:`predict_with_loss` call by default: 0.37-0.47 s (median of 5 calls) for a
#: 100 kB object at 1-5 % loss, 40-65 ms for web-search sizes, on the shared 2-core development
#: box under a load of 2 (docs/reproduction.md, "The model with loss"); the mean's standard
#: error for web-search sizes at 300 ms, 1 Mbit/s and 5 % loss is then about 22 ms (4 %).
DEFAULT_SAMPLES = 400
#: Bytes of a SYN and a SYN-ACK on the wire, as :func:`~iwscope.model.predict` counts them.
SYN_BYTES = 60 + 14
#: Linux's largest RTO (``TCP_RTO_MAX``).
RTO_MAX_S = 120.0
#: ``TCP_TIMEOUT_MIN_US``: what the loss probe adds to 2 x SRTT with more than one packet out,
#: and the reordering timer to its deadline.
TIMER_MIN_S = 0.002
#: SACKed segments above a hole after which RACK waits no reordering window (``tp->reordering``).
DUPTHRESH = 3
#: CUBIC's multiplicative decrease (``beta = 717 / 1024``).
CUBIC_BETA = 717 / 1024
#: BBR never lets cwnd fall below 4 segments (``bbr_cwnd_min_target``) outside packet conservation.
BBR_CWND_MIN = 4
#: Probability that the server's SYN-ACK timer fires before the client's retransmitted SYN
#: arrives when a SYN-ACK was lost: both are due 1 s after the same SYN, so the kernels' timer
#: wheels (slack of 32-64 ms at 1 s) decide; the model takes it as a fair coin.
SYNACK_TIMER_FIRST = 0.5
#: Quantiles reported, as the collector's percentile tables report them.
QUANTILES = (0.5, 0.75, 0.9, 0.99)

_OPEN, _RECOVERY, _LOSS = 0, 1, 2
_NO_TIMER, _TLP, _RTO, _REO = 0, 1, 2, 3
_DATA, _ACK = 0, 1
_MAX_EVENTS = 1_000_000


def _ser(nbytes: int, rate_bps: float | None) -> float:
    return 0.0 if not rate_bps else nbytes * 8.0 / rate_bps


@dataclass(frozen=True)
class Trial:
    """One simulated connection (:func:`simulate_connection`); times in seconds."""

    size: int
    segments: int
    #: Request read to last response byte acknowledged (the origin's ``server_latency_us``).
    server_latency_s: float
    #: SYN sent to last response byte received (the probe's total).
    client_total_s: float
    #: SYN sent to SYN-ACK received.
    connect_s: float
    #: SYN sent to request read by the server.
    request_read_s: float
    #: The window the server started with: the IW, or 1 after its SYN-ACK was resent twice.
    server_iw: int
    #: Packets the link dropped in this trial, both directions, handshake included.
    dropped: int
    syn_retransmits: int
    synack_retransmits: int
    request_retransmits: int
    #: The server's data retransmissions (loss probes, fast and RTO retransmissions, spurious ones).
    data_retransmits: int
    loss_probes: int
    rtos: int
    recoveries: int

    @property
    def server_total_retrans(self) -> int:
        """What the origin's ``TCP_INFO`` counts as ``total_retrans``: SYN-ACKs and data."""
        return self.synack_retransmits + self.data_retransmits


@dataclass(frozen=True)
class Spread:
    """Mean and quantiles of a sample, seconds (quantiles by linear interpolation)."""

    mean_s: float
    p50_s: float
    p75_s: float
    p90_s: float
    p99_s: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("no values")
        ordered = sorted(values)
        p50, p75, p90, p99 = (_quantile(ordered, q) for q in QUANTILES)
        return cls(math.fsum(ordered) / len(ordered), p50, p75, p90, p99)


def _quantile(ordered: Sequence[float], q: float) -> float:
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class LossPrediction:
    """The distribution :func:`predict_with_loss` found over its trials."""

    samples: int
    loss: float
    #: Request read to last byte acknowledged (the metric of ``measure_point``).
    server: Spread
    #: Connect + request + response, as the probe measures it.
    client: Spread
    #: Share of trials in which the link dropped nothing (either direction, handshake included).
    p_no_loss: float
    #: Share in which the origin retransmitted anything (SYN-ACK or data): the lab's
    #: "retransmitting trials" (``server_total_retrans > 0``).
    p_server_retrans: float
    #: Share with at least one data RTO.
    p_rto: float
    #: Share in which the client resent its SYN.
    p_syn_retrans: float
    #: Share in which the server started from IW 1.
    p_iw_reset: float
    #: Every trial, when asked for (``keep_samples=True``).
    trials: tuple[Trial, ...] = ()
