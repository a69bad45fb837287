"""The origin's HTTP/1.1 subset: ``GET /obj/<bytes>`` request heads in, one answer out.

Request heads are routed to (status, object size, trial id, reason); every answer closes the
connection.  An error answer is followed by :func:`linger`, so that the client reads it
instead of a reset.
"""

from __future__ import annotations

import re
import socket
import time
import uuid
from typing import Optional

from . import wire

#: Largest request head accepted (bytes); a longer one is answered 431.
MAX_HEAD_BYTES = 16 * 1024
REQUEST_LINE = re.compile(rb"^(GET) (\S+) HTTP/1\.[01]$")
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    413: "Payload Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
}


def could_be_request(start: bytes) -> bool:
    """False as soon as the first bytes cannot begin ``GET <path> HTTP/1.x`` (non-HTTP garbage)."""
    if not b"GET ".startswith(start[:4]):
        return False
    line_end = start.find(b"\n")
    if line_end < 0:
        return True
    return REQUEST_LINE.match(start[:line_end].rstrip(b"\r")) is not None


def route_request(head: bytes, max_object_bytes: int) -> tuple[int, int, Optional[str], str]:
    """(status, object size, trial id, reason) for a request head (without its final blank line)."""
    lines = head.split(b"\r\n")
    trial_id: Optional[str] = None
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == wire.TRIAL_HEADER.lower().encode("ascii"):
            try:
                trial_id = str(uuid.UUID(value.strip().decode("ascii")))
            except (ValueError, UnicodeDecodeError):
                trial_id = None
    match = REQUEST_LINE.match(lines[0])
    if not match:
        return 400, 0, trial_id, "bad request line\n"
    path = match.group(2).decode("latin-1")
    if not path.startswith(wire.OBJECT_PATH_PREFIX):
        return 404, 0, trial_id, "not found: only /obj/<bytes>\n"
    digits = path[len(wire.OBJECT_PATH_PREFIX) :]
    if not digits.isdigit() or len(digits) > 12:
        return 400, 0, trial_id, "object size must be a decimal number of bytes\n"
    size = int(digits)
    if size > max_object_bytes:
        return 413, 0, trial_id, f"object larger than {max_object_bytes} bytes\n"
    return 200, size, trial_id, ""


def wants_trace(head: bytes) -> bool:
    """Whether a request head asks for the origin's trace (:data:`wire.TRACE_HEADER` ``: 1``)."""
    name = wire.TRACE_HEADER.lower().encode("ascii")
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip() == b"1"
    return False


def object_pattern(max_object_bytes: int) -> bytes:
    """The bytes every object is a prefix of (0, 1, .., 255, 0, ..): the same object over TCP and
    HTTP/3, and not compressible to nothing by a middlebox."""
    return bytes(range(256)) * ((max_object_bytes + 255) // 256)


def response_head(status: int, content_length: int, alt_svc: str = "") -> bytes:
    """The status line and headers of an answer (an object for 200, plain text otherwise)."""
    extra = "Retry-After: 1\r\n" if status == 429 else ""
    if alt_svc:
        extra += f"Alt-Svc: {alt_svc}\r\n"
    return (
        f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: "
        f"{'application/octet-stream' if status == 200 else 'text/plain'}\r\n"
        f"Content-Length: {content_length}\r\n{extra}Connection: close\r\nServer: iwprobe\r\n\r\n"
    ).encode("ascii")


def linger(sock: socket.socket, limit_s: float = 0.5, limit_bytes: int = 65536) -> None:
    """Half-close and discard what the client still sends (briefly), so that closing with unread
    bytes does not reset the connection before the client has read an error answer."""
    try:
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + limit_s
        drained = 0
        while drained < limit_bytes:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            sock.settimeout(remaining)
            chunk = sock.recv(8192)
            if not chunk:
                return
            drained += len(chunk)
    except OSError:
        return
