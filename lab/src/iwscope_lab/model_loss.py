"""The latency of a short transfer under random loss: a Monte-Carlo over a packet-level model of
Linux's TCP (:func:`predict_with_loss`), and Cardwell, Savage and Anderson's closed form beside
it (:func:`csa_latency`).

The path is :func:`iwscope_lab.model.predict`'s -- round-trip propagation ``rtt_s`` split evenly,
a bottleneck of ``rate_bps`` towards the client (``up_rate_bps`` back) serialising every packet
-- plus the lab emulator's loss: every packet (SYN, SYN-ACK, ACK, request, data, retransmissions)
is dropped with probability ``loss``, independently, in each direction (``iwemu.c``'s
``lose_packet`` draws per packet and direction before the queue, so a dropped packet takes no
time at the bottleneck; ``LinkSpec.symmetric(loss=...)`` sets the same loss both ways, and in
``reproduce.py``'s lossy sweep only the probe's access link loses, so each packet meets it once).

One trial (:func:`simulate_connection`) plays a whole connection as the probe and the origin
do, event by event, with what a Linux 6.x sender and receiver do on loss:

* **Handshake**: the client's SYN is retransmitted after 1 s, 2 s more, 4 s more
  (``TCP_TIMEOUT_INIT``, doubling); the server answers each SYN with a SYN-ACK and
  retransmits its SYN-ACK on its own timer (1 s, then 2 s, ...). A lost SYN-ACK makes both
  timers fire at the same moment (the client's SYN timer and the server's SYN-ACK timer both
  run 1 s from the same SYN); which fires first is decided by the kernels' timer wheels, and
  the model draws it (:data:`SYNACK_TIMER_FIRST`). The server starts from IW 1 instead of the
  IW when it sent more than two SYN-ACKs, at least one on its timer, and the client's ACK does
  not echo the first one's timestamp: ``tcp_init_transfer`` sets ``cwnd = 1`` when
  ``total_retrans > 1 && undo_marker`` (``total_retrans = req->num_retrans``, counting SYN-ACKs
  resent on a retransmitted SYN too; ``undo_marker`` set when ``req->num_timeout``, cleared by
  ``tcp_try_undo_spurious_syn`` when the echo is the first SYN-ACK's) -- so one lost SYN-ACK
  costs the IW when the server's timer wins the race. The handshake's RTT sample (with
  timestamps: from the SYN-ACK the client answered) gives the data RTO,
  :func:`~iwscope_lab.model.rto_after_handshake_s`. The client sends its ACK and the request at
  once; the server starts on whichever arrives; a lost request is resent by the client's loss
  probe (2 x SRTT + 200 ms: one packet out) or RTO.
* **Data**: slow start from the IW, one ACK per segment (quick-ack, as in ``predict``; the
  receiver also acks every out-of-order or duplicate segment at once, with SACK and D-SACK),
  cwnd grown by the segments each cumulative ACK delivers. Loss detection is RACK (RFC 8985,
  Linux's only detector since 4.18 with ``tcp_recovery = 1``): a segment is lost once a segment
  sent after it is (S)ACKed and a reordering window has passed -- none once three segments are
  SACKed (the classic DupThresh) or in recovery, else min RTT / 4 (a ``REO`` timer). Fast
  recovery with Proportional Rate Reduction (``tcp_cwnd_reduction``, exact) down to ssthresh
  (CUBIC: 0.7 x cwnd, Reno: 0.5 x cwnd), then congestion avoidance (Reno's one segment per
  window; CUBIC's growth this close to its plateau is about the same). The tail loss probe
  (``tcp_schedule_loss_probe``: PTO = 2 x SRTT + 2 ms, + 200 ms with one packet out, never
  later than the RTO; sends new data if any, else resends the last segment; one per episode; a
  probe that repaired a loss reduces cwnd). The RTO (``tcp_rtt_estimator`` and ``tcp_set_rto``
  exactly: SRTT + RTTVAR, RTTVAR floored at 200 ms and decaying once per RTT; doubled per
  expiry) marks the unacknowledged segments lost (RACK's rule), sets cwnd to 1 and slow start
  up to the halved ssthresh retransmits them; an RTO found spurious by the timestamp echo
  (Eifel, ``tcp_try_undo_loss``) is undone. BBR (``cc="bbr"``): no ssthresh, packet
  conservation for the first round of recovery, the window before recovery restored after it,
  a floor of 4 segments -- BBR's model of bandwidth and its pacing are left out, as ``predict``
  leaves them out.

Left out: delayed ACKs after the first 16 segments (quick-ack ends there; ``predict`` acks
every segment too), F-RTO's new-data step after an RTO, D-SACK-based undo and reordering
detection (the emulator never reorders), the client's own retransmissions after the request was
read, queueing of ACKs on the uplink (a 52-byte ACK takes 0.4 ms at 1 Mbit/s), timer
granularity (jiffies), TSO/GSO, and receive-buffer autotuning beyond the window growth below.

The receive window: ``rwnd_segments`` is the client's first advertised window; it then grows by
two segments per segment received (``tcp_grow_window`` while the buffer has room), its right
edge sliding with the cumulative ACK. The lab's clients advertise about 44 segments
(``CLIENT_INITRWND`` = 64 in ``reproduce.py``, capped by the 64 KB receive buffer), more than
the IWs of the lossy sweep and than its largest response (21 segments), so the default (None)
leaves the cap out.

Why a Monte-Carlo over a packet model rather than a formula: the lab's paths are short
transfers of a few segments, where the closed forms' assumptions (many rounds, Reno's
triple-duplicate ACK or a timeout, no serialisation) do not hold -- a lost last segment is
repaired by the loss probe (2 SRTT + 200 ms), one with a single segment after it by RACK a
quarter of an RTT after that segment's SACK, neither by an RTO after 3 RTTs, and at 1 Mbit/s an
IW16 burst takes 190 ms to serialise. The packet model is ``predict``'s and every mechanism added
above is a kernel rule that can be read and checked. Without loss it gives ``predict``'s numbers
to rounding, except where a timer fires with nothing lost -- slow links, where ``predict`` flags the spurious RTO
(:attr:`~iwscope_lab.model.Prediction.spurious_rto_expected`): the simulation plays it, with
the Eifel undo. :func:`csa_latency` is kept beside it for comparison.

A distribution (:func:`predict_with_loss`) is over independent trials, each drawing its own
losses; with several object sizes, trial ``i`` fetches ``sizes[i % len(sizes)]`` (give
:func:`websearch_sizes` for the lab's web-search mix), so the summary is over sizes and losses
together, as the lab's arms are.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from iwscope_lab.model import (
    DEFAULT_MSS,
    HEADER_BYTES,
    HTTP_HEADER_BYTES,
    HTTP_REQUEST_BYTES,
    INITIAL_RTO_S,
    RTO_MIN_S,
    rto_after_handshake_s,
)

__all__ = [
    "BBR_CWND_MIN",
    "CUBIC_BETA",
    "DEFAULT_SAMPLES",
    "DUPTHRESH",
    "QUANTILES",
    "RTO_MAX_S",
    "SYNACK_TIMER_FIRST",
    "SYN_BYTES",
    "TIMER_MIN_S",
    "CongestionControl",
    "CsaEstimate",
    "Drop",
    "LossPrediction",
    "Spread",
    "Trial",
    "csa_latency",
    "predict_with_loss",
    "simulate_connection",
    "websearch_sizes",
]

#: Congestion controls the model knows (see the module docstring).
CongestionControl = Literal["cubic", "reno", "bbr"]
#: A packet dropped on purpose (for tests and what-ifs): (kind, index, transmission), kind one of
#: ``syn``, ``synack``, ``handshake_ack``, ``request`` (index 0, transmission n: the n-th copy,
#: from 0), ``data`` (index: the segment, transmission: its n-th copy) and ``ack`` (index: the
#: n-th ACK the client sends during the response, transmission 0).
Drop = tuple[str, int, int]
_Push = Callable[[float, int, float], None]

#: Trials per :func:`predict_with_loss` call by default: 0.37-0.47 s (median of 5 calls) for a
#: 100 kB object at 1-5 % loss, 40-65 ms for web-search sizes, on the shared 2-core development
#: box under a load of 2 (docs/reproduction.md, "The model with loss"); the mean's standard
#: error for web-search sizes at 300 ms, 1 Mbit/s and 5 % loss is then about 22 ms (4 %).
DEFAULT_SAMPLES = 400
#: Bytes of a SYN and a SYN-ACK on the wire, as :func:`~iwscope_lab.model.predict` counts them.
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


class _Connection:
    """One connection, event by event: :meth:`handshake`, then :meth:`transfer`."""

    def __init__(
        self,
        *,
        size: int,
        iw: int,
        rtt_s: float,
        rate_bps: float | None,
        up_rate_bps: float | None,
        loss_down: float,
        loss_up: float,
        mss: int,
        header_bytes: int,
        rwnd_segments: int | None,
        cc: CongestionControl,
        tlp: bool,
        rack: bool,
        rng: random.Random,
        drops: Collection[Drop],
    ) -> None:
        self.size, self.iw, self.rtt = size, iw, rtt_s
        self.down, self.up = rate_bps, up_rate_bps
        self.loss_down, self.loss_up = loss_down, loss_up
        self.rwnd, self.cc, self.use_tlp, self.use_rack = rwnd_segments, cc, tlp, rack
        self.rng, self.drops = rng, drops
        self.one_way = rtt_s / 2.0
        self.ack_delay = _ser(HEADER_BYTES, up_rate_bps) + self.one_way
        total = size + header_bytes
        self.n = max(1, math.ceil(total / mss))
        self.ser_seg = [_ser(min(mss, total - i * mss) + HEADER_BYTES, rate_bps) for i in range(self.n)]
        self.dropped = 0
        self.syn_tx = self.request_tx = 0
        self.data_retransmits = self.loss_probes = self.rtos = self.recoveries = 0
        self.handshake_acks = 0
        self.server_iw = iw
        self.handshake_rtt = self.connect = self.request_read = 0.0
        self.synack_retransmits = 0
        self.srtt = self.mdev = self.rttvar = self.mdev_max = self.min_rtt = self.rto = 0.0
        self.rtt_seq = 0

    def _lost(self, kind: str, index: int, transmission: int, downstream: bool) -> bool:
        p = self.loss_down if downstream else self.loss_up
        if (self.drops and (kind, index, transmission) in self.drops) or (p > 0.0 and self.rng.random() < p):
            self.dropped += 1
            return True
        return False

    # --- handshake and request -------------------------------------------------------------

    def handshake(self) -> None:
        """SYN, SYN-ACK, ACK and request until the server reads the request (client clock)."""
        ow, up = self.one_way, self.up
        syn_up = _ser(SYN_BYTES, up) + ow
        connect0 = _ser(SYN_BYTES, up) + _ser(SYN_BYTES, self.down) + self.rtt  # predict's connect
        synack_down = _ser(SYN_BYTES, self.down) + ow
        ack_up = _ser(HEADER_BYTES, up) + ow
        request_up = _ser(HTTP_REQUEST_BYTES + HEADER_BYTES, up) + ow
        # (time, order, kind, value, other, number)
        events: list[tuple[float, int, int, float, float, int]] = []
        order = itertools.count()
        syn_timer, at_server_syn, synack_timer, at_client_synack, at_server_ack, at_server_request, request_timer = range(7)

        def push(t: float, kind: int, value: float = 0.0, other: float = 0.0, number: int = 0) -> None:
            heapq.heappush(events, (t, next(order), kind, value, other, number))

        def send_syn(t: float) -> None:
            self.syn_tx += 1
            if not self._lost("syn", 0, self.syn_tx - 1, False):
                push(t + syn_up, at_server_syn, t)

        synack_sent: list[float] = []
        server_ts_recent = 0.0  # send time of the latest SYN the server heard
        synack_gen = num_timeout = 0

        def send_synack(t: float, answering_syn: float | None) -> None:
            synack_sent.append(t)
            if self._lost("synack", 0, len(synack_sent) - 1, True):
                return
            arrival = answering_syn + connect0 if answering_syn is not None else t + synack_down
            push(arrival, at_client_synack, t, server_ts_recent, len(synack_sent) - 1)

        def arm_synack_timer(t: float) -> None:
            nonlocal synack_gen
            synack_gen += 1
            tie = -1e-6 if self.rng.random() < SYNACK_TIMER_FIRST else 1e-6
            push(t + min(INITIAL_RTO_S * 2**num_timeout, RTO_MAX_S) + tie, synack_timer, number=synack_gen)

        syn_rto, syn_gen = INITIAL_RTO_S, 0
        server_state = 0  # 0 nothing, 1 SYN_RECV, 2 established
        connect: float | None = None
        client_ts_recent = 0.0  # send time of the latest SYN-ACK the client heard
        request_sent = client_srtt = client_rto = 0.0
        request_gen = 0
        send_syn(0.0)
        push(syn_rto, syn_timer, number=syn_gen)
        for _ in range(_MAX_EVENTS):
            now, _order, kind, value, other, number = heapq.heappop(events)
            if kind == syn_timer:
                if number == syn_gen and connect is None:
                    send_syn(now)
                    syn_rto = min(2 * syn_rto, RTO_MAX_S)
                    syn_gen += 1
                    push(now + syn_rto, syn_timer, number=syn_gen)
            elif kind == at_server_syn:
                server_ts_recent = value
                if server_state == 0:
                    server_state = 1
                    send_synack(now, value)
                    arm_synack_timer(now)
                elif server_state == 1:  # a retransmitted SYN: answered at once, the timer pushed back
                    send_synack(now, value)
                    arm_synack_timer(now)
            elif kind == synack_timer:
                if number == synack_gen and server_state == 1:
                    num_timeout += 1
                    send_synack(now, None)
                    arm_synack_timer(now)
            elif kind == at_client_synack:
                client_ts_recent = value
                if connect is None:
                    connect = now
                    client_srtt = now - other
                    client_rto = rto_after_handshake_s(client_srtt)
                    request_sent = now
                    self._send_handshake_ack(now, ack_up, push, at_server_ack, client_ts_recent)
                    self._send_request(now, request_up, push, at_server_request, client_ts_recent)
                    request_gen += 1
                    pto = min(2 * client_srtt + RTO_MIN_S, client_rto)
                    push(now + pto, request_timer, value=float(_TLP), number=request_gen)
                else:  # a duplicate SYN-ACK: the client acknowledges it again
                    self._send_handshake_ack(now, ack_up, push, at_server_ack, client_ts_recent)
            elif kind == request_timer:
                if number == request_gen:
                    self._send_request(now, request_up, push, at_server_request, client_ts_recent)
                    request_gen += 1
                    if value == _TLP:
                        push(max(request_sent + client_rto, now + TIMER_MIN_S), request_timer, float(_RTO), number=request_gen)
                    else:
                        client_rto = min(2 * client_rto, RTO_MAX_S)
                        push(now + client_rto, request_timer, float(_RTO), number=request_gen)
            elif kind in (at_server_ack, at_server_request):
                if server_state == 1:
                    server_state = 2
                    retransmitted = len(synack_sent) - 1
                    echoes_first = value == synack_sent[0]
                    self.server_iw = 1 if retransmitted > 1 and num_timeout > 0 and not echoes_first else self.iw
                    self.handshake_rtt = now - (synack_sent[0] if retransmitted == 0 else value)
                if kind == at_server_request and server_state == 2:
                    assert connect is not None
                    self.connect, self.request_read = connect, now
                    self.synack_retransmits = len(synack_sent) - 1
                    return
        raise RuntimeError("the handshake did not finish")

    def _send_handshake_ack(self, now: float, trip: float, push: _Push, kind: int, echo: float) -> None:
        self.handshake_acks += 1
        if not self._lost("handshake_ack", 0, self.handshake_acks - 1, False):
            push(now + trip, kind, echo)

    def _send_request(self, now: float, trip: float, push: _Push, kind: int, echo: float) -> None:
        self.request_tx += 1
        if not self._lost("request", 0, self.request_tx - 1, False):
            push(now + trip, kind, echo)

    # --- the response --------------------------------------------------------------------

    def transfer(self) -> None:
        """The response from the request read (time 0) to its last byte acknowledged."""
        n = self.n
        self.events: list[tuple[float, int, int, int, float, int, int, float, bool, int]] = []
        self.order = itertools.count()
        # sender
        self.xmit = [0.0] * n
        self.tx_count = [0] * n
        self.lost = bytearray(n)
        self.retrans = bytearray(n)  # retransmitted and neither acknowledged nor marked lost again
        self.ever_retrans = bytearray(n)
        self.sacked = 0  # bit mask
        self.snd_una = self.snd_nxt = 0
        self.sacked_out = self.lost_out = self.retrans_out = 0
        self.cwnd = self.server_iw
        self.cwnd_cnt = 0
        self.ssthresh = math.inf
        self.prior_cwnd = self.cwnd
        self.prior_ssthresh = math.inf
        self.state = _OPEN
        self.high_seq = 0
        self.prr_delivered = self.prr_out = 0
        self.conservation = False
        self.bbr_prev_state = _OPEN
        self.recovery_start = 0.0
        self.undo_marker = False
        self.retrans_stamp: float | None = None
        self.tlp_high: int | None = None
        self.tlp_retrans = False
        self.rack_rtt = 0.0
        self.rack_xmit = -1.0
        self.rack_seg = -1
        self.rwnd_edge = n if self.rwnd is None else self.rwnd
        self.link_free = 0.0
        self.timer_kind, self.timer_at = _NO_TIMER, math.inf
        self._first_rtt(self.handshake_rtt)
        # receiver
        self.rcv_mask = 0
        self.rcv_nxt = 0
        self.received = 0
        self.ts_recent = 0.0
        self.acks_sent = 0
        self.client_done: float | None = None
        self.server_done = 0.0

        self._send(0.0, prior_packets=0)
        events = self.events
        for _ in range(_MAX_EVENTS):
            if events and events[0][0] <= self.timer_at:
                now, _order, kind, seg, xmit, cum, mask, echo, dsack, edge = heapq.heappop(events)
                if kind == _DATA:
                    self._at_client(now, seg, xmit)
                else:
                    self._at_server(now, cum, mask, echo, dsack, edge)
                    if self.snd_una == n:
                        self.server_done = now
                        return
            elif self.timer_kind != _NO_TIMER:
                now, kind = self.timer_at, self.timer_kind
                self.timer_kind, self.timer_at = _NO_TIMER, math.inf
                if kind == _TLP:
                    self._loss_probe(now)
                elif kind == _RTO:
                    self._rto(now)
                else:
                    self._reorder_timeout(now)
            else:
                raise RuntimeError("the transfer stalled with nothing in flight")
        raise RuntimeError("the transfer did not finish")

    def _transmit(self, i: int, now: float) -> None:
        self.xmit[i] = now
        tx = self.tx_count[i]
        self.tx_count[i] = tx + 1
        if self._lost("data", i, tx, True):
            return
        start = max(now, self.link_free)
        self.link_free = start + self.ser_seg[i]
        arrive = self.link_free + self.one_way
        heapq.heappush(self.events, (arrive, next(self.order), _DATA, i, now, 0, 0, 0.0, False, 0))

    def _at_client(self, t: float, i: int, xmit: float) -> None:
        bit = 1 << i
        dsack = bool(self.rcv_mask & bit)
        if dsack:
            if i < self.rcv_nxt:  # the timestamp echo follows in-order and old segments only
                self.ts_recent = xmit
        else:
            self.rcv_mask |= bit
            self.received += 1
            if i == self.rcv_nxt:
                nxt = i + 1
                while self.rcv_mask >> nxt & 1:
                    nxt += 1
                self.rcv_nxt = nxt
                self.ts_recent = xmit
                if nxt == self.n and self.client_done is None:
                    self.client_done = t
        self.acks_sent += 1
        if self._lost("ack", self.acks_sent - 1, 0, False):
            return
        edge = self.n if self.rwnd is None else self.rcv_nxt + self.rwnd + 2 * self.received
        event = (t + self.ack_delay, next(self.order), _ACK, i, xmit, self.rcv_nxt, self.rcv_mask, self.ts_recent, dsack, edge)
        heapq.heappush(self.events, event)

    def _inflight(self) -> int:
        return (self.snd_nxt - self.snd_una) - (self.sacked_out + self.lost_out) + self.retrans_out

    def _rack_advance(self, i: int, now: float) -> None:
        rtt = now - self.xmit[i]
        if self.ever_retrans[i] and rtt < self.min_rtt:
            return  # ambiguous: maybe the original was (S)ACKed
        self.rack_rtt = rtt
        if self.xmit[i] > self.rack_xmit or (self.xmit[i] == self.rack_xmit and i > self.rack_seg):
            self.rack_xmit, self.rack_seg = self.xmit[i], i

    def _at_server(self, now: float, cum: int, mask: int, echo: float, dsack: bool, edge: int) -> None:
        prior_una = self.snd_una
        self.rwnd_edge = max(self.rwnd_edge, edge)
        delivered = 0
        sack_rtt: float | None = None
        first_ackt: float | None = None
        retrans_acked = False
        rack_before = (self.rack_xmit, self.rack_seg, self.rack_rtt)
        new_sacks = mask & ~self.sacked & ~((1 << cum) - 1) & ((1 << self.snd_nxt) - 1)
        while new_sacks:
            low = new_sacks & -new_sacks
            new_sacks ^= low
            i = low.bit_length() - 1
            self.sacked |= low
            self.sacked_out += 1
            delivered += 1
            if self.lost[i]:
                self.lost[i] = 0
                self.lost_out -= 1
            if self.retrans[i]:
                self.retrans[i] = 0
                self.retrans_out -= 1
            if not self.ever_retrans[i] and sack_rtt is None:
                sack_rtt = now - self.xmit[i]
            self._rack_advance(i, now)
        if cum > self.snd_una:
            for i in range(self.snd_una, cum):
                if self.sacked >> i & 1:
                    self.sacked_out -= 1
                else:
                    delivered += 1
                    self._rack_advance(i, now)
                    if self.ever_retrans[i]:
                        retrans_acked = True
                    elif first_ackt is None:
                        first_ackt = self.xmit[i]
                if self.lost[i]:
                    self.lost[i] = 0
                    self.lost_out -= 1
                if self.retrans[i]:
                    self.retrans[i] = 0
                    self.retrans_out -= 1
            self.sacked &= ~((1 << cum) - 1)
            self.snd_una = cum
        advanced = cum > prior_una
        rack_advanced = (self.rack_xmit, self.rack_seg, self.rack_rtt) != rack_before
        # RTT: the oldest newly acknowledged original, else the first newly SACKed one, else the echo.
        if first_ackt is not None and not retrans_acked:
            self._rtt_sample(now - first_ackt)
        elif sack_rtt is not None:
            self._rtt_sample(sack_rtt)
        elif advanced:
            self._rtt_sample(now - echo)
        if self.tlp_high is not None and cum >= self.tlp_high:  # tcp_process_tlp_ack
            if not self.tlp_retrans or dsack:
                self.tlp_high = None
            elif cum > self.tlp_high:
                self._reduce_cwnd()
                self.tlp_high = None
            elif not advanced and not delivered:
                self.tlp_high = None
        if self.state == _LOSS and advanced and self.undo_marker and self.retrans_stamp is not None and echo < self.retrans_stamp:
            self._undo()  # Eifel: the ACK answers an original sent before the first retransmission
        # tcp_set_xmit_timer, before loss detection may set the reordering timer
        if advanced and not self._schedule_tlp(now, advancing=True):
            self._rearm_rto(now)
        # tcp_fastretrans_alert: leave recovery once high_seq is acknowledged, detect, enter.
        if self.state != _OPEN and self.snd_una >= self.high_seq:
            if self.state == _RECOVERY and self.cc != "bbr" and self.ssthresh < math.inf:
                self.cwnd = int(self.ssthresh)  # tcp_end_cwnd_reduction
            self.state = _OPEN
        newly_lost = 0
        if rack_advanced and (self.sacked_out or self.state != _OPEN or self.retrans_out):
            newly_lost = self._rack_detect(now)
        if self.state == _OPEN and self.lost_out:
            self._enter_recovery(now)
        if self.state == _OPEN and not self.retrans_out and not self.lost_out:
            self.retrans_stamp = None
        # congestion control (tcp_cong_control)
        if self.cc == "bbr":
            self._bbr_cwnd(delivered, newly_lost)
        elif self.state == _RECOVERY:
            self._prr(delivered, newly_lost, advanced)
        elif advanced:
            self._cong_avoid(delivered)
        self._send(now, prior_packets=self.snd_nxt - self.snd_una)

    # --- sending -------------------------------------------------------------------------

    def _send(self, now: float, prior_packets: int) -> None:
        """Lost segments first, then new data, while cwnd allows (``tcp_xmit_retransmit_queue``,
        ``tcp_write_xmit``)."""
        inflight = self._inflight()
        if self.lost_out > 0:
            for i in range(self.snd_una, self.snd_nxt):
                if inflight >= self.cwnd:
                    break
                if self.lost[i] and not self.retrans[i]:
                    self._retransmit(i, now)
                    inflight += 1
                    if i == self.snd_una and self.timer_kind != _REO:
                        self._rearm_rto(now)
        sent = 0
        limit = min(self.n, self.rwnd_edge)
        while self.snd_nxt < limit and inflight < self.cwnd:
            self._new_segment(now)
            inflight += 1
            sent += 1
        if sent:
            if prior_packets == 0 or self.timer_kind == _TLP:
                self._rearm_rto(now)
            self._schedule_tlp(now, advancing=False)

    def _new_segment(self, now: float) -> None:
        self._transmit(self.snd_nxt, now)
        self.snd_nxt += 1
        if self.state == _RECOVERY:
            self.prr_out += 1

    def _retransmit(self, i: int, now: float) -> None:
        self._transmit(i, now)
        self.data_retransmits += 1
        if not self.retrans[i]:
            self.retrans[i] = 1
            self.retrans_out += 1
        self.ever_retrans[i] = 1
        if self.retrans_stamp is None:
            self.retrans_stamp = now
        if self.state == _RECOVERY:
            self.prr_out += 1

    # --- timers --------------------------------------------------------------------------

    def _rearm_rto(self, now: float) -> None:
        if self.snd_nxt == self.snd_una:
            self.timer_kind, self.timer_at = _NO_TIMER, math.inf
            return
        # after a loss probe or a reordering timer: from the head's send time, as tcp_rearm_rto does
        head_based = self.timer_kind in (_TLP, _REO)
        at = max(self.xmit[self.snd_una] + self.rto, now + 1e-6) if head_based else now + self.rto
        self.timer_kind, self.timer_at = _RTO, at

    def _schedule_tlp(self, now: float, advancing: bool) -> bool:
        packets_out = self.snd_nxt - self.snd_una
        if not self.use_tlp or not packets_out or self.state != _OPEN or self.sacked_out or self.lost_out or self.retrans_out:
            return False
        timeout = 2 * self.srtt + (RTO_MIN_S if packets_out == 1 else TIMER_MIN_S)
        rto_delta = self.rto if advancing else self.xmit[self.snd_una] + self.rto - now
        if rto_delta > 0:
            timeout = min(timeout, rto_delta)
        self.timer_kind, self.timer_at = _TLP, now + timeout
        return True

    def _loss_probe(self, now: float) -> None:
        """``tcp_send_loss_probe``: new data if the window allows, else the last segment again."""
        if self.tlp_high is None:
            if self.snd_nxt < min(self.n, self.rwnd_edge):
                self._new_segment(now)
                self.tlp_retrans = False
            else:
                last = self.snd_nxt - 1
                while last > self.snd_una and self.sacked >> last & 1:
                    last -= 1
                self._retransmit(last, now)
                self.tlp_retrans = True
            self.loss_probes += 1
            self.tlp_high = self.snd_nxt
        self.timer_kind = _TLP
        self._rearm_rto(now)

    def _rto(self, now: float) -> None:
        """``tcp_retransmit_timer``: enter Loss, resend the head, back the timer off."""
        if self.snd_nxt == self.snd_una:
            return
        self.rtos += 1
        if self.state == _OPEN:
            self.prior_ssthresh, self.prior_cwnd = self.ssthresh, self.cwnd
            self.ssthresh = self._cc_ssthresh()
            self.undo_marker = True
        # tcp_timeout_mark_lost: the head, and what RACK's clock says has had time to arrive
        for i in range(self.snd_una, self.snd_nxt):
            if self.sacked >> i & 1:
                continue
            if i != self.snd_una and self.use_rack and self.xmit[i] + self.rack_rtt - now > 0:
                continue
            if self.retrans[i]:
                self.retrans[i] = 0
                self.retrans_out -= 1
            if not self.lost[i]:
                self.lost[i] = 1
                self.lost_out += 1
        self.cwnd = self._inflight() + 1
        self.cwnd_cnt = 0
        self.high_seq = self.snd_nxt
        self.state = _LOSS
        self.conservation = False
        self.tlp_high = None
        self._retransmit(self.snd_una, now)
        self.rto = min(2 * self.rto, RTO_MAX_S)
        self.timer_kind, self.timer_at = _RTO, now + self.rto

    def _reorder_timeout(self, now: float) -> None:
        """``tcp_rack_reo_timeout``: mark what is now overdue, recover, resend."""
        if self._rack_detect(now, rearm=False):
            if self.state == _OPEN:
                self._enter_recovery(now)
                if self.cc != "bbr":
                    self._prr(1, 0, False)
            self.timer_kind = _REO
            self._send(now, prior_packets=self.snd_nxt - self.snd_una)
        if self.timer_kind != _RTO:
            self.timer_kind = _REO
            self._rearm_rto(now)

    # --- loss detection and recovery -----------------------------------------------------

    def _rack_detect(self, now: float, rearm: bool = True) -> int:
        """RACK (``tcp_rack_detect_loss``): a segment sent before the most recently sent
        delivered one is lost once ``rack_rtt + reo_wnd`` has passed since it was sent."""
        if not self.use_rack and self.sacked_out < DUPTHRESH and self.state == _OPEN:
            return 0
        in_recovery = self.state != _OPEN or self.sacked_out >= DUPTHRESH
        reo_wnd = 0.0 if in_recovery else min(self.min_rtt / 4, self.srtt)
        newly_lost = 0
        wait = 0.0
        for i in range(self.snd_una, self.snd_nxt):
            if self.sacked >> i & 1 or (self.lost[i] and not self.retrans[i]):
                continue
            x = self.xmit[i]
            if not (self.rack_xmit > x or (self.rack_xmit == x and self.rack_seg > i)):
                continue
            remaining = x + self.rack_rtt + reo_wnd - now
            if remaining <= 0:
                if self.retrans[i]:
                    self.retrans[i] = 0
                    self.retrans_out -= 1
                self.lost[i] = 1
                self.lost_out += 1
                newly_lost += 1
            else:
                wait = max(wait, remaining)
        if wait > 0 and rearm:
            self.timer_kind, self.timer_at = _REO, now + wait + TIMER_MIN_S
        return newly_lost

    def _enter_recovery(self, now: float) -> None:
        self.recoveries += 1
        self.prior_ssthresh = self.ssthresh
        self.prior_cwnd = self.cwnd
        self.ssthresh = self._cc_ssthresh()
        self.high_seq = self.snd_nxt
        self.tlp_high = None
        self.cwnd_cnt = 0
        self.prr_delivered = self.prr_out = 0
        self.undo_marker = True
        self.state = _RECOVERY
        self.recovery_start = now

    def _cc_ssthresh(self) -> float:
        if self.cc == "reno":
            return float(max(self.cwnd >> 1, 2))
        if self.cc == "cubic":
            return float(max(int(self.cwnd * CUBIC_BETA), 2))
        return math.inf

    def _reduce_cwnd(self) -> None:
        """A loss probe repaired a loss: CWR, cwnd down to ssthresh at once."""
        self.ssthresh = self._cc_ssthresh()
        if self.ssthresh < math.inf:
            self.cwnd = int(self.ssthresh)

    def _undo(self) -> None:
        for i in range(self.snd_una, self.snd_nxt):
            self.lost[i] = 0
        self.lost_out = 0
        self.cwnd = max(self.cwnd, self.prior_cwnd)
        self.ssthresh = max(self.ssthresh, self.prior_ssthresh)
        self.undo_marker = False
        self.state = _OPEN

    def _prr(self, delivered: int, newly_lost: int, una_advanced: bool) -> None:
        """Proportional Rate Reduction (``tcp_cwnd_reduction``)."""
        if delivered <= 0:
            return
        self.prr_delivered += delivered
        inflight = self._inflight()
        ssthresh = int(self.ssthresh)
        delta = ssthresh - inflight
        if delta < 0:
            sndcnt = (ssthresh * self.prr_delivered + self.prior_cwnd - 1) // self.prior_cwnd - self.prr_out
        else:
            sndcnt = max(self.prr_delivered - self.prr_out, delivered)
            if una_advanced and not newly_lost:
                sndcnt += 1
            sndcnt = min(delta, sndcnt)
        sndcnt = max(sndcnt, 0 if self.prr_out else 1)
        self.cwnd = inflight + sndcnt

    def _cong_avoid(self, acked: int) -> None:
        """Slow start up to ssthresh, then one segment per window (``tcp_reno_cong_avoid``)."""
        if self.cwnd < self.ssthresh:
            grown = int(min(self.cwnd + acked, self.ssthresh))
            acked -= grown - self.cwnd
            self.cwnd = grown
            if acked <= 0:
                return
        self.cwnd_cnt += acked
        if self.cwnd_cnt >= self.cwnd:
            self.cwnd, self.cwnd_cnt = self.cwnd + self.cwnd_cnt // self.cwnd, self.cwnd_cnt % self.cwnd

    def _bbr_cwnd(self, delivered: int, newly_lost: int) -> None:
        """BBR's window on loss (``bbr_set_cwnd``, ``bbr_set_cwnd_to_recover_or_restore``)."""
        if not delivered:
            return
        cwnd = self.cwnd
        if newly_lost:
            cwnd = max(cwnd - newly_lost, 1)
        prev, self.bbr_prev_state = self.bbr_prev_state, self.state
        if self.state == _RECOVERY and prev != _RECOVERY:
            self.conservation = True
            cwnd = self._inflight() + delivered
        elif prev != _OPEN and self.state == _OPEN:
            cwnd = max(cwnd, self.prior_cwnd)
            self.conservation = False
        elif self.conservation and self.rack_xmit >= self.recovery_start:
            self.conservation = False  # a round has passed since recovery began
        if self.conservation:
            self.cwnd = max(cwnd, self._inflight() + delivered)
            return
        self.cwnd = max(cwnd + delivered, BBR_CWND_MIN)

    # --- RTT estimator (tcp_rtt_estimator, tcp_set_rto) ------------------------------------

    def _first_rtt(self, m: float) -> None:
        self.srtt = m
        self.mdev = 2 * m
        self.rttvar = max(self.mdev, RTO_MIN_S)
        self.mdev_max = self.rttvar
        self.rtt_seq = 0
        self.min_rtt = m
        self.rto = min(self.srtt + self.rttvar, RTO_MAX_S)

    def _rtt_sample(self, m: float) -> None:
        self.min_rtt = min(self.min_rtt, m)
        err = m - self.srtt
        self.srtt += err / 8
        if err < 0:
            err = -err - self.mdev / 4
            if err > 0:
                err /= 8
        else:
            err -= self.mdev / 4
        self.mdev += err
        if self.mdev > self.mdev_max:
            self.mdev_max = self.mdev
            if self.mdev_max > self.rttvar:
                self.rttvar = self.mdev_max
        if self.snd_una > self.rtt_seq:
            if self.mdev_max < self.rttvar:
                self.rttvar -= (self.rttvar - self.mdev_max) / 4
            self.rtt_seq = self.snd_nxt
            self.mdev_max = RTO_MIN_S
        self.rto = min(self.srtt + self.rttvar, RTO_MAX_S)

    def trial(self) -> Trial:
        assert self.client_done is not None
        return Trial(
            size=self.size,
            segments=self.n,
            server_latency_s=self.server_done,
            client_total_s=self.request_read + self.client_done,
            connect_s=self.connect,
            request_read_s=self.request_read,
            server_iw=self.server_iw,
            dropped=self.dropped,
            syn_retransmits=self.syn_tx - 1,
            synack_retransmits=self.synack_retransmits,
            request_retransmits=self.request_tx - 1,
            data_retransmits=self.data_retransmits,
            loss_probes=self.loss_probes,
            rtos=self.rtos,
            recoveries=self.recoveries,
        )


def _check(iw: int, rtt_s: float, loss: float, up_loss: float) -> None:
    if iw < 1:
        raise ValueError("iw must be at least 1")
    if rtt_s < 0:
        raise ValueError("rtt_s must not be negative")
    for name, value in (("loss", loss), ("up_loss", up_loss)):
        if not 0.0 <= value < 0.5:
            raise ValueError(f"{name} must be within [0, 0.5), not {value!r}")


def simulate_connection(
    size: int,
    iw: int,
    rtt_s: float,
    rate_bps: float | None,
    loss: float = 0.0,
    *,
    rng: random.Random | None = None,
    up_rate_bps: float | None = None,
    up_loss: float | None = None,
    mss: int = DEFAULT_MSS,
    header_bytes: int = HTTP_HEADER_BYTES,
    rwnd_segments: int | None = None,
    cc: CongestionControl = "cubic",
    tlp: bool = True,
    rack: bool = True,
    drops: Collection[Drop] = (),
) -> Trial:
    """One connection fetching ``size`` body bytes at IW ``iw``: handshake, request, response.

    ``loss`` drops each packet towards the client, ``up_loss`` (default: ``loss``) each one
    towards the server; ``drops`` drops chosen packets besides (see :data:`Drop`). ``tlp`` and
    ``rack`` switch the tail loss probe and RACK's reordering window off (then a loss is found
    by three SACKed segments above it or the RTO, as in Reno with SACK)."""
    up = loss if up_loss is None else up_loss
    _check(iw, rtt_s, loss, up)
    if rwnd_segments is not None and rwnd_segments < 1:
        raise ValueError("rwnd_segments must be at least 1")
    connection = _Connection(
        size=size,
        iw=iw,
        rtt_s=rtt_s,
        rate_bps=rate_bps,
        up_rate_bps=rate_bps if up_rate_bps is None else up_rate_bps,
        loss_down=loss,
        loss_up=up,
        mss=mss,
        header_bytes=header_bytes,
        rwnd_segments=rwnd_segments,
        cc=cc,
        tlp=tlp,
        rack=rack,
        rng=rng or random.Random(0),
        drops=frozenset(drops),
    )
    connection.handshake()
    connection.transfer()
    return connection.trial()


def predict_with_loss(
    size: int | Sequence[int],
    iw: int,
    rtt_s: float,
    rate_bps: float | None,
    loss: float,
    *,
    up_rate_bps: float | None = None,
    up_loss: float | None = None,
    mss: int = DEFAULT_MSS,
    header_bytes: int = HTTP_HEADER_BYTES,
    rwnd_segments: int | None = None,
    cc: CongestionControl = "cubic",
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
    keep_samples: bool = False,
    tlp: bool = True,
    rack: bool = True,
) -> LossPrediction:
    """The distribution of latency over ``samples`` trials of :func:`simulate_connection`.

    ``size`` is one body size or several (trial ``i`` fetches ``size[i % len(size)]``, so a
    list of sizes from a distribution gives the distribution over sizes and losses together:
    :func:`websearch_sizes`). ``loss`` is the probability that the link drops a packet, each
    direction independently (``up_loss`` sets the direction towards the server apart). The
    trials draw from ``random.Random(seed)``: the same arguments give the same result. Without
    loss every trial of a size is the same, and :func:`~iwscope_lab.model.predict`'s."""
    sizes = [size] if isinstance(size, int) else list(size)
    if not sizes:
        raise ValueError("no sizes")
    if samples < 1:
        raise ValueError("samples must be at least 1")
    up = loss if up_loss is None else up_loss
    _check(iw, rtt_s, loss, up)
    rng = random.Random(seed)
    cache: dict[int, Trial] = {}
    trials: list[Trial] = []
    for index in range(samples):
        body = sizes[index % len(sizes)]
        if loss == 0.0 and up == 0.0 and body in cache:  # deterministic: one trial per size
            trials.append(cache[body])
            continue
        trial = simulate_connection(
            body,
            iw,
            rtt_s,
            rate_bps,
            loss,
            rng=rng,
            up_rate_bps=up_rate_bps,
            up_loss=up,
            mss=mss,
            header_bytes=header_bytes,
            rwnd_segments=rwnd_segments,
            cc=cc,
            tlp=tlp,
            rack=rack,
        )
        cache[body] = trial
        trials.append(trial)
    count = len(trials)
    return LossPrediction(
        samples=count,
        loss=loss,
        server=Spread.of([t.server_latency_s for t in trials]),
        client=Spread.of([t.client_total_s for t in trials]),
        p_no_loss=sum(t.dropped == 0 for t in trials) / count,
        p_server_retrans=sum(t.server_total_retrans > 0 for t in trials) / count,
        p_rto=sum(t.rtos > 0 for t in trials) / count,
        p_syn_retrans=sum(t.syn_retransmits > 0 for t in trials) / count,
        p_iw_reset=sum(t.server_iw < iw for t in trials) / count,
        trials=tuple(trials) if keep_samples else (),
    )


def websearch_sizes(count: int = 100) -> list[int]:
    """``count`` body sizes at evenly spaced quantiles of the ``websearch`` model
    (``iwprobe.sizes``, what the lab's ``size_dist="websearch"`` campaigns draw from)."""
    from iwprobe import sizes

    return [sizes.quantile("websearch", (index + 0.5) / count) for index in range(count)]


# --- Cardwell, Savage and Anderson (INFOCOM 2000) -----------------------------------------------


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
    sample, :func:`~iwscope_lab.model.rto_after_handshake_s`) as T0, and the 1 s initial SYN
    timeout as Ts. Its assumptions: rounds of exactly one RTT (no serialisation at a bottleneck,
    so compare it on fast paths), a continuous number of slow-start rounds (log, not its
    ceiling: at no loss it is below :func:`~iwscope_lab.model.predict` unless the segments are
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
