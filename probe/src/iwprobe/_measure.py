"""What the origin measures per connection, and the :class:`wire.OriginObservation` it reports.

The IW10 paper's server-side latency: from the moment the request is completely read until
the last response byte is acknowledged, found by polling ``TCP_INFO`` every
``poll_interval_s`` until ``unacked == 0`` and ``notsent_bytes == 0`` (:func:`wait_acked`).
The observation also keeps the time ``send`` returned (first byte written), ``snd_cwnd``
right after ``accept`` (compared with the window the arm's policy intended: a mismatch is
flagged), and ``TCP_INFO`` at the end.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Optional

from . import wire
from ._arms import Arm
from ._tcpinfo import read_tcp_info
from ._tls import Handshake

#: ``origin_id`` of the observations of an origin that has none (not enrolled, ``--no-upload``).
NO_ORIGIN_ID = "00000000-0000-0000-0000-000000000000"


@dataclass
class Connection:
    """One accepted connection: what ``accept`` measured, then how its request head was routed."""

    sock: socket.socket
    client_addr: str
    arm: Arm
    port: int
    snd_cwnd_at_accept: int
    #: The initial window the arm's policy meant this connection to start with.
    intended_iw: int
    #: The RTT the handshake measured (µs), for spreading a paced arm's first window.
    handshake_rtt_us: int
    mss: int
    accepted_ns: int
    #: Set by the accept thread once the request head is read and routed.
    status: int = 0
    size: int = 0
    trial_id: Optional[str] = None
    reason: str = ""
    request_ns: int = 0
    request_at: str = ""
    #: ``"ipv4"`` or ``"ipv6"`` (an IPv4-mapped client of an IPv6 listener is ``"ipv4"``).
    family: str = "ipv4"
    #: Whether the accept thread's budget check said to answer 429 (HTTPS: after the handshake).
    rate_limited: bool = False
    #: HTTPS: the ClientHello the accept thread read, and when its last byte arrived (monotonic).
    client_hello: Optional[bytes] = None
    hello_ns: int = 0
    #: HTTPS: the handshake's measurements (:class:`iwprobe._tls.Handshake`).
    tls: Optional[Handshake] = None
    #: The client's port (the origin's trace capture keys on it).
    client_port: int = 0
    #: Whether the request asked for the origin's trace (``wire.TRACE_HEADER``).
    trace: bool = False
    #: How the response was written and the device's offload (wire v8; set when it was sent).
    send_path: str = ""
    segmentation_offload: str = ""


def wait_acked(
    sock: socket.socket, request_ns: int, ack_timeout_s: float, poll_interval_s: float, stop: threading.Event
) -> tuple[Optional[int], dict[str, int]]:
    """Poll TCP_INFO until everything sent is acknowledged; (latency µs or None, tcp_info).

    None when reading ``TCP_INFO`` fails, when ``ack_timeout_s`` has passed since the request
    (``request_ns``, monotonic) or when ``stop`` is set."""
    deadline_ns = request_ns + int(ack_timeout_s * 1e9)
    info: dict[str, int] = {}
    while True:
        try:
            info = read_tcp_info(sock)
        except OSError:
            return None, info
        now_ns = time.monotonic_ns()
        if info.get("unacked", 0) == 0 and info.get("notsent_bytes", 0) == 0:
            return (now_ns - request_ns) // 1000, info
        if now_ns >= deadline_ns or stop.is_set():
            return None, info
        time.sleep(poll_interval_s)


def build_observation(
    conn: Connection, trial_id: str, origin_id: str, first_byte_us: int, latency_us: Optional[int], info: dict[str, int]
) -> wire.OriginObservation:
    """The observation of one served trial: ``conn`` as routed, the measured times and the final
    ``TCP_INFO`` (``info``).  An error status is ``http_status``; a 200 whose last byte was never
    acknowledged (``latency_us`` None) is a ``timeout``."""
    status = conn.status
    record = wire.OriginObservation(
        trial_id=trial_id,
        origin_id=origin_id or NO_ORIGIN_ID,
        arm_iw=conn.intended_iw,
        arm=conn.arm.label,
        port=conn.port,
        client_addr=conn.client_addr[:64],
        object_size=conn.size if status == 200 else 0,
        request_at=conn.request_at,
        first_byte_us=first_byte_us,
        response_latency_us=latency_us,
        snd_cwnd_at_accept=conn.snd_cwnd_at_accept,
        cwnd_mismatch=conn.snd_cwnd_at_accept != conn.intended_iw,
        rwnd_limited=info.get("rwnd_limited", 0) > 0,
        peer_rwnd=info.get("snd_wnd"),
        http_status=status,
        error_kind=None if status == 200 else "http_status",
        tcp_info=info,
        family=conn.family,
        send_path=conn.send_path,
        segmentation_offload=conn.segmentation_offload,
    )
    if conn.tls is not None:
        record.tls_version = conn.tls.version
        record.tls_handshake_us = conn.tls.handshake_us
        record.tls_first_flight_bytes = conn.tls.first_flight_bytes
        record.tls_flight_acked_us = conn.tls.flight_acked_us
    if latency_us is None and status == 200:
        record.error_kind = "timeout"
    return record
