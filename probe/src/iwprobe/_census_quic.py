"""The QUIC half of ``iwprobe census``: the initial window of a server's HTTP/3.

A server offers HTTP/3 in its ``Alt-Svc`` header (RFC 7838: ``h3=":443"; ma=86400``); the census
then opens a few fresh QUIC connections to that port with a client that acknowledges nothing
(:func:`iwprobe._quic_flight.withheld_flight`) and counts the window each server flight filled.
Like the TCP census, the answer is what the connections agree on.  The window is reported in
packets of the server's largest datagram and in bytes: QUIC windows are bytes (RFC 9002 7.2),
and stacks differ in their datagram size (aioquic 1,200 bytes, quic-go 1,252).

Only this module's :func:`quic_census` needs the ``quic`` extra; parsing ``Alt-Svc`` does not.
"""

from __future__ import annotations

import re
import urllib.parse
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

#: ``h3="host:port"`` entries of an Alt-Svc value (the final version only, not drafts' h3-29).
_H3_ENTRY = re.compile(r'(?:^|,)\s*h3\s*=\s*"([^"]*)"')


def h3_port(alt_svc: str, host: str) -> Optional[int]:
    """The UDP port an ``Alt-Svc`` value offers HTTP/3 on, for the same host; None if none.

    An alternative on another host is not this server's window, so it is not followed.
    """
    for authority in _H3_ENTRY.findall(alt_svc):
        alt_host, _, port = authority.rpartition(":")
        alt_host = alt_host.strip("[]")
        if port.isdigit() and 0 < int(port) < 65536 and alt_host in ("", host):
            return int(port)
    return None


@dataclass
class QuicCensus:
    """The census of one server's HTTP/3 (the ``quic`` object of ``iwprobe census --json``)."""

    url: str
    status: str = "undetermined"  # "ok", "lower_bound", "undetermined"
    iw_packets: Optional[int] = None
    iw_bytes: Optional[int] = None
    max_datagram_size: Optional[int] = None
    connections: int = 0
    connections_ok: int = 0
    rtt_ms: Optional[float] = None
    http_status: Optional[int] = None
    reason: str = ""
    error: str = ""
    attempts: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def combine_quic(url: str, attempts: list[dict[str, Any]]) -> QuicCensus:
    """The answer from each connection's ``QuicFetch.to_dict()`` (see the module docstring)."""
    census = QuicCensus(url=url, connections=len(attempts), attempts=attempts)
    flights = [a["flight"] for a in attempts if a.get("flight")]
    errors = sorted({f"{a['error_kind']}: {a['error_detail']}" for a in attempts if a.get("error_kind")})
    census.error = "; ".join(errors)[:500]
    statuses = [a["http_status"] for a in attempts if a.get("http_status") is not None]
    census.http_status = statuses[-1] if statuses else None
    rtts = [f["rtt_us"] for f in flights if f.get("rtt_us")]
    census.rtt_ms = round(min(rtts) / 1000, 3) if rtts else None
    determined = [f for f in flights if f["status"] == "ok"]
    census.connections_ok = len(determined)
    bounds = [f for f in flights if f["status"] == "lower_bound"]
    best_bound = max(bounds, key=lambda f: f["packets"] or 0, default=None)
    if determined:
        values = Counter(f["packets"] for f in determined)
        agreed = determined[0]["packets"]
        if len(values) == 1 and (best_bound is None or (best_bound["packets"] or 0) <= agreed):
            census.status, census.iw_packets = "ok", agreed
            census.iw_bytes = max(f["bytes"] for f in determined)
            census.max_datagram_size = max(f["max_datagram_size"] for f in determined)
        else:
            census.reason = "inconsistent"
        return census
    if best_bound is not None:
        census.status, census.iw_packets, census.iw_bytes = "lower_bound", best_bound["packets"], best_bound["bytes"]
        census.max_datagram_size, census.reason = best_bound["max_datagram_size"], best_bound["reason"]
        return census
    census.reason = "fetch_failed" if errors else "no_data"
    return census


def quic_census(
    url: str,
    port: Optional[int] = None,
    connections: int = 3,
    ca_file: Optional[str] = None,
    insecure: bool = False,
    timeout_s: float = 10.0,
) -> QuicCensus:
    """Measure the initial window of the HTTP/3 server at ``url`` (on UDP ``port`` if given)."""
    from ._quic import fetch_h3, quic_available

    parts = urllib.parse.urlsplit(url)
    if port is not None:
        host = parts.hostname or ""
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        url = urllib.parse.urlunsplit(("https", netloc, parts.path or "/", parts.query, ""))
    available, why = quic_available()
    if not available:
        return QuicCensus(url=url, reason="no_quic_extra", error=why)
    attempts = [
        fetch_h3(url, ca_file=ca_file, insecure=insecure, withhold_acks=True, timeout_s=timeout_s).to_dict()
        for _ in range(connections)
    ]
    return combine_quic(url, attempts)


def format_quic_census(census: QuicCensus) -> str:
    if census.status == "ok":
        answer = f"IW {census.iw_packets} packets ({census.iw_bytes} bytes, datagrams of {census.max_datagram_size} bytes)"
    elif census.status == "lower_bound":
        answer = f"at least {census.iw_packets} packets ({census.reason})"
    else:
        answer = f"undetermined ({census.reason}{': ' + census.error if census.error else ''})"
    rtt = f", RTT {census.rtt_ms} ms" if census.rtt_ms is not None else ""
    return f"{census.url} over HTTP/3: {answer}; {census.connections_ok}/{census.connections} connections agree{rtt}"


__all__ = ["QuicCensus", "combine_quic", "format_quic_census", "h3_port", "quic_census"]
