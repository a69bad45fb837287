"""The interactive flow: small UDP packets at a fixed rate, echoed by the origin.

A latency-sensitive competitor (a voice call, a game) sharing the bottleneck with a round's
short flows.  The probe sends a packet of ``packet_bytes`` every ``interval_us`` to the origin's
echo port and times each echo; the queueing delay the short flows add shows up as round-trip
time above the flow's minimum, their losses as missing echoes (wire: :class:`wire.EchoStats`).

Packet: :data:`wire.ECHO_MAGIC`, sequence number (u32), the sender's monotonic send time (u64
nanoseconds), zero padding.  The origin echoes a packet unchanged if it starts with the magic
and its size is within the wire's bounds, at most :data:`ECHO_MAX_PPS_PER_CLIENT` packets per
second per client address: an echo is never larger than its request, so the service cannot
amplify, and the rate limit keeps it from being a useful reflector.
"""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading
import time
from typing import Optional

from . import wire
from ._caps import CAP_NET_ADMIN, drop_capability

log = logging.getLogger("iwprobe.echo")

_HEADER = struct.Struct("!4sIQ")
#: Echoes per second one client address gets (a packet every 1 ms); more are dropped.
ECHO_MAX_PPS_PER_CLIENT = 1000
#: An echo arriving later than this after its packet was sent counts as lost.
ECHO_TIMEOUT_S = 1.0


class EchoServer:
    """The origin's UDP echo service on ``(bind, port)`` (one thread)."""

    def __init__(self, bind: str, port: int, max_pps_per_client: int = ECHO_MAX_PPS_PER_CLIENT) -> None:
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.bind((bind, port))
        self.port = self.sock.getsockname()[1]
        self.max_pps = max_pps_per_client
        self.echoed = 0
        self.refused = 0
        self._budgets: dict[str, tuple[float, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="origin-echo", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()

    def _allowed(self, client: str, now: float) -> bool:
        tokens, then = self._budgets.get(client, (float(self.max_pps), now))
        tokens = min(float(self.max_pps), tokens + (now - then) * self.max_pps)
        if tokens < 1:
            self._budgets[client] = (tokens, now)
            return False
        self._budgets[client] = (tokens - 1, now)
        if len(self._budgets) > 10_000:  # forget idle clients
            self._budgets = {key: value for key, value in self._budgets.items() if now - value[1] < 10}
        return True

    def _loop(self) -> None:
        drop_capability(CAP_NET_ADMIN)  # capabilities are per thread; echoing needs none
        while not self._stop.is_set():
            ready, _, _ = select.select([self.sock], [], [], 0.2)
            if not ready:
                continue
            try:
                data, peer = self.sock.recvfrom(wire.MAX_ECHO_PACKET_BYTES + 1)
            except OSError:
                continue
            if (
                not wire.MIN_ECHO_PACKET_BYTES <= len(data) <= wire.MAX_ECHO_PACKET_BYTES
                or not data.startswith(wire.ECHO_MAGIC)
                or not self._allowed(peer[0], time.monotonic())
            ):
                self.refused += 1
                continue
            try:
                self.sock.sendto(data, peer)
                self.echoed += 1
            except OSError as error:
                log.debug("echo to %s failed: %s", peer, error)


class EchoFlow:
    """The probe's side: :meth:`start` sends until :meth:`finish`, which returns the statistics."""

    def __init__(self, host: str, port: int, interval_us: int, packet_bytes: int = 160) -> None:
        if not wire.MIN_ECHO_PACKET_BYTES <= packet_bytes <= wire.MAX_ECHO_PACKET_BYTES:
            raise ValueError(f"packet_bytes must be in [{wire.MIN_ECHO_PACKET_BYTES}, {wire.MAX_ECHO_PACKET_BYTES}]")
        if interval_us < 1000:
            raise ValueError("interval_us must be at least 1000")
        address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        self.sock = socket.socket(address[0], socket.SOCK_DGRAM)
        self.sock.connect(address[4])
        self.interval_us = interval_us
        self.packet_bytes = packet_bytes
        self.started_at = ""
        self._sent_ns: list[int] = []
        self._rtt_ns: dict[int, int] = {}
        self._stop = threading.Event()
        self._sender = threading.Thread(target=self._send_loop, name="iwprobe-echo-send", daemon=True)
        self._receiver = threading.Thread(target=self._receive_loop, name="iwprobe-echo-receive", daemon=True)
        self._sending_done = threading.Event()
        self._start_ns = 0
        self._end_ns = 0

    def start(self) -> None:
        self.started_at = wire.utc_timestamp()
        self._start_ns = time.monotonic_ns()
        self._receiver.start()
        self._sender.start()

    def _send_loop(self) -> None:
        padding = b"\0" * (self.packet_bytes - _HEADER.size)
        next_ns = time.monotonic_ns()
        sequence = 0
        while not self._stop.is_set():
            now = time.monotonic_ns()
            if now < next_ns:
                self._stop.wait((next_ns - now) / 1e9)
                continue
            self._sent_ns.append(now)
            try:
                self.sock.send(_HEADER.pack(wire.ECHO_MAGIC, sequence, now) + padding)
            except OSError as error:  # e.g. ICMP port unreachable reported on a connected socket
                log.debug("echo packet %d not sent: %s", sequence, error)
            sequence += 1
            # On a fixed grid (no drift); slots missed while this thread was not scheduled are
            # skipped, not sent late in a burst (a voice or game sender does not catch up either).
            interval_ns = self.interval_us * 1000
            next_ns += interval_ns * max(1, (now - next_ns) // interval_ns + 1)
        self._sending_done.set()

    def _receive_loop(self) -> None:
        deadline: Optional[float] = None
        while True:
            if self._sending_done.is_set() and deadline is None:
                deadline = time.monotonic() + ECHO_TIMEOUT_S
            if deadline is not None and (time.monotonic() >= deadline or len(self._rtt_ns) >= len(self._sent_ns)):
                return
            ready, _, _ = select.select([self.sock], [], [], 0.05)
            if not ready:
                continue
            try:
                data = self.sock.recv(wire.MAX_ECHO_PACKET_BYTES + 1)
            except OSError:
                continue
            now = time.monotonic_ns()
            if len(data) < _HEADER.size:
                continue
            magic, sequence, sent_ns = _HEADER.unpack_from(data)
            if (
                magic == wire.ECHO_MAGIC
                and sequence < len(self._sent_ns)
                and self._sent_ns[sequence] == sent_ns
                and now - sent_ns <= ECHO_TIMEOUT_S * 1e9
            ):
                self._rtt_ns.setdefault(sequence, now - sent_ns)

    def finish(self) -> tuple[wire.EchoStats, int]:
        """Stop sending, wait for the last echoes (at most :data:`ECHO_TIMEOUT_S`); the statistics
        and the flow's duration in microseconds."""
        self._stop.set()
        self._sender.join()
        self._end_ns = time.monotonic_ns()
        self._receiver.join()
        self.sock.close()
        sent = min(len(self._sent_ns), wire.MAX_ECHO_SAMPLES)
        rtts: list[Optional[int]] = [
            self._rtt_ns[sequence] // 1000 if sequence in self._rtt_ns else None for sequence in range(sent)
        ]
        stats = wire.EchoStats(
            packet_bytes=self.packet_bytes,
            interval_us=self.interval_us,
            sent=sent,
            received=sum(rtt is not None for rtt in rtts),
            rtt_us=rtts,
        )
        return stats, (self._end_ns - self._start_ns) // 1000


__all__ = ["EchoServer", "EchoFlow", "ECHO_MAX_PPS_PER_CLIENT", "ECHO_TIMEOUT_S"]
