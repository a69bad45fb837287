"""How the origin writes a response: the send paths an observation reports (wire v8 ``send_path``).

Seed 002 compares them at the sender: "on Linux, with Nagle and cork switched off, writev
tends to send fewer and larger segments, which is great for TSO, while sendfile prefers
smaller segments".  The origin offers the three a web server chooses between, with
``TCP_NODELAY`` on and no cork, as the seed had them:

* ``writev`` (the default): head and body in one gathered ``sendmsg``
  (:func:`iwprobe._pacing.send_all`); TCP sees the whole response at once.
* ``sendfile``: the head by ``send``, then the body by ``sendfile(2)`` from a memory file
  (:class:`BodyFile`) holding the same bytes as the pattern buffer: what nginx does with
  ``sendfile on; tcp_nopush off``.  With ``TCP_NODELAY`` the head leaves as a segment of its
  own.
* ``mss-writes``: one ``send`` per MSS-sized piece of head + body (an application writing
  in small chunks, as a streaming framework does).

Over HTTPS the body is ciphertext made in userspace, so ``sendfile`` cannot carry it (no kTLS
here): the origin writes it by ``writev`` and says so on the observation.  The paced arms
spread their first window themselves (:func:`iwprobe._pacing.send_paced`): ``paced``.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Optional

from ._pacing import send_all

#: The send paths an origin can be told to use (``iwprobe origin --send-path``).
SEND_PATH_CHOICES = ("writev", "sendfile", "mss-writes")


class BodyFile:
    """The pattern buffer as a memory file (``memfd``) that ``sendfile`` reads from.

    Objects are prefixes of the pattern, so one file serves every size.  ``socket.sendfile``
    takes any object with ``fileno``; giving it explicit offsets means the workers never share
    a file position (``seek`` is a no-op)."""

    mode = "rb"

    def __init__(self, pattern: bytes) -> None:
        self._fd = os.memfd_create("iwprobe-objects", os.MFD_CLOEXEC)
        view = memoryview(pattern)
        written = 0
        while written < len(view):
            written += os.write(self._fd, view[written:])

    def fileno(self) -> int:
        return self._fd

    def seek(self, *_: Any) -> None:
        """``socket.sendfile`` seeks to where it stopped; offsets are always explicit here."""

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def send_mss_writes(sock: socket.socket, header: bytes, body: Any, mss: int) -> None:
    """Head + body in MSS-sized writes (``TCP_NODELAY`` is on: one write, one segment)."""
    if mss <= 0:
        send_all(sock, header, body)
        return
    pieces = [memoryview(header), memoryview(body)]
    while pieces:
        chunk: list[memoryview] = []
        room = mss
        while pieces and room:
            piece = pieces[0]
            take = piece[:room]
            chunk.append(take)
            room -= len(take)
            pieces[0] = piece[len(take) :]
            if not len(pieces[0]):
                pieces.pop(0)
        send_all(sock, bytes(chunk[0]) if len(chunk) == 1 else b"".join(chunk), b"")


def send_response(
    sock: socket.socket,
    path: str,
    header: bytes,
    body: Any,
    *,
    mss: int,
    body_file: Optional[BodyFile],
    plain_body: bool,
) -> str:
    """Write ``header`` + ``body`` by ``path``; the path actually used (:data:`wire.SEND_PATHS`).

    ``plain_body`` says ``body`` is ``len(body)`` bytes from the start of ``body_file``'s
    content (an object; not an error text or TLS records), which ``sendfile`` needs."""
    if path == "sendfile" and body_file is not None and plain_body and len(body):
        if header:
            sock.sendall(header)
        sock.sendfile(body_file, 0, len(body))  # type: ignore[arg-type]
        return "sendfile"
    if path == "mss-writes":
        send_mss_writes(sock, header, body, mss)
        return "mss-writes"
    send_all(sock, header, body)
    return "writev"


__all__ = ["SEND_PATH_CHOICES", "BodyFile", "send_mss_writes", "send_response"]
