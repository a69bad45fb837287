"""Infer the server's initial window from the packets the probe captured (pure; no I/O).

The server may send its first flight of data before any acknowledgement of it reaches it:
that flight is its initial window (IW).  On the probe every data segment that arrives before
data released by the probe's first ACK *could* arrive was sent without an ACK, so it is in the
IW.  The earliest such released data arrives one round trip after that ACK left::

    cutoff = first data's arrival + CUTOFF_RTT_FRACTION x RTT

(the probe ACKs at once in quick-ACK mode; RTT: the smaller of the SYN -> SYN-ACK time and
``TCP_INFO`` ``min_rtt``; no outgoing packet's time is used, see :mod:`iwprobe._capture`).  The
segments before the cutoff are always a lower bound of the IW; they are the IW only when the
server stopped because its window was used up, which the probe sees as:

* the object continues after the cutoff (else ``lower_bound``: the object ended inside the
  window), and the server sent it without new data from the probe (else ``client_data``: a
  TLS flight that was complete, the server waiting for the client's next message);
* at least two segments' worth followed it before any new data from the probe (else
  ``object_ended``: a lone short tail that Nagle held behind a short first segment, e.g. a
  TLS ServerHello written alone, would look like the window's edge);
* the window was smaller than the probe's receive window (else ``receive_window``: a Linux
  probe offers 64,256 bytes in its first window: 44 segments of 1,448 bytes);
* the window had finished arriving well before the cutoff: a silent gap of at least
  ``GAP_RTT_FRACTION`` x RTT and ``GAP_SPACING_FACTOR`` x the window's largest segment
  spacing before the next data (else ``lower_bound``: serialising the window at the
  bottleneck took about a round trip or more, so released data may queue right behind it);
* the data after the gap comes when an ACK could have released it, not much later, and no
  more of it arrives within the next ``CUTOFF_RTT_FRACTION`` x RTT than the window's ACKs can
  release: twice the window, slow start's most, or the window + 3 (BBR raises its window to 4
  segments at the first ACK) (else ``lower_bound`` ``paused``: the server stopped writing, e.g.
  a head written alone and the body most of an RTT later, and what followed was not
  ACK-clocked);
* no loss, retransmission or reordering among the window's segments, and the data after the
  window starts where the window ended (else ``undetermined``: a window whose last segments
  were lost looks complete and smaller), and the handshake seen (else ``undetermined``).

Segments are counted as the sender sent them: a packet the probe's GRO merged is split by the
sender's MSS, ``TCP_INFO`` ``rcv_mss`` (the kernel's measure of it, GRO included).  Without it
the largest payload is taken, unless a payload exceeds the MSS the probe's SYN announced (the
sender may not: GRO merged it; then ``undetermined`` ``no_mss``); merged packets that still fit
under the announced MSS cannot be told from segments, so callers on a GRO interface pass
``rcv_mss`` (:func:`iwprobe._fetch.fetch` does).  The RTT is not sampled from a handshake whose
SYN was retransmitted (Karn: the SYN-ACK may answer either SYN).  Linux counts
its IW in packets (``initcwnd``), so a short first segment (an HTTP head written alone) counts
as one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from . import wire
from ._capture import Packet

#: Data released by the first ACK cannot arrive before this share of an RTT after it.
CUTOFF_RTT_FRACTION = 0.75
#: The silence between the window and the next data, as a share of the RTT, at least.
GAP_RTT_FRACTION = 0.2
#: ... and as a multiple of the largest spacing between the window's own packets.
GAP_SPACING_FACTOR = 4.0
#: ... and as a multiple of the time the bottleneck takes to serialise the packet after it
#: (its bytes at the rate the data after the window arrives): on a modem a short head written
#: alone is followed by ~200 ms of one full packet's serialisation, which is no window's edge.
GAP_SERIALISATION_FACTOR = 2.0
#: Data after the gap later than this many RTTs after the first ACK (plus the slack) was not
#: released by ACKs: the server paused.
PAUSE_RTT_FACTOR = 2.0
PAUSE_SLACK_NS = 5_000_000
#: Linux BBR's smallest congestion window (``bbr_cwnd_min_target``), set from the first ACK on:
#: after an IW of 1 or 2 the next round can be 4 or 5 segments, more than slow start's double.
BBR_MIN_CWND = 4

STATUSES = ("ok", "lower_bound", "undetermined")


@dataclass
class Inference:
    """The inferred initial window of one connection."""

    #: ``ok``: the IW is ``iw_segments``; ``lower_bound``: it is at least that; ``undetermined``.
    status: str
    iw_segments: Optional[int] = None
    iw_bytes: Optional[int] = None
    #: The sender's segment payload size (bytes), as observed.
    mss: Optional[int] = None
    #: Why the status is not ``ok`` (a word: ``object_ended``, ``bottleneck``, ``paused``,
    #: ``receive_window``, ``client_data``, ``loss``, ``no_handshake``, ``no_data``, ``no_rtt``,
    #: ``no_mss``, ``capture_dropped``).
    reason: str = ""
    #: The RTT used (µs), the silence after the window and the window's arrival span (µs).
    rtt_us: Optional[int] = None
    gap_us: Optional[int] = None
    span_us: Optional[int] = None
    #: The MSS options of the probe's SYN and the server's SYN-ACK.
    client_mss_option: Optional[int] = None
    server_mss_option: Optional[int] = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_wire(self) -> wire.ClientIw:
        """The trial's ``client_iw`` (wire v5): no segment count when undetermined."""
        counted = self.status != "undetermined"
        return wire.ClientIw(
            status=self.status,
            segments=self.iw_segments if counted else None,
            bytes=self.iw_bytes if counted else None,
            mss=self.mss,
            reason=self.reason[: wire.MAX_IW_REASON_CHARS],
        )


def _segments(payload: int, mss: int) -> int:
    return max(1, -(-payload // mss))


@dataclass(frozen=True)
class FirstFlight:
    """The server's first flight as the probe received it: the data packets that arrived
    before ``first data + CUTOFF_RTT_FRACTION x RTT`` (``window``) and those after (``later``)."""

    syn: Packet
    syn_ack: Packet
    #: Every packet the probe received, and its data packets split at the cutoff.
    arrived: list[Packet]
    window: list[Packet]
    later: list[Packet]
    #: The sender's segment size used to count GRO-merged packets, the RTT and the cutoff (ns).
    mss: int
    rtt_ns: int
    cutoff_ns: int

    @property
    def first(self) -> Packet:
        """The first data packet (the cutoff's start)."""
        return (self.window or self.later)[0]

    @property
    def segments(self) -> int:
        """The window in the sender's segments (a GRO-merged packet split by ``mss``)."""
        return sum(_segments(p.payload, self.mss) for p in self.window)

    @property
    def payload_bytes(self) -> int:
        return sum(p.payload for p in self.window)


def first_flight(
    packets: Sequence[Packet], rcv_mss: Optional[int] = None, min_rtt_us: Optional[int] = None
) -> Optional[FirstFlight]:
    """The first flight of :func:`infer` (the same cutoff, RTT and MSS), without its judgement
    of whether it is the IW; None when it has no handshake, data, RTT or MSS.  A flight with a
    hole is returned as it arrived (``infer`` calls it ``loss``)."""
    return _split_first_flight(packets, rcv_mss, min_rtt_us, Inference("undetermined"))


def _split_first_flight(
    packets: Sequence[Packet], rcv_mss: Optional[int], min_rtt_us: Optional[int], result: Inference
) -> Optional[FirstFlight]:
    """The handshake, MSS, RTT and the cutoff of the first flight; None with ``result``'s reason
    (and its MSS options, MSS and RTT as far as found) when one of them is missing."""
    syn = next((p for p in packets if p.outgoing and p.syn and not p.has_ack), None)
    syn_ack = next((p for p in packets if not p.outgoing and p.syn and p.has_ack), None)
    if syn is None or syn_ack is None:
        result.reason = "no_handshake"
        return None
    result.client_mss_option, result.server_mss_option = syn.mss_option, syn_ack.mss_option
    arrived = [p for p in packets if not p.outgoing]
    data = [p for p in arrived if p.payload > 0]
    if not data:
        result.reason = "no_data"
        return None
    if rcv_mss:
        mss = rcv_mss
    elif syn.mss_option is not None and any(p.payload > syn.mss_option for p in data):
        # Larger than the MSS the probe announced: GRO merged it, and no payload is known to be
        # a single segment.
        result.reason = "no_mss"
        result.notes.append("GRO merged packets and TCP_INFO's rcv_mss is missing: the sender's MSS is unknown")
        return None
    else:
        mss = max(p.payload for p in data)
    result.mss = mss
    first = data[0]
    # Round trip: the probe's own samples (outgoing stamps are not trusted, see _capture).
    samples = [value * 1000 for value in (min_rtt_us,) if value]
    syns = [p for p in packets if p.outgoing and p.syn and not p.has_ack]
    if len(syns) == 1 and syn.time_ns < syn_ack.time_ns:
        samples.append(syn_ack.time_ns - syn.time_ns)
    if not samples:
        result.reason = "no_rtt"
        return None
    rtt = max(1, min(samples))
    result.rtt_us = rtt // 1000
    # The probe acknowledges the first data at once (quick-ACK mode at a connection's start):
    # nothing it released can arrive before ``cutoff``.
    cutoff = first.time_ns + int(CUTOFF_RTT_FRACTION * rtt)
    window = [p for p in data if p.time_ns < cutoff]
    later = [p for p in data if p.time_ns >= cutoff]
    return FirstFlight(syn, syn_ack, arrived, window, later, mss, rtt, cutoff)


def infer(
    packets: Sequence[Packet], rcv_mss: Optional[int] = None, dropped: int = 0, min_rtt_us: Optional[int] = None
) -> Inference:
    """The IW of the connection whose packets (both directions, in capture order) these are.

    ``rcv_mss`` and ``min_rtt_us``: the probe socket's ``TCP_INFO`` after the fetch (the
    sender's segment size as the kernel measured it, GRO included, and the connection's
    smallest RTT sample); ``dropped``: packets the capture's queue dropped."""
    result = Inference("undetermined")
    flight = _split_first_flight(packets, rcv_mss, min_rtt_us, result)
    if flight is None:
        return result
    syn, arrived, window, later, mss, rtt = flight.syn, flight.arrived, flight.window, flight.later, flight.mss, flight.rtt_ns
    server_isn = flight.syn_ack.seq
    first, cutoff = flight.first, flight.cutoff_ns
    first_offset = (first.seq - server_isn - 1) % 2**32
    if first_offset != 0:
        result.reason = "loss"
        result.notes.append(f"the first data segment starts {first_offset} bytes into the stream")
        return result
    expected = 0
    for packet in window:
        offset = (packet.seq - server_isn - 1) % 2**32
        if offset != expected:
            result.reason = "loss"
            result.notes.append(f"a segment at offset {offset} where {expected} was expected")
            return result
        expected += packet.payload
    result.iw_segments, result.iw_bytes = flight.segments, flight.payload_bytes
    last = window[-1]
    result.span_us = (last.time_ns - first.time_ns) // 1000
    result.status = "lower_bound"
    if not later and dropped:  # the queue keeps the earliest packets: the end may be missing
        result.status, result.reason = "undetermined", "capture_dropped"
        result.notes.append(f"the kernel dropped {dropped} captured packets before the window's end was seen")
        return result
    if not later or any(p.fin and p.time_ns < cutoff for p in arrived):
        result.reason = "object_ended"
        return result
    following = later[0]
    result.gap_us = (following.time_ns - last.time_ns) // 1000
    following_offset = (following.seq - server_isn - 1) % 2**32
    if following_offset != expected:
        # The window's tail was lost (the data its ACKs released came first) or it was
        # retransmitted: the window's end is not known.
        result.status, result.reason = "undetermined", "loss"
        result.notes.append(f"the data after the window starts at offset {following_offset}, the window ended at {expected}")
        return result
    if 0 < (following.ack - last.ack) % 2**32 < 2**31:
        # The server had new data from the probe before it sent more: e.g. a TLS flight was
        # complete and the server waited for the client's Finished.
        result.reason = "client_data"
        return result
    released = [p for p in later if (p.ack - last.ack) % 2**32 == 0]
    if sum(p.payload for p in released) < 2 * mss:
        # Less than two segments followed: a lone tail the sender held back (Nagle, behind a
        # short first segment) looks like a window's edge, so only a lower bound.
        result.reason = "object_ended"
        return result
    receive_window = _receive_window(packets, syn, first)
    if receive_window is not None and result.iw_bytes + mss > receive_window:
        result.reason = "receive_window"
        result.notes.append(
            f"the probe's receive window ({receive_window} bytes) limited the first flight; "
            "a smaller announced MSS fits more segments in it"
        )
        return result
    spacing = max((b.time_ns - a.time_ns for a, b in zip(window, window[1:])), default=0)
    serialising = _serialisation_ns(later, following, mss)
    if following.time_ns - last.time_ns < max(
        GAP_RTT_FRACTION * rtt, GAP_SPACING_FACTOR * spacing, GAP_SERIALISATION_FACTOR * serialising
    ):
        result.reason = "bottleneck"
        result.notes.append("the window was still arriving when released data could; a slower bottleneck than window / RTT")
        return result
    if following.time_ns > first.time_ns + PAUSE_RTT_FACTOR * rtt + PAUSE_SLACK_NS:
        result.reason = "paused"
        result.notes.append("the data after the window came later than ACKs could have released it")
        return result
    # Slow start (Reno, CUBIC, BBR alike) grows the window by one segment per segment ACKed, so
    # the window's ACKs release at most twice it -- or, from BBR, whose window is at least
    # BBR_MIN_CWND segments from the first ACK on, max(w + 1, 4) + (w - 1); the next round's
    # ACKs' data cannot arrive before ``following`` + an RTT.  More in between: the window was
    # not the congestion window's (the server had paused), only a lower bound.
    next_round = sum(_segments(p.payload, mss) for p in later if p.time_ns < following.time_ns + int(CUTOFF_RTT_FRACTION * rtt))
    if next_round > max(2 * result.iw_segments, result.iw_segments + BBR_MIN_CWND - 1):
        result.reason = "paused"
        result.notes.append(
            f"{next_round} segments followed the window of {result.iw_segments} within an RTT: more than its ACKs could release"
        )
        return result
    result.status = "ok"
    return result


def _serialisation_ns(later: Sequence[Packet], following: Packet, mss: int) -> float:
    """How long the path's bottleneck takes to deliver ``following``: its segments times the
    median arrival spacing per segment of the data after the window (back to back behind the
    bottleneck, that spacing is its per-segment serialisation); 0 when no two packets follow.
    One spacing is enough: a spacing that is not the bottleneck's (an ACK clock's round) is
    longer, which only turns an ``ok`` into a ``lower_bound`` -- requiring two let the demo's
    modem path, whose object ended two packets after the first, read as ``ok 1``."""
    per_segment = sorted(
        (b.time_ns - a.time_ns) / _segments(b.payload, mss) for a, b in zip(later, later[1:]) if b.time_ns > a.time_ns
    )
    if not per_segment:
        return 0.0
    return per_segment[len(per_segment) // 2] * _segments(following.payload, mss)


def _receive_window(packets: Sequence[Packet], syn: Packet, first: Packet) -> Optional[int]:
    """The window (bytes) the probe offered when the server's first data left: the last
    non-SYN window it sent before that data arrived (sequence order: outgoing packets are in
    capture order), scaled by its SYN's window-scale option."""
    shift = syn.wscale_option or 0
    offered: Optional[int] = None
    for packet in packets:
        if packet is first:
            break
        if packet.outgoing and not packet.syn:
            offered = packet.window << shift
    return offered
