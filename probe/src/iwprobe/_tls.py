"""The origin's HTTPS: a TLS handshake driven through memory BIOs, so its first flight is measured.

Over TLS the first thing the server sends is not the response but its first flight
(ServerHello ... Certificate chain, CertificateVerify, Finished): itself a short transfer that
the initial window bounds.  To see it, the origin does not hand the socket to ``ssl``; it runs
an :class:`ssl.SSLObject` over two :class:`ssl.MemoryBIO` and moves the bytes itself:

* the accept thread reads the ClientHello without blocking, like a request head
  (:func:`client_hello_state`), and notes when its last byte arrived;
* a worker feeds it to the SSL object; the bytes the object then wants to send are the whole
  first flight, sent in one write (:func:`handshake`), so ``first_flight_bytes`` is exact;
* while waiting for the client's next flight the worker polls ``TCP_INFO`` until
  ``bytes_acked`` covers the flight (``flight_acked_us``: the client has all of it), and the
  handshake is complete when the client's Finished is processed (``handshake_us``, from the
  ClientHello read: the server-side handshake time).

The HTTP request and response then go through the same object (:class:`TlsStream`).  TLS 1.3
and 1.2 are served; session tickets are sent after the handshake, as OpenSSL does by default.
Standard library only.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Optional

from ._tcpinfo import read_tcp_info

#: TLS record type of handshake messages, and the ClientHello's handshake type.
_HANDSHAKE_RECORD = 22
_CLIENT_HELLO = 1
#: Largest ClientHello the accept thread waits for (post-quantum key shares are ~1.2 KB).
MAX_CLIENT_HELLO_BYTES = 64 * 1024
_RECV_BYTES = 64 * 1024


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context for TLS 1.2 and 1.3 with the chain in ``cert_file`` (leaf first)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    context.set_alpn_protocols(["http/1.1"])
    return context


def client_hello_state(buffer: bytes) -> Optional[str]:
    """``"complete"`` when ``buffer`` holds a whole ClientHello (over one or more handshake
    records), ``None`` while more is needed, else why it cannot be one (``"not_tls"``,
    ``"too_large"``)."""
    if len(buffer) > MAX_CLIENT_HELLO_BYTES:
        return "too_large"
    payload = bytearray()
    offset = 0
    while offset + 5 <= len(buffer):
        if buffer[offset] != _HANDSHAKE_RECORD or buffer[offset + 1] != 3:
            return "not_tls"
        length = int.from_bytes(buffer[offset + 3 : offset + 5], "big")
        if offset + 5 + length > len(buffer):
            break
        payload += buffer[offset + 5 : offset + 5 + length]
        offset += 5 + length
        if len(payload) >= 4:
            if payload[0] != _CLIENT_HELLO:
                return "not_tls"
            if len(payload) >= 4 + int.from_bytes(payload[1:4], "big"):
                return "complete"
    if buffer and buffer[0] != _HANDSHAKE_RECORD:
        return "not_tls"
    return None


@dataclass
class Handshake:
    """What the origin measured of one TLS handshake (times from the ClientHello read, µs)."""

    version: str = ""
    #: Bytes of the server's first flight (TLS records, ServerHello to Finished in 1.3).  After
    #: a HelloRetryRequest (a client whose key shares the server does not take) these are the
    #: retry request's bytes: the probes and curl offer X25519, which needs no retry.
    first_flight_bytes: int = 0
    #: ClientHello read -> every first-flight byte acknowledged (``tcpi_bytes_acked``).
    flight_acked_us: Optional[int] = None
    #: ClientHello read -> handshake complete (the client's Finished processed).
    handshake_us: Optional[int] = None
    #: Why it failed (``timeout``, ``closed``, ``tls_<OpenSSL reason>``, an ``OSError`` name);
    #: empty: it did not.  A failed handshake is counted in the origin's errors, not reported.
    error: str = ""


class TlsStream:
    """An SSL object over memory BIOs and the socket it talks through (blocking socket)."""

    def __init__(self, context: ssl.SSLContext, sock: socket.socket) -> None:
        self.sock = sock
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self.ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=True)

    def feed(self, data: bytes) -> None:
        self._incoming.write(data)

    def flush(self) -> int:
        """Send what the SSL object produced; the byte count."""
        data = self._outgoing.read()
        if data:
            self.sock.sendall(data)
        return len(data)

    def receive(self, deadline_ns: int) -> bool:
        """Read once from the socket into the SSL object; False at end of stream."""
        remaining = (deadline_ns - time.monotonic_ns()) / 1e9
        if remaining <= 0:
            raise socket.timeout("deadline passed")
        self.sock.settimeout(remaining)
        chunk = self.sock.recv(_RECV_BYTES)
        if not chunk:
            self._incoming.write_eof()
            return False
        self._incoming.write(chunk)
        return True

    def encrypt(self, *pieces: bytes | memoryview) -> bytes:
        """The TLS records of ``pieces`` (application data), to send as they are."""
        for piece in pieces:
            if len(piece):
                self.ssl.write(piece)
        return self._outgoing.read()

    def read_head(self, max_bytes: int, deadline_ns: int) -> Optional[bytes]:
        """The HTTP request head (without the blank line), ``None`` when the peer closed first.
        ``ValueError`` when it grows past ``max_bytes``."""
        buffer = bytearray()
        while True:
            try:
                buffer += self.ssl.read(_RECV_BYTES)
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLZeroReturnError:
                return None
            end = buffer.find(b"\r\n\r\n")
            if end >= 0:
                return bytes(buffer[:end])
            if len(buffer) > max_bytes:
                raise ValueError(f"request head larger than {max_bytes} bytes")
            self.flush()
            if not self.receive(deadline_ns):
                return None


def handshake(
    stream: TlsStream, client_hello: bytes, hello_ns: int, timeout_s: float, poll_interval_s: float, stop: threading.Event
) -> Handshake:
    """Run the server side of the handshake that ``client_hello`` (read at ``hello_ns``,
    monotonic) opens; the measurements, with ``error`` set when it did not complete."""
    result = Handshake()
    deadline_ns = hello_ns + int(timeout_s * 1e9)
    stream.feed(client_hello)
    try:
        done = _step(stream)
        result.first_flight_bytes = stream.flush()
        while not done:
            _wait_readable(stream, result, hello_ns, deadline_ns, poll_interval_s, stop)
            if not stream.receive(deadline_ns):
                result.error = "closed"
                return result
            done = _step(stream)
            stream.flush()
        result.handshake_us = (time.monotonic_ns() - hello_ns) // 1000
        result.version = stream.ssl.version() or ""
        if result.flight_acked_us is None:
            _note_acked(stream.sock, result, hello_ns)
    except socket.timeout:
        result.error = "timeout"
    except ssl.SSLError as error:
        result.error = f"tls_{error.reason or 'error'}".lower()[:60]
    except OSError as error:
        result.error = type(error).__name__
    return result


def _step(stream: TlsStream) -> bool:
    """Advance the handshake with what has arrived; True once it is complete."""
    try:
        stream.ssl.do_handshake()
    except ssl.SSLWantReadError:
        return False
    return True


def _note_acked(sock: socket.socket, result: Handshake, hello_ns: int) -> None:
    try:
        acked = read_tcp_info(sock).get("bytes_acked", 0)
    except OSError:
        return
    if result.first_flight_bytes and acked >= result.first_flight_bytes:
        result.flight_acked_us = (time.monotonic_ns() - hello_ns) // 1000


def _wait_readable(
    stream: TlsStream, result: Handshake, hello_ns: int, deadline_ns: int, poll_interval_s: float, stop: threading.Event
) -> None:
    """Wait for the client's next bytes; meanwhile poll TCP_INFO for the flight's last ACK."""
    while True:
        if result.flight_acked_us is None:
            _note_acked(stream.sock, result, hello_ns)
        wait_s = poll_interval_s if result.flight_acked_us is None else 0.05
        readable, _, _ = select.select([stream.sock], [], [], wait_s)
        if readable:
            return
        if time.monotonic_ns() >= deadline_ns or stop.is_set():
            raise socket.timeout("handshake did not complete")
