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
  probe offers at most 64 KB in its first window, 45 segments of 1,448 bytes);
* the window had finished arriving well before the cutoff: a silent gap of at least
  ``GAP_RTT_FRACTION`` x RTT and ``GAP_SPACING_FACTOR`` x the window's largest segment
  spacing before the next data (else ``lower_bound``: serialising the window at the
  bottleneck took about a round trip or more, so released data may queue right behind it);
* the data after the gap comes when an ACK could have released it, not much later (else
  ``lower_bound``: the server paused, application-limited);
* no loss, retransmission or reordering among the window's segments, and the handshake seen
  (else ``undetermined``).

Segments are counted as the sender sent them: a packet the probe's GRO merged is split by the
sender's MSS (the largest single-segment payload, or ``TCP_INFO`` ``rcv_mss``).  Linux counts
its IW in packets (``initcwnd``), so a short first segment (an HTTP head written alone) counts
as one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from ._capture import Packet

#: Data released by the first ACK cannot arrive before this share of an RTT after it.
CUTOFF_RTT_FRACTION = 0.75
#: The silence between the window and the next data, as a share of the RTT, at least.
GAP_RTT_FRACTION = 0.2
#: ... and as a multiple of the largest spacing between the window's own packets.
GAP_SPACING_FACTOR = 4.0
#: Data after the gap later than this many RTTs after the first ACK (plus the slack) was not
#: released by ACKs: the server paused.
PAUSE_RTT_FACTOR = 2.0
PAUSE_SLACK_NS = 5_000_000

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
    #: ``loss``, ``no_handshake``, ``no_data``, ``capture_dropped``, ``client_data``).
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


def _segments(payload: int, mss: int) -> int:
    return max(1, -(-payload // mss))


def infer(packets: Sequence[Packet], rcv_mss: Optional[int] = None, dropped: int = 0,
          min_rtt_us: Optional[int] = None) -> Inference:
    """The IW of the connection whose packets (both directions, in capture order) these are.

    ``rcv_mss`` and ``min_rtt_us``: the probe socket's ``TCP_INFO`` after the fetch (the
    sender's segment size as the kernel measured it, GRO included, and the connection's
    smallest RTT sample); ``dropped``: packets the capture's queue dropped."""
    syn = next((p for p in packets if p.outgoing and p.syn and not p.has_ack), None)
    syn_ack = next((p for p in packets if not p.outgoing and p.syn and p.has_ack), None)
    if syn is None or syn_ack is None:
        return Inference("undetermined", reason="no_handshake")
    result = Inference("undetermined", client_mss_option=syn.mss_option, server_mss_option=syn_ack.mss_option)
    server_isn = syn_ack.seq
    arrived = [p for p in packets if not p.outgoing]
    data = [p for p in arrived if p.payload > 0]
    if not data:
        result.reason = "no_data"
        return result
    single = [p.payload for p in data if rcv_mss is None or p.payload <= rcv_mss]
    mss = max([*single, *([rcv_mss] if rcv_mss else [])])
    result.mss = mss
    first = data[0]
    # Round trip: the probe's own samples (outgoing stamps are not trusted, see _capture).
    samples = [value * 1000 for value in (min_rtt_us,) if value]
    if syn.time_ns < syn_ack.time_ns:
        samples.append(syn_ack.time_ns - syn.time_ns)
    if not samples:
        result.reason = "no_rtt"
        return result
    rtt = max(1, min(samples))
    result.rtt_us = rtt // 1000
    # The probe acknowledges the first data at once (quick-ACK mode at a connection's start):
    # nothing it released can arrive before ``cutoff``.
    cutoff = first.time_ns + int(CUTOFF_RTT_FRACTION * rtt)
    window = [p for p in data if p.time_ns < cutoff]
    later = [p for p in data if p.time_ns >= cutoff]
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
    result.iw_segments = sum(_segments(p.payload, mss) for p in window)
    result.iw_bytes = sum(p.payload for p in window)
    last = window[-1]
    result.span_us = (last.time_ns - first.time_ns) // 1000
    result.status = "lower_bound"
    if not later and dropped:   # the queue keeps the earliest packets: the end may be missing
        result.status, result.reason = "undetermined", "capture_dropped"
        result.notes.append(f"the kernel dropped {dropped} captured packets before the window's end was seen")
        return result
    if not later or any(p.fin and p.time_ns < cutoff for p in arrived):
        result.reason = "object_ended"
        return result
    following = later[0]
    result.gap_us = (following.time_ns - last.time_ns) // 1000
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
        result.notes.append(f"the probe's receive window ({receive_window} bytes) limited the first flight; "
                            "a smaller announced MSS fits more segments in it")
        return result
    spacing = max((b.time_ns - a.time_ns for a, b in zip(window, window[1:])), default=0)
    if following.time_ns - last.time_ns < max(GAP_RTT_FRACTION * rtt, GAP_SPACING_FACTOR * spacing):
        result.reason = "bottleneck"
        result.notes.append("the window was still arriving when released data could; a slower bottleneck "
                            "than window / RTT")
        return result
    if following.time_ns > first.time_ns + PAUSE_RTT_FACTOR * rtt + PAUSE_SLACK_NS:
        result.reason = "paused"
        result.notes.append("the data after the window came later than ACKs could have released it")
        return result
    result.status = "ok"
    return result


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
