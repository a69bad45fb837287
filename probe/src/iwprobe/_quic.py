"""HTTP/3 on aioquic, the optional ``iwprobe[quic]`` extra: what probe and origin share and the
probe's client (:func:`fetch_h3`); the origin's side is :mod:`iwprobe._quic_origin`.

The rest of the probe is standard library only; this module is imported only when QUIC is asked
for (``iwprobe origin --quic``, ``iwprobe fetch --quic``, ``iwprobe census --quic``, a campaign's
QUIC arms), and :func:`quic_available` says whether it can be.

The client logs every datagram (:class:`_LoggingTransport`); :mod:`iwprobe._quic_flight` reads the
server's first flight from that log, acknowledged (a timed fetch) or with every ACK withheld (the
census).
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
import urllib.parse
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Union, cast

from . import wire
from ._quic_flight import CENSUS_GAP_US, Datagram, QuicFlight, acknowledged_flight, withheld_flight

try:  # the optional extra
    from aioquic.asyncio.client import connect
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.h3.connection import H3_ALPN, H3Connection
    from aioquic.h3.events import DataReceived, HeadersReceived
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.events import HandshakeCompleted, QuicEvent

    _IMPORT_ERROR = ""
except ImportError as error:  # pragma: no cover - exercised where the extra is absent
    _IMPORT_ERROR = str(error)

#: The arm's congestion controller's name in aioquic's registry.
ARM_ALGORITHM = "iwscope-iw{iw}"
#: Largest UDP payload aioquic sends (it does not probe for more): RFC 9000's smallest maximum.
MAX_DATAGRAM_SIZE = 1200


def quic_available() -> tuple[bool, str]:
    """Whether the ``quic`` extra (aioquic) is installed, and if not, why."""
    return (not _IMPORT_ERROR, _IMPORT_ERROR)


def _require() -> None:
    if _IMPORT_ERROR:
        raise RuntimeError(f"QUIC needs the optional extra: pip install 'iwprobe[quic]' ({_IMPORT_ERROR})")


# --- the client --------------------------------------------------------------------------------


@dataclass
class QuicFetch:
    """One HTTP/3 fetch over a fresh QUIC connection, and the server's first flight it saw."""

    url: str
    started_at: str
    protocol: str = "h3"
    handshake_us: Optional[int] = None
    ttfb_us: Optional[int] = None
    total_us: Optional[int] = None
    body_bytes: int = 0
    http_status: Optional[int] = None
    error_kind: Optional[str] = None
    error_detail: str = ""
    withheld_acks: bool = False
    flight: Optional[QuicFlight] = None
    #: Every datagram of the connection (µs since the first send, way, UDP payload bytes).
    datagrams: list[Datagram] = field(default_factory=list)

    def to_dict(self, with_datagrams: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not with_datagrams:
            data.pop("datagrams")
        return data


def _no_ack(builder: Any, space: Any, now: float) -> None:
    """In place of aioquic's ACK frame writer for a census client: nothing leaves, and the
    space's ACK timer is cleared so that it does not fire again."""
    space.ack_at = None


class _LoggingTransport:
    """The datagram transport, with every send written to the fetch's log (only what aioquic's
    client uses of a transport: ``sendto`` and ``close``)."""

    def __init__(self, transport: Any, log: Callable[[str, int], None]) -> None:
        self._transport = transport
        self._log = log

    def sendto(self, data: bytes, addr: Any = None) -> None:
        self._log("out", len(data))
        self._transport.sendto(data, addr)

    def close(self) -> None:
        self._transport.close()

    def is_closing(self) -> bool:
        return bool(self._transport.is_closing())


if not _IMPORT_ERROR:

    class _ClientProtocol(QuicConnectionProtocol):
        def __init__(self, *args: Any, result: QuicFetch, withhold_acks: bool, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.result = result
            self.t0_ns: Optional[int] = None
            self.last_in_us = 0
            self.done_us: Optional[int] = None
            self.done = asyncio.Event()
            self.http = H3Connection(self._quic)
            self.stream_id: Optional[int] = None
            if withhold_acks:
                # the census: no ACK frame ever leaves, so the server has only its window
                self._quic._write_ack_frame = _no_ack  # type: ignore[method-assign]

        def now_us(self) -> int:
            if self.t0_ns is None:
                self.t0_ns = time.monotonic_ns()
            return (time.monotonic_ns() - self.t0_ns) // 1000

        def log(self, way: str, size: int) -> None:
            now = self.now_us()
            self.result.datagrams.append((now, way, size))
            if way == "in":
                self.last_in_us = now

        def connection_made(self, transport: Any) -> None:
            super().connection_made(cast(Any, _LoggingTransport(transport, self.log)))

        def datagram_received(self, data: Union[bytes, str], addr: Any) -> None:
            self.log("in", len(data))
            super().datagram_received(data, addr)

        def quic_event_received(self, event: QuicEvent) -> None:
            if isinstance(event, HandshakeCompleted) and self.result.handshake_us is None:
                self.result.handshake_us = self.now_us()
            for h3_event in self.http.handle_event(event):
                if getattr(h3_event, "stream_id", None) != self.stream_id:
                    continue
                if isinstance(h3_event, HeadersReceived):
                    self.result.ttfb_us = self.now_us()
                    for name, value in h3_event.headers:
                        if name == b":status":
                            self.result.http_status = int(value)
                elif isinstance(h3_event, DataReceived):
                    self.result.body_bytes += len(h3_event.data)
                if getattr(h3_event, "stream_ended", False):
                    self.done_us = self.now_us()
                    self.done.set()


def _client_configuration(host: str, ca_file: Optional[str], insecure: bool) -> Any:
    configuration = QuicConfiguration(
        is_client=True, alpn_protocols=H3_ALPN, max_datagram_size=MAX_DATAGRAM_SIZE, server_name=host
    )
    if insecure:
        configuration.verify_mode = ssl.CERT_NONE
    elif ca_file:
        configuration.load_verify_locations(ca_file)
    else:
        configuration.load_verify_locations(cafile=ssl.get_default_verify_paths().cafile)
    return configuration


async def _fetch(
    url: str,
    result: QuicFetch,
    *,
    ca_file: Optional[str],
    insecure: bool,
    trial_id: Optional[str],
    withhold_acks: bool,
    timeout_s: float,
) -> None:
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or 443
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    configuration = _client_configuration(host, ca_file, insecure)

    def protocol(*args: Any, **kwargs: Any) -> _ClientProtocol:
        return _ClientProtocol(*args, result=result, withhold_acks=withhold_acks, **kwargs)

    async with connect(host, port, configuration=configuration, create_protocol=protocol) as client:
        assert isinstance(client, _ClientProtocol)
        client.stream_id = client._quic.get_next_available_stream_id()
        headers = [
            (b":method", b"GET"),
            (b":scheme", b"https"),
            (b":authority", parts.netloc.encode()),
            (b":path", path.encode()),
            (b"user-agent", b"iwprobe"),
        ]
        if trial_id:
            headers.append((wire.TRIAL_HEADER.lower().encode(), trial_id.encode()))
        client.http.send_headers(client.stream_id, headers, end_stream=True)
        client.transmit()
        request_us = max(t for t, way, _ in result.datagrams if way == "out")
        if withhold_acks:
            # the server sends its window and stops: wait for the silence that ends the flight
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                await asyncio.sleep(0.02)
                if client.last_in_us > request_us and client.now_us() - client.last_in_us > CENSUS_GAP_US + 50_000:
                    break
            result.flight = withheld_flight(result.datagrams, request_us, client.done_us)
        else:
            await client.done.wait()
            result.total_us = client.done_us
            # acknowledge the last datagrams now, not after the ACK delay: the origin's
            # response time ends with the acknowledgement of its last byte
            for space in client._quic._spaces.values():
                if space.ack_at is not None:
                    space.ack_at = client._loop.time()
            client.transmit()
            await asyncio.sleep(0.005)
            result.flight = acknowledged_flight(result.datagrams, request_us, client.done_us)


def _run_on_own_thread(make: Callable[[], Any], timeout_s: float) -> None:
    """Run the coroutine ``make()`` returns under ``timeout_s`` with ``asyncio.run`` on a new
    thread; its exception, if any, is raised here."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(asyncio.wait_for(make(), timeout_s))
        except BaseException as error:
            failure.append(error)

    thread = threading.Thread(target=run, name="iwprobe-quic-fetch", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def fetch_h3(
    url: str,
    *,
    ca_file: Optional[str] = None,
    insecure: bool = False,
    trial_id: Optional[str] = None,
    withhold_acks: bool = False,
    timeout_s: float = 30.0,
) -> QuicFetch:
    """One HTTP/3 GET over a new connection; failures become ``error_kind``, not exceptions."""
    _require()
    result = QuicFetch(url=url, started_at=wire.utc_timestamp(), withheld_acks=withhold_acks)
    if trial_id is None and not withhold_acks:
        trial_id = str(uuid.uuid4())
    try:
        # one deadline for everything (aioquic's handshake alone would wait its 60 s idle
        # timeout), on a thread of its own: a caller that runs an event loop (an agent, a test
        # harness) cannot run another in its own thread
        _run_on_own_thread(
            lambda: _fetch(
                url,
                result,
                ca_file=ca_file,
                insecure=insecure,
                trial_id=trial_id,
                withhold_acks=withhold_acks,
                timeout_s=timeout_s,
            ),
            timeout_s,
        )
    except (asyncio.TimeoutError, TimeoutError):
        result.error_kind, result.error_detail = "timeout", f"no complete answer within {timeout_s} s"
    except ConnectionError as error:
        result.error_kind, result.error_detail = "connect", str(error) or type(error).__name__
    except OSError as error:
        result.error_kind, result.error_detail = "network", str(error)
    return result


__all__ = ["ARM_ALGORITHM", "MAX_DATAGRAM_SIZE", "QuicFetch", "fetch_h3", "quic_available"]
