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
capture saw); :meth:`Trace.first_flight` splits such packets by the sender's MSS the same way
:func:`iwprobe._iwinfer.infer` does (``rcv_mss`` from ``TCP_INFO``).  Outgoing packets' times
are their kernel stamps, which are not always departures (see :mod:`iwprobe._capture`), so a
SYN stamped late can make an early incoming packet's ``t_us`` negative.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ._capture import ACK, SYN, Packet
from ._iwinfer import first_flight as _first_flight

#: Bumped when a field changes meaning; :meth:`Trace.from_dict` refuses other versions.
TRACE_VERSION = 1
#: The per-packet columns, in the order :meth:`Trace.to_dict` writes them.
COLUMNS = ("t_us", "outgoing", "seq", "ack", "length", "flags", "window")
_OPTIONAL_INTS = ("client_mss", "server_mss", "client_wscale", "server_wscale", "rcv_mss", "min_rtt_us")
_WRAP = 2**32


@dataclass
class Trace:
    """One connection's packets in capture order, one list entry per packet in every column."""

    #: Microseconds since the probe's (first) SYN was stamped (the first packet's when no SYN).
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
        trace = cls(
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
        start_ns = syn.time_ns if syn is not None else packets[0].time_ns
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

    def to_packets(self) -> list[Packet]:
        """The trace as :class:`~iwprobe._capture.Packet`\\ s again (relative numbers, times
        from the SYN, window fields unscaled), e.g. for :func:`iwprobe._iwinfer.infer`."""
        packets: list[Packet] = []
        for index in range(len(self)):
            outgoing, flags = bool(self.outgoing[index]), self.flags[index]
            syn = bool(flags & SYN)
            scale = (self.client_wscale if outgoing else self.server_wscale) or 0
            packets.append(
                Packet(
                    time_ns=self.t_us[index] * 1000,
                    outgoing=outgoing,
                    seq=self.seq[index],
                    ack=self.ack[index],
                    flags=flags,
                    payload=self.length[index],
                    window=self.window[index] >> (scale if self.scaled and not syn else 0),
                    mss_option=(self.client_mss if outgoing else self.server_mss) if syn else None,
                    wscale_option=(self.client_wscale if outgoing else self.server_wscale) if syn else None,
                )
            )
        return packets

    def first_flight(self) -> Optional[tuple[int, int]]:
        """(segments, payload bytes) of the server's first flight as the probe received it:
        :func:`iwprobe._iwinfer.first_flight`, the data before the inference's cutoff, counted
        in the sender's segments; None when the trace lacks the handshake, data or an RTT."""
        flight = _first_flight(self.to_packets(), rcv_mss=self.rcv_mss, min_rtt_us=self.min_rtt_us)
        return None if flight is None else (flight.segments, flight.payload_bytes)

    def first_flight_summary(self) -> Optional[dict[str, int]]:
        """The first flight as a reader of the trace needs it without the inference: its
        segments and bytes, the RTT and MSS used, and ``cutoff_us`` -- the received data packets
        with ``t_us < cutoff_us`` are the flight (the inference's cutoff, rounded up to a whole
        microsecond, selects exactly the same packets).  None as :meth:`first_flight`."""
        flight = _first_flight(self.to_packets(), rcv_mss=self.rcv_mss, min_rtt_us=self.min_rtt_us)
        if flight is None:
            return None
        return {
            "segments": flight.segments,
            "bytes": flight.payload_bytes,
            "cutoff_us": -(-flight.cutoff_ns // 1000),
            "rtt_us": max(1, flight.rtt_ns // 1000),
            "mss": flight.mss,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe and columnar: ints, None and lists of ints only, plus the derived
        ``first_flight`` (:meth:`first_flight_summary`; :meth:`from_dict` ignores it), so a
        reader that draws the trace (the dashboard) need not redo the inference."""
        data: dict[str, Any] = {"version": self.version, "packets": len(self)}
        data.update((name, getattr(self, name)) for name in _OPTIONAL_INTS)
        data["dropped"] = self.dropped
        data["first_flight"] = self.first_flight_summary()
        data.update((name, list(getattr(self, name))) for name in COLUMNS)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trace:
        """The inverse of :meth:`to_dict`; ``ValueError`` for another version or a malformed trace."""
        version = data.get("version") if isinstance(data, dict) else None
        if version != TRACE_VERSION:
            raise ValueError(f"not a version {TRACE_VERSION} trace (version {version!r})")
        columns: dict[str, list[int]] = {}
        for name in COLUMNS:
            values = data.get(name)
            if not isinstance(values, list) or not all(_is_int(value) for value in values):
                raise ValueError(f"trace column {name!r} is not a list of integers")
            columns[name] = list(values)
        lengths = {len(values) for values in columns.values()}
        if len(lengths) != 1:
            raise ValueError(f"trace columns differ in length: {sorted(lengths)}")
        if "packets" in data and data["packets"] != lengths.pop():
            raise ValueError("trace 'packets' does not match its columns")
        extras: dict[str, Optional[int]] = {}
        for name in _OPTIONAL_INTS:
            value = data.get(name)
            if value is not None and not _is_int(value):
                raise ValueError(f"trace field {name!r} is not an integer")
            extras[name] = value
        dropped = data.get("dropped", 0)
        if not _is_int(dropped):
            raise ValueError("trace field 'dropped' is not an integer")
        return cls(
            t_us=columns["t_us"],
            outgoing=columns["outgoing"],
            seq=columns["seq"],
            ack=columns["ack"],
            length=columns["length"],
            flags=columns["flags"],
            window=columns["window"],
            client_mss=extras["client_mss"],
            server_mss=extras["server_mss"],
            client_wscale=extras["client_wscale"],
            server_wscale=extras["server_wscale"],
            rcv_mss=extras["rcv_mss"],
            min_rtt_us=extras["min_rtt_us"],
            dropped=dropped,
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _base(packets: Sequence[Packet], outgoing: bool, syn: Optional[Packet]) -> int:
    """The initial sequence number of one direction: its SYN's, else its first packet's - 1."""
    if syn is not None:
        return syn.seq
    first = next((p for p in packets if p.outgoing == outgoing), None)
    return 0 if first is None else (first.seq - 1) % _WRAP
