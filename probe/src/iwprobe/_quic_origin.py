"""The origin's HTTP/3 (``iwprobe origin --quic``): its arms' windows and its listeners, on
aioquic (the optional ``iwprobe[quic]`` extra; :mod:`iwprobe._quic` holds what the probe shares).

**The initial window of an arm.**  aioquic takes its congestion controller by name from a
registry; :func:`register_arm` registers ``iwscope-iw<N>``, New Reno starting from
``N x max_datagram_size`` bytes (RFC 9002 7.2 counts the window in bytes).  aioquic's own New
Reno grows the window by every acknowledged byte in slow start, the handshake's included, so
its response flight would be the IW plus the certificate chain's packets.  RFC 9002 7.8 says a
sender whose window was not the limit must not grow it (quiche, quic-go and Linux's TCP do
not); :class:`ArmWindow` grows only while the window was at least half used at its peak, as
Linux's ``tcp_is_cwnd_limited`` decides in slow start.  The handshake flight, held to three
times the client's bytes by the amplification limit, leaves IW 10 and above where they were.

**Pacing.**  aioquic paces once it has an RTT sample: a burst of up to a quarter of the window
(at most 16 datagrams), then ``window / srtt``.  The first flight of 32 datagrams still leaves
within three quarters of a round trip, before the first ACK can return; plain QUIC arms are
therefore paced by the stack, unlike plain TCP arms (docs/quic.md).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union, cast

from . import wire
from ._arms import Arm
from ._budgets import ClientBudgets
from ._http import object_pattern, route_request
from ._quic import _IMPORT_ERROR, ARM_ALGORITHM, MAX_DATAGRAM_SIZE, _require

if not _IMPORT_ERROR:
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.asyncio.server import QuicServer, serve
    from aioquic.h3.connection import H3_ALPN, H3Connection
    from aioquic.h3.events import H3Event, HeadersReceived
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.congestion.base import register_congestion_control
    from aioquic.quic.congestion.reno import RenoCongestionControl
    from aioquic.quic.events import ConnectionTerminated, HandshakeCompleted, QuicEvent
    from aioquic.quic.recovery import QuicPacketPacer


# --- the arm's window --------------------------------------------------------------------------


@dataclass
class ServerFlight:
    """What the origin's congestion controller saw of one response (its own account):
    ``start_cwnd_bytes`` the window the connection started with, ``cwnd_bytes`` the window when
    the response began (a certificate chain that filled the window grew it in the handshake)."""

    start_cwnd_bytes: int = 0
    cwnd_bytes: int = 0
    bytes: int = 0
    packets: int = 0
    lost_packets: int = 0
    closed: bool = False


if not _IMPORT_ERROR:

    class ArmWindow(RenoCongestionControl):
        """New Reno from ``iw`` packets that grows only when the window was the limit (7.8)."""

        def __init__(self, iw: int, *, max_datagram_size: int) -> None:
            super().__init__(max_datagram_size=max_datagram_size)
            self.congestion_window = iw * max_datagram_size
            self.peak_in_flight = 0
            self.response_at: Optional[float] = None
            self.flight = ServerFlight(start_cwnd_bytes=self.congestion_window)

        def mark_response(self, now: float) -> None:
            """The response's first byte is about to be sent: its flight starts here."""
            if self.response_at is None:
                self.response_at = now
                self.flight.cwnd_bytes = self.congestion_window

        def on_packet_sent(self, *, packet: Any) -> None:
            super().on_packet_sent(packet=packet)
            self.peak_in_flight = max(self.peak_in_flight, self.bytes_in_flight)
            if self.response_at is not None and not self.flight.closed:
                self.flight.bytes += packet.sent_bytes
                self.flight.packets += 1

        def on_packet_acked(self, *, now: float, packet: Any) -> None:
            if self.response_at is not None and packet.sent_time >= self.response_at:
                self.flight.closed = True  # the first ACK of the response: the flight is over
            if self.ssthresh is None or self.congestion_window < self.ssthresh:
                limited = self.congestion_window < 2 * self.peak_in_flight
            else:
                limited = self.peak_in_flight + self._max_datagram_size >= self.congestion_window
            if limited:
                super().on_packet_acked(now=now, packet=packet)
            else:
                self.bytes_in_flight -= packet.sent_bytes

        def on_packets_lost(self, *, now: float, packets: Any) -> None:
            packets = list(packets)
            self.flight.lost_packets += len(packets)
            super().on_packets_lost(now=now, packets=packets)

    class Unpaced(QuicPacketPacer):
        """aioquic's pacer that never holds a datagram back: a plain arm's flights leave as one
        burst, as a plain TCP arm's do (a paced arm, ``Np``, keeps aioquic's own pacer)."""

        def next_send_time(self, now: float) -> None:  # type: ignore[override]
            return None

        def update_rate(self, congestion_window: int, smoothed_rtt: float) -> None:
            return None


def register_arm(iw: int) -> str:
    """Register the arm's controller with aioquic (idempotent) and return its name."""
    _require()
    name = ARM_ALGORITHM.format(iw=iw)

    def factory(*, max_datagram_size: int) -> ArmWindow:
        return ArmWindow(iw, max_datagram_size=max_datagram_size)

    register_congestion_control(name, factory)
    return name


# --- the origin --------------------------------------------------------------------------------

#: What the origin reports of one HTTP/3 response (``iwprobe origin --quic`` prints one per line).
Observation = dict[str, Any]


def _monotonic_us() -> int:
    return time.monotonic_ns() // 1000


if not _IMPORT_ERROR:

    class _OriginProtocol(QuicConnectionProtocol):
        """One client connection of one arm: serves ``GET /obj/<bytes>`` over HTTP/3."""

        def __init__(
            self,
            *args: Any,
            arm: Arm,
            port: int,
            pattern: bytes,
            report: Callable[[Observation], None],
            budgets: Optional[ClientBudgets],
            **kwargs: Any,
        ) -> None:
            super().__init__(*args, **kwargs)
            self._arm = arm
            self._port = port
            self._pattern = pattern
            self._report = report
            self._budgets = budgets
            #: The client's address once its first request was admitted (its connection counted).
            self._client: Optional[str] = None
            self._http = H3Connection(self._quic)
            if not arm.paced:
                self._quic._loss._pacer = Unpaced(max_datagram_size=self._quic._max_datagram_size)
            self._started_us = _monotonic_us()
            self._handshake_us: Optional[int] = None
            #: stream id -> (request read at (µs), status, size, trial id, request read at (wall
            #: clock), response handed to the stack (µs after the request))
            self._pending: dict[int, tuple[int, int, int, Optional[str], str, int]] = {}

        def quic_event_received(self, event: QuicEvent) -> None:
            if isinstance(event, HandshakeCompleted) and self._handshake_us is None:
                self._handshake_us = _monotonic_us() - self._started_us
            if isinstance(event, ConnectionTerminated):
                for stream_id in list(self._pending):  # never fully acknowledged
                    self._finished(stream_id, acknowledged=False)
                if self._budgets is not None and self._client is not None:
                    self._budgets.release(self._client)
                    self._client = None
                return
            for h3_event in self._http.handle_event(event):
                self._h3_event(h3_event)

        def _h3_event(self, event: H3Event) -> None:
            if not isinstance(event, HeadersReceived):
                return
            headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in event.headers}
            head = f"{headers.get(':method', '')} {headers.get(':path', '')} HTTP/1.1"
            trial = headers.get(wire.TRIAL_HEADER.lower())
            if trial:
                head += f"\r\n{wire.TRIAL_HEADER}: {trial}"
            read_us, read_at = _monotonic_us(), wire.utc_timestamp()
            status, size, trial_id, reason = route_request(head.encode("latin-1"), len(self._pattern))
            if headers.get(":method") != "GET":
                status, size, reason = 405, 0, "only GET\n"
            if not self._admitted(size if status == 200 else 0):
                status, size, reason = 429, 0, "too many requests or bytes from this address\n"
            if status == 200:
                self._window().mark_response(self._loop.time())
            body = self._pattern[:size] if status == 200 else reason.encode()
            self._http.send_headers(
                event.stream_id,
                [
                    (b":status", str(status).encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"content-type", b"application/octet-stream"),
                ],
            )
            self._http.send_data(event.stream_id, body, end_stream=True)
            self._pending[event.stream_id] = (read_us, status, size, trial_id, read_at, _monotonic_us() - read_us)

        def _window(self) -> ArmWindow:
            """The connection's congestion controller: the arm's (every listener registers one)."""
            return cast(ArmWindow, self._quic._loss._cc)

        def _admitted(self, size: int) -> bool:
            """The TCP origin's per-client budgets, per request: the connection counts from its
            first request on, every request takes a request token, a response its bytes."""
            if self._budgets is None:
                return True
            if self._client is None:
                client = str(self._quic._network_paths[0].addr[0])
                admitted, rate_limited = self._budgets.admit(client)
                if not admitted:
                    return False
                self._client = client
                if rate_limited:
                    return False
            elif not self._budgets.take_request(self._client):
                return False
            return self._budgets.take_bytes(self._client, size) if size else True

        def datagram_received(self, data: Union[bytes, str], addr: Any) -> None:
            super().datagram_received(data, addr)
            for stream_id in list(self._pending):
                stream = self._quic._streams.get(stream_id)
                # aioquic forgets a stream once both of its directions are finished
                if stream is None or stream.sender.is_finished:
                    self._finished(stream_id)

        def _finished(self, stream_id: int, acknowledged: bool = True) -> None:
            read_us, status, size, trial_id, read_at, first_byte_us = self._pending.pop(stream_id)
            flight = self._window().flight
            host, port = self._quic._network_paths[0].addr[:2] if self._quic._network_paths else ("", 0)
            self._report(
                {
                    "protocol": "h3",
                    "arm": self._arm.label,
                    "arm_iw": self._arm.iw,
                    "port": self._port,
                    "client_addr": str(host),
                    "client_port": int(port),
                    "request_at": read_at,
                    "first_byte_us": first_byte_us,
                    "trial_id": trial_id,
                    "http_status": status,
                    "object_bytes": size,
                    "handshake_us": self._handshake_us,
                    # the paper's metric: request read -> last byte acknowledged
                    "response_us": _monotonic_us() - read_us if acknowledged else None,
                    "first_flight_bytes": flight.bytes,
                    "first_flight_packets": flight.packets,
                    "cwnd_at_start_bytes": flight.start_cwnd_bytes,
                    "cwnd_at_response_bytes": flight.cwnd_bytes,
                    "max_datagram_size": self._quic._max_datagram_size,
                    "lost_packets": flight.lost_packets,
                    "zero_rtt": False,
                    "srtt_us": int(self._quic._loss._rtt_smoothed * 1e6) if self._quic._loss._rtt_initialized else None,
                }
            )


class QuicOrigin:
    """HTTP/3 on UDP, one port per plain or paced arm (the arm's TCP port number), on a thread
    with its own event loop.  A plain arm's flights leave as bursts (:class:`Unpaced`), a paced
    arm's (``Np``) are paced by aioquic: a burst of a quarter of the window, then ``window /
    srtt``."""

    def __init__(
        self,
        arms: list[Arm],
        binds: list[str],
        base_port: int,
        cert_file: str,
        key_file: str,
        report: Callable[[Observation], None],
        max_object_bytes: int = wire.MAX_OBJECT_BYTES,
        budgets: Optional[ClientBudgets] = None,
    ) -> None:
        _require()
        if any(arm.policy == "learned" for arm in arms):
            raise ValueError("the learned arm is TCP's only (a per-prefix initcwnd route)")
        self.arms = arms
        self.binds = binds
        self.base_port = base_port
        self._cert = (cert_file, key_file)
        self._report = report
        self._pattern = object_pattern(max_object_bytes)
        #: The TCP origin's per-client budgets (docs/security.md), shared: one client's
        #: connections, requests and bytes count once across both protocols.
        self.budgets = budgets
        self._loop = asyncio.new_event_loop()
        self._servers: list[QuicServer] = []
        self._thread = threading.Thread(target=self._loop.run_forever, name="origin-quic", daemon=True)

    def port(self, arm: Arm) -> int:
        return arm.port(self.base_port)

    def start(self) -> None:
        """Bind every arm's UDP port (raises if one is taken) and serve."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=10)

    async def _serve(self) -> None:
        for arm, bind in ((arm, bind) for arm in self.arms for bind in self.binds):
            configuration = QuicConfiguration(
                is_client=False,
                alpn_protocols=H3_ALPN,
                congestion_control_algorithm=register_arm(arm.iw),
                max_datagram_size=MAX_DATAGRAM_SIZE,
            )
            configuration.load_cert_chain(*self._cert)

            def protocol(*args: Any, arm: Arm = arm, **kwargs: Any) -> _OriginProtocol:
                port = self.port(arm)
                return _OriginProtocol(
                    *args, arm=arm, port=port, pattern=self._pattern, report=self._report, budgets=self.budgets, **kwargs
                )

            self._servers.append(await serve(bind, self.port(arm), configuration=configuration, create_protocol=protocol))

    def stop(self) -> None:
        async def close() -> None:
            for server in self._servers:
                server.close()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()


__all__ = ["QuicOrigin", "ServerFlight", "register_arm"]
