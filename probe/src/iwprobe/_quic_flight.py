"""The server's first flight over QUIC, counted from the datagrams one client saw.

QUIC encrypts everything a TCP inference reads (sequence numbers, ACKs), so the client counts
what it can see of any server: UDP datagrams, their sizes and arrival times, and its own sends.
Two ways, both standard library only (the datagram log comes from :mod:`iwprobe._quic`'s client
or from a capture):

* **acknowledging client** (a probe's timed fetch): the response's first flight is every server
  datagram that arrived after the client sent its request and before the server could have
  seen the client's first acknowledgement of the response: before ``t_ack + rtt``, where
  ``t_ack`` is the client's first send after the response began and ``rtt`` the path's round
  trip.  Where the caller does not know it (a TCP fetch over the same path does), ``rtt`` is
  :data:`REACTION_FRACTION` of the shorter of the handshake's round trip and the request's
  (request sent -> first response datagram): both include the server's processing (11 ms for
  aioquic's answer to a request on a busy 2-core box, 5 ms for its answer to an ACK), which
  would otherwise count the server's reaction to that ACK as part of the first flight.
* **withholding client** (the census; Rüth et al.'s method for TCP, "don't acknowledge"): a
  client that sends no ACK frame at all leaves the server with its congestion window and
  nothing else; the server sends that window and stops until its probe timeout.  The flight is
  every server datagram after the request up to the first silence of :data:`CENSUS_GAP_US`
  (a probe timeout without an RTT sample is at least 300 ms: RFC 9002's initial RTT of 333 ms,
  aioquic's and quic-go's 100 ms, plus four variances and the ACK delay).  Datagrams smaller
  than :data:`SMALL_DATAGRAM` (an ACK of the client's own HTTP/3 stream data, 33 bytes from
  aioquic) neither count nor bridge a silence: no window limits them.

A window counts bytes (RFC 9002 7.2: ``packets x max_datagram_size``), so the answer in packets
is read from the flight's bytes and the stack's datagram size (the most common size in the
flight: quic-go sends one larger datagram to probe the path MTU).  Stacks end a flight two ways:
aioquic sends only what fits (its last datagram is cut to the window's remainder), quic-go sends
while less than the window is in flight (its last datagram crosses it).  Either way the window
was crossed by the flight's last datagram and not before, so the window in packets is
``floor((bytes - last datagram) / datagram size) + 1``.  Datagrams under :data:`SMALL_DATAGRAM`
bytes (ACK-only) count neither way.  A flight that the object's end cut (the whole response
arrived inside the window) is only a lower bound.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Optional

#: One datagram: (microseconds since the connection's first send, "in" or "out", UDP payload bytes).
Datagram = tuple[int, str, int]

#: Silence that ends a census flight (µs): shorter than any probe timeout without an RTT sample.
CENSUS_GAP_US = 150_000
#: A datagram below this many bytes carries no stream data worth a window (ACK-only, PING).
SMALL_DATAGRAM = 64
#: Share of the client's round-trip estimate taken as the path's (see the module's docstring).
REACTION_FRACTION = 0.9


@dataclass(frozen=True)
class QuicFlight:
    """The first flight of one QUIC connection's response, as its client saw it."""

    status: str  # "ok", "lower_bound" or "undetermined"
    packets: Optional[int] = None
    bytes: int = 0
    datagrams: int = 0
    max_datagram_size: int = 0
    #: The client's view of the round trip the window was judged with (µs).
    rtt_us: Optional[int] = None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _handshake_rtt_us(log: Sequence[Datagram]) -> Optional[int]:
    first_out = next((t for t, way, _ in log if way == "out"), None)
    first_in = next((t for t, way, _ in log if way == "in"), None)
    if first_out is None or first_in is None or first_in < first_out:
        return None
    return first_in - first_out


def _flight(datagrams: list[Datagram], rtt_us: Optional[int], cut: bool, reason: str) -> QuicFlight:
    datagrams = [d for d in datagrams if d[2] >= SMALL_DATAGRAM]
    if not datagrams:
        return QuicFlight("undetermined", rtt_us=rtt_us, reason="no_response_datagram")
    total = sum(size for _, _, size in datagrams)
    sizes = Counter(size for _, _, size in datagrams)
    # the stack's datagram size: the most common, the largest of equally common ones
    size = max(sizes, key=lambda s: (sizes[s], s))
    packets = (total - datagrams[-1][2]) // size + 1
    return QuicFlight(
        "lower_bound" if cut else "ok",
        packets=packets,
        bytes=total,
        datagrams=len(datagrams),
        max_datagram_size=size,
        rtt_us=rtt_us,
        reason=reason if cut else "",
    )


def acknowledged_flight(
    log: Sequence[Datagram], request_us: int, response_done_us: Optional[int], path_rtt_us: Optional[int] = None
) -> QuicFlight:
    """The first flight from an acknowledging client's log.

    ``request_us``: when the datagram carrying the request left; ``response_done_us``: when the
    response's last byte arrived (None if it never did); ``path_rtt_us``: the path's round trip
    where known.
    """
    handshake = _handshake_rtt_us(log)
    response = [d for d in log if d[1] == "in" and d[0] >= request_us]
    if not response:
        return QuicFlight("undetermined", rtt_us=handshake, reason="no_response_datagram")
    first_in = response[0][0]
    request_rtt = first_in - request_us
    if path_rtt_us is not None:
        rtt = path_rtt_us
    else:
        rtt = int(REACTION_FRACTION * (request_rtt if handshake is None else min(handshake, request_rtt)))
    ack = next((t for t, way, _ in log if way == "out" and t > first_in), None)
    if ack is None:
        return _flight(response, rtt, cut=True, reason="object_ended")
    window_end = ack + rtt
    flight = [d for d in response if d[0] < window_end]
    cut = response_done_us is not None and response_done_us < window_end
    return _flight(flight, rtt, cut, "object_ended")


def withheld_flight(
    log: Sequence[Datagram], request_us: int, response_done_us: Optional[int], gap_us: int = CENSUS_GAP_US
) -> QuicFlight:
    """The first flight from a client that acknowledged nothing: datagrams after the request up
    to the first silence of ``gap_us``."""
    handshake = _handshake_rtt_us(log)
    response = [d for d in log if d[1] == "in" and d[0] >= request_us and d[2] >= SMALL_DATAGRAM]
    flight: list[Datagram] = []
    for datagram in response:
        if flight and datagram[0] - flight[-1][0] > gap_us:
            break
        flight.append(datagram)
    cut = response_done_us is not None and (not flight or response_done_us <= flight[-1][0])
    return _flight(flight, handshake, cut, "object_ended")


__all__ = [
    "CENSUS_GAP_US",
    "REACTION_FRACTION",
    "SMALL_DATAGRAM",
    "Datagram",
    "QuicFlight",
    "acknowledged_flight",
    "withheld_flight",
]
