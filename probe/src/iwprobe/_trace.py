"""One trial's packets as a compact, columnar trace (``iwprobe fetch --trace FILE``).

The capture the IW inference opens anyway (:class:`iwprobe._capture.ConnectionCapture`) holds
every packet of the trial's connection, headers only; a :class:`Trace` keeps what a person
needs to see the trial -- when each packet crossed the probe's device, which way, its
sequence and acknowledgement numbers, payload size, flags and window -- and nothing else, so
it can be stored per trial and drawn later (a time-sequence plot).

Why columns of small integers: a 100 KB trial is ~100-150 packets, and parallel lists of ints
in JSON cost ~30-40 bytes per packet (about 4-5 KB per such trial, measured by the tests),
against ~150 for a list of per-packet objects with repeated keys.  Numbers are made small and
readable the way tcpdump/Wireshark do: sequence numbers relative to the sender's initial
sequence number (the first payload byte is 1), times in microseconds since the probe's SYN,
windows scaled to bytes.

What the trace is *not*: the wire.  Incoming packets are seen after the probe's GRO, which may
merge back-to-back segments into one packet: ``length`` is then the merged payload (what the
capture saw); :attr:`Trace.first_flight` is the inference's own split, made once on the
captured packets (ns stamps; the columns keep microseconds), GRO-merged packets counted in the
sender's segments (``rcv_mss`` from ``TCP_INFO``).  Outgoing packets' times
are their kernel stamps, which are not always departures (see :mod:`iwprobe._capture`): a SYN
stamped after its SYN-ACK arrived (seen in lab runs, by up to a whole trial) is not taken
as time zero -- the SYN-ACK's arrival less one RTT is -- and other outgoing packets keep their
stamps as they are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from ._capture import ACK, SYN, Packet
from ._iwinfer import first_flight as _first_flight
from ._wire_trace import TRACE_COLUMNS, TRACE_OPTIONAL_INTS, TRACE_VERSION, check_trace

if TYPE_CHECKING:
    from ._fetch import FetchResult

_WRAP = 2**32


@dataclass
class Trace:
    """One connection's packets in capture order, one list entry per packet in every column."""

    #: Microseconds since the probe's (first) SYN was stamped (the first packet's when no SYN;
    #: the SYN-ACK's arrival less ``min_rtt_us`` when the SYN's stamp is after it).
    t_us: list[int] = field(default_factory=list)
    #: 1: sent by the probe (client -> server); 0: received.
    outgoing: list[int] = field(default_factory=list)
    #: Relative to the sender's initial sequence number: the SYN is 0, the first payload byte 1.
    seq: list[int] = field(default_factory=list)
    #: Relative to the other direction's initial sequence number; 0 without the ACK flag.
    ack: list[int] = field(default_factory=list)
    #: TCP payload bytes as captured (a GRO-merged incoming packet: all of its segments').
    length: list[int] = field(default_factory=list)
    #: The TCP flag byte (FIN 0x01, SYN 0x02, RST 0x04, PSH 0x08, ACK 0x10, ...).
    flags: list[int] = field(default_factory=list)
    #: The advertised window in bytes: the field shifted by its sender's window scale when both
    #: SYNs carried the option (RFC 7323; never in a SYN itself), else the field as sent.
    window: list[int] = field(default_factory=list)
    #: The MSS and window-scale options of the probe's SYN and the server's SYN-ACK.
    client_mss: Optional[int] = None
    server_mss: Optional[int] = None
    client_wscale: Optional[int] = None
    server_wscale: Optional[int] = None
    #: The probe's ``TCP_INFO`` after the fetch: the sender's segment size as the kernel measured
    #: it (splits GRO-merged packets) and the smallest RTT sample; what the inference was given.
    rcv_mss: Optional[int] = None
    min_rtt_us: Optional[int] = None
    #: Packets the capture's kernel queue dropped: >0 means the trace has gaps.
    dropped: int = 0
    #: The server's first flight as the IW inference splits it (:func:`iwprobe._iwinfer.first_flight`),
    #: made once on the captured packets at full precision: ``packets`` (how many of the first
    #: received data packets it covers), ``segments`` (in the sender's MSS), ``bytes``,
    #: ``rtt_us``, ``mss``; None without a handshake, data or an RTT.
    first_flight: Optional[dict[str, int]] = None
    version: int = TRACE_VERSION

    def __len__(self) -> int:
        return len(self.t_us)

    @property
    def scaled(self) -> bool:
        """Window scaling is in effect: both sides sent the option (RFC 7323 section 2.2)."""
        return self.client_wscale is not None and self.server_wscale is not None

    @classmethod
    def from_packets(
        cls,
        packets: Sequence[Packet],
        rcv_mss: Optional[int] = None,
        min_rtt_us: Optional[int] = None,
        dropped: int = 0,
    ) -> Trace:
        """The trace of a :class:`~iwprobe._capture.ConnectionCapture`'s packets (both
        directions, capture order).  A direction whose SYN was not captured (a capture that
        dropped it) is numbered from its first packet's sequence number - 1."""
        syn = next((p for p in packets if p.outgoing and p.flags & SYN and not p.flags & ACK), None)
        syn_ack = next((p for p in packets if not p.outgoing and p.flags & SYN and p.flags & ACK), None)
        isn = {True: _base(packets, True, syn), False: _base(packets, False, syn_ack)}
        flight = _first_flight(packets, rcv_mss=rcv_mss, min_rtt_us=min_rtt_us)
        start_ns = _start_ns(packets, syn, syn_ack, min_rtt_us)
        trace = cls(
            first_flight=None
            if flight is None
            else {
                "packets": len(flight.window),
                "segments": flight.segments,
                "bytes": flight.payload_bytes,
                "rtt_us": max(1, flight.rtt_ns // 1000),
                "mss": flight.mss,
                "cutoff_us": (flight.cutoff_ns - start_ns) // 1000,
            },
            client_mss=None if syn is None else syn.mss_option,
            server_mss=None if syn_ack is None else syn_ack.mss_option,
            client_wscale=None if syn is None else syn.wscale_option,
            server_wscale=None if syn_ack is None else syn_ack.wscale_option,
            rcv_mss=rcv_mss,
            min_rtt_us=min_rtt_us,
            dropped=dropped,
        )
        if not packets:
            return trace
        shift = {True: trace.client_wscale or 0, False: trace.server_wscale or 0}
        for packet in packets:
            direction = packet.outgoing
            trace.t_us.append((packet.time_ns - start_ns) // 1000)
            trace.outgoing.append(int(direction))
            trace.seq.append((packet.seq - isn[direction]) % _WRAP)
            trace.ack.append((packet.ack - isn[not direction]) % _WRAP if packet.flags & ACK else 0)
            trace.length.append(packet.payload)
            trace.flags.append(packet.flags)
            scale = shift[direction] if trace.scaled and not packet.flags & SYN else 0
            trace.window.append(packet.window << scale)
        return trace

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe and columnar (:mod:`iwprobe._wire_trace`): ints, None and lists of ints, and
        the ``first_flight`` made at capture, so a reader (the dashboard) need not redo the
        inference -- nor could it exactly: the columns keep microseconds, the split used ns."""
        data: dict[str, Any] = {"version": self.version, "packets": len(self)}
        data.update((name, getattr(self, name)) for name in TRACE_OPTIONAL_INTS)
        data["dropped"] = self.dropped
        data["first_flight"] = None if self.first_flight is None else dict(self.first_flight)
        data.update((name, list(getattr(self, name))) for name in TRACE_COLUMNS)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trace:
        """The inverse of :meth:`to_dict`; ``ValueError`` as :func:`iwprobe._wire_trace.check_trace`."""
        check_trace(data)
        flight = data.get("first_flight")
        return cls(
            t_us=list(data["t_us"]),
            outgoing=list(data["outgoing"]),
            seq=list(data["seq"]),
            ack=list(data["ack"]),
            length=list(data["length"]),
            flags=list(data["flags"]),
            window=list(data["window"]),
            client_mss=data.get("client_mss"),
            server_mss=data.get("server_mss"),
            client_wscale=data.get("client_wscale"),
            server_wscale=data.get("server_wscale"),
            rcv_mss=data.get("rcv_mss"),
            min_rtt_us=data.get("min_rtt_us"),
            dropped=data.get("dropped", 0),
            first_flight=None if flight is None else dict(flight),
        )


def trace_of(result: FetchResult) -> Trace:
    """The trace of a fetch made with its capture (``infer_iw``): its packets, the ``TCP_INFO``
    values the inference was given, the capture's drops."""
    return Trace.from_packets(
        result.packets,
        rcv_mss=result.tcp_info.get("rcv_mss"),
        min_rtt_us=result.tcp_info.get("min_rtt"),
        dropped=result.capture_dropped,
    )


def traced_round(probe_id: str, campaign_id: int, round_number: int, share: float) -> bool:
    """Whether a campaign round is traced (``CampaignSchedule.trace_share``): a hash of the
    probe, the campaign and the round, not a random draw, so a probe that restarts mid-round
    traces the same rounds, and every trial of a traced round -- the twins a plot overlays --
    is traced together."""
    if share <= 0.0:
        return False
    if share >= 1.0:
        return True
    digest = hashlib.sha256(f"{probe_id}:{campaign_id}:{round_number}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def _start_ns(packets: Sequence[Packet], syn: Optional[Packet], syn_ack: Optional[Packet], min_rtt_us: Optional[int]) -> int:
    """The trace's time zero: the SYN's stamp -- unless it is after the SYN-ACK's arrival, which
    no departure can be (an outgoing stamp is TCP's earliest departure time, now and then far
    from the departure, see :mod:`iwprobe._capture`): then the SYN-ACK's arrival, which is
    stamped at the device, less one smallest RTT."""
    if syn is None:
        return packets[0].time_ns if packets else 0
    if syn_ack is not None and syn.time_ns > syn_ack.time_ns:
        return syn_ack.time_ns - (min_rtt_us or 0) * 1000
    return syn.time_ns


def _base(packets: Sequence[Packet], outgoing: bool, syn: Optional[Packet]) -> int:
    """The initial sequence number of one direction: its SYN's, else its first packet's - 1."""
    if syn is not None:
        return syn.seq
    first = next((p for p in packets if p.outgoing == outgoing), None)
    return 0 if first is None else (first.seq - 1) % _WRAP
