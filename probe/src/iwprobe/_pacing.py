"""How the origin writes a response: at once (:func:`send_all`) or, for a paced arm, with the
first window sent evenly over one RTT (:func:`send_paced`, "initial spreading").

Measured on this kernel (see docs/cost.md): ``SO_MAX_PACING_RATE`` turns on TCP's internal
pacing without the fq qdisc, but the first 10 data segments of a connection leave at line
rate whatever the rate.  So the origin spreads the first window itself: the response (head
and body) is cut into MSS-sized pieces, and piece ``k`` of the first ``iw`` is written at
``t0 + k * RTT / iw`` with ``TCP_NODELAY`` (one write, one segment).  The RTT is the one the
handshake measured (``tcpi_rtt`` at accept).  Everything after the first window is written
at once and paced by the kernel (``SO_MAX_PACING_RATE`` set to a value that never limits,
which enables internal pacing at the kernel's own rate: twice cwnd / srtt in slow start).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time

#: ``SO_MAX_PACING_RATE`` (asm-generic/socket.h).
SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)
#: A rate (bytes/s) that never limits but, unlike ~0U, switches internal pacing on.
UNLIMITED_PACING_RATE = 0xFFFFFFFE
#: Below this spacing the spread is not worth a sleeping thread: send at once.
MIN_INTERVAL_S = 0.0002


def first_window_pieces(header: bytes, body: memoryview | bytes, iw: int, mss: int) -> list[memoryview]:
    """The first ``iw`` MSS-sized pieces of head + body (fewer for a short response)."""
    data = memoryview(bytes(header) + bytes(body[: max(0, iw * mss - len(header))]))
    return [data[offset : offset + mss] for offset in range(0, len(data), mss)]


def send_all(sock: socket.socket, header: bytes, body: memoryview | bytes) -> None:
    """Header and body in one ``sendmsg`` (more calls only if the kernel takes part of it)."""
    buffers: list[memoryview] = [memoryview(header), memoryview(body)]
    while buffers:
        sent = sock.sendmsg(buffers)
        while sent and buffers:
            if sent >= len(buffers[0]):
                sent -= len(buffers[0])
                buffers.pop(0)
            else:
                buffers[0] = buffers[0][sent:]
                sent = 0
        buffers = [b for b in buffers if len(b)]


def send_paced(sock: socket.socket, header: bytes, body: memoryview | bytes, iw: int, rtt_us: int, mss: int) -> float:
    """Send head + body with the first window spread over ``rtt_us``; the spacing used (s)."""
    with contextlib.suppress(OSError):  # without internal pacing only the first window is spread
        sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, struct.pack("=I", UNLIMITED_PACING_RATE))
    interval = (rtt_us / 1e6) / iw if iw > 0 and rtt_us > 0 else 0.0
    if interval < MIN_INTERVAL_S or mss <= 0:
        send_all(sock, header, body)
        return 0.0
    pieces = first_window_pieces(header, body, iw, mss)
    start = time.monotonic()
    for index, piece in enumerate(pieces):
        delay = start + index * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        sock.sendall(piece)
    sent_body = max(0, iw * mss - len(header))
    if sent_body < len(body):
        sock.sendall(body[sent_body:])
    return interval


__all__ = ["send_all", "send_paced", "first_window_pieces", "SO_MAX_PACING_RATE", "UNLIMITED_PACING_RATE"]
