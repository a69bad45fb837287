"""The latency of a short transfer under random loss: a Monte-Carlo over a packet-level model of
Linux's TCP (:func:`predict_with_loss`), and Cardwell, Savage and Anderson's closed form beside
it (:func:`csa_latency`).

The path is :func:`iwscope.model.predict`'s -- round-trip propagation ``rtt_s`` split evenly,
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
  :func:`~iwscope.model.rto_after_handshake_s`. The client sends its ACK and the request at
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
(:attr:`~iwscope.model.Prediction.spurious_rto_expected`): the simulation plays it, with
the Eifel undo. :func:`csa_latency` is kept beside it for comparison.

A distribution (:func:`predict_with_loss`) is over independent trials, each drawing its own
losses; with several object sizes, trial ``i`` fetches ``sizes[i % len(sizes)]`` (give
:func:`iwscope_lab.reproduce.websearch_sizes` for the lab's web-search mix), so the summary is over sizes and losses
together, as the lab's arms are.

This module holds the entry points (public through :mod:`iwscope.model`); the parts live in
private modules: the constants and result
types (``_loss_types``), the simulated connection as a stack of classes -- its parameters
and the handshake (``_loss_handshake``), the sender's data path and RTT estimator
(``_loss_sender``), loss recovery (``_loss_recovery``), the event loop and ACK
processing (``_loss_connection``) -- and the closed form (``_loss_csa``).
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence

from iwscope.model._loss_connection import _Connection
from iwscope.model._loss_types import (
    DEFAULT_SAMPLES,
    CongestionControl,
    Drop,
    LossPrediction,
    Spread,
    Trial,
)
from iwscope.model._slowstart import DEFAULT_MSS, HTTP_HEADER_BYTES


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
    list of sizes from a distribution gives the distribution over sizes and losses together,
    e.g. ``iwscope_lab.reproduce.websearch_sizes``). ``loss`` is the probability that the link
    drops a packet, each direction independently (``up_loss`` sets the direction towards the server apart). The
    trials draw from ``random.Random(seed)``: the same arguments give the same result. Without
    loss every trial of a size is the same, and :func:`~iwscope.model.predict`'s."""
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
