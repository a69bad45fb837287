"""The wire records of HTTP/3: a probe's QUIC fetch as a :class:`wire.TrialRecord` and the QUIC
origin's report of a response as a :class:`wire.OriginObservation` (wire v9).

Standard library only: the records are built from what :mod:`iwprobe._quic` measured, so that
the agent and the origin can turn its results into wire records without importing aioquic.

A QUIC trial has no TCP connection: ``connect_us`` is ``None``, ``tcp_info`` empty and
``syn_retrans`` 0; ``tls_handshake_us`` is the QUIC handshake (first Initial sent -> handshake
complete, which is TLS 1.3's); ``client_iw`` is the first flight the client's own datagram log
shows (``segments`` = packets, ``mss`` = the datagram size).
"""

from __future__ import annotations

import ipaddress
from typing import Any, Optional

from . import wire
from ._measure import NO_ORIGIN_ID
from ._quic_flight import QuicFlight

#: :class:`iwprobe._quic.QuicFetch` ``error_kind`` -> the wire's (:data:`wire.ERROR_KINDS`).
_ERROR_KINDS = {"timeout": "timeout", "connect": "refused", "network": "other"}
#: Every QUIC connection negotiates TLS 1.3 (RFC 9001).
QUIC_TLS_VERSION = "TLSv1.3"


def address_family(address: str) -> str:
    """``ipv4``/``ipv6`` of a literal address (an IPv4-mapped IPv6 one is ``ipv4``); empty when
    ``address`` is a name."""
    try:
        parsed = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return ""
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is None:
        return "ipv6"
    return "ipv4"


def client_iw(flight: Optional[QuicFlight]) -> Optional[wire.ClientIw]:
    """The first flight as the wire's :class:`wire.ClientIw` (packets counted as segments)."""
    if flight is None:
        return None
    return wire.ClientIw(
        status=flight.status,
        segments=flight.packets,
        bytes=flight.bytes if flight.packets is not None else None,
        mss=flight.max_datagram_size or None,
        reason=flight.reason[: wire.MAX_IW_REASON_CHARS],
    )


def quic_trial(
    fetched: Any,
    *,
    trial_id: str,
    probe_id: str,
    campaign_id: Optional[int],
    origin_id: Optional[str],
    round_number: int,
    arm_iw: int,
    arm: str,
    object_size: int,
    host: str,
) -> wire.TrialRecord:
    """A :class:`iwprobe._quic.QuicFetch` (``fetched``) as a trial of the QUIC arm ``arm``.  A
    fetch that ended without an error yet with the wrong status or too few bytes is an
    ``http_status`` or ``short_body`` failure, as over TCP."""
    error_kind = _ERROR_KINDS.get(fetched.error_kind, "other") if fetched.error_kind else None
    detail = fetched.error_detail or None
    if error_kind is None and fetched.http_status != 200:
        error_kind, detail = "http_status", f"HTTP/3 status {fetched.http_status}"
    elif error_kind is None and fetched.body_bytes < object_size:
        error_kind, detail = "short_body", f"{fetched.body_bytes} of {object_size} bytes"
    return wire.TrialRecord(
        trial_id=trial_id,
        probe_id=probe_id,
        campaign_id=campaign_id,
        origin_id=origin_id,
        round=round_number,
        arm_iw=arm_iw,
        object_size=object_size,
        url=fetched.url,
        started_at=fetched.started_at,
        dns_us=0 if address_family(host) else None,
        connect_us=None,
        ttfb_us=fetched.ttfb_us,
        total_us=fetched.total_us if error_kind is None else None,
        bytes_received=fetched.body_bytes,
        http_status=fetched.http_status,
        error_kind=error_kind,
        error_detail=detail[:500] if detail else None,
        syn_retrans=0,
        tcp_info={},
        arm=arm,
        tls_version=QUIC_TLS_VERSION if fetched.handshake_us is not None else "",
        tls_handshake_us=fetched.handshake_us,
        family=address_family(host),
        client_iw=client_iw(fetched.flight),
        protocol="quic",
    )


def quic_observation(report: dict[str, Any], origin_id: str) -> Optional[wire.OriginObservation]:
    """The QUIC origin's report of one response (:class:`iwprobe._quic_origin.QuicOrigin`) as an
    observation of its trial; ``None`` when the request named no trial (nothing to join)."""
    trial_id = report.get("trial_id")
    if not trial_id:
        return None
    status = int(report["http_status"])
    latency_us = report.get("response_us")
    error_kind = None if status == 200 else "http_status"
    if status == 200 and latency_us is None:
        error_kind = "timeout"
    datagram = int(report.get("max_datagram_size") or wire.QUIC_MIN_DATAGRAM_BYTES)
    start_bytes = int(report.get("cwnd_at_start_bytes") or 0)
    return wire.OriginObservation(
        trial_id=str(trial_id),
        origin_id=origin_id or NO_ORIGIN_ID,
        arm_iw=int(report["arm_iw"]),
        arm=f"{report['arm']}q",
        port=int(report["port"]),
        client_addr=str(report.get("client_addr", ""))[:64],
        object_size=int(report["object_bytes"]) if status == 200 else 0,
        request_at=str(report["request_at"]),
        first_byte_us=int(report.get("first_byte_us") or 0),
        response_latency_us=latency_us,
        # the window in packets the connection started with (TCP: snd_cwnd after accept); the
        # handshake may grow it before the response (a chain that fills it), as TCP's TLS flight does
        snd_cwnd_at_accept=start_bytes // datagram,
        cwnd_mismatch=bool(start_bytes) and start_bytes // datagram != int(report["arm_iw"]),
        rwnd_limited=False,
        peer_rwnd=None,
        http_status=status,
        error_kind=error_kind,
        tcp_info={},
        tls_version=QUIC_TLS_VERSION if report.get("handshake_us") is not None else "",
        tls_handshake_us=report.get("handshake_us"),
        family=address_family(str(report.get("client_addr", ""))),
        protocol="quic",
        quic_first_flight_packets=report.get("first_flight_packets"),
        quic_first_flight_bytes=report.get("first_flight_bytes"),
        quic_max_datagram_size=datagram,
        quic_lost_packets=report.get("lost_packets"),
        quic_zero_rtt=bool(report.get("zero_rtt", False)),
    )


__all__ = ["QUIC_TLS_VERSION", "address_family", "client_iw", "quic_observation", "quic_trial"]
