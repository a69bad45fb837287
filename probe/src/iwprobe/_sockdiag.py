"""Every TCP connection's final ``TCP_INFO`` as it closes: sock_diag destroy notifications.

The kernel multicasts a message on ``NETLINK_SOCK_DIAG`` for each TCP socket it frees
(groups ``SKNLGRP_INET_TCP_DESTROY`` and ``SKNLGRP_INET6_TCP_DESTROY``; what ``ss -E``
listens to), with the socket's addresses and its final ``struct tcp_info``.  Nothing polls, so
no connection is missed however short it was (M-Lab's tcp-info polls ``inet_diag`` and misses
connections shorter than its interval).  A classic BPF filter on the netlink socket keeps only
sockets whose local port is one of the server's, so the agent is not woken for the host's other
traffic.  The messages carry no socket mark: the agent recomputes each connection's arm from
the client's address (:mod:`iwprobe._jhash`).

When the agent reads too slowly the kernel drops notifications and ``recv`` fails with
``ENOBUFS``: counted in :attr:`DestroyListener.overruns` (measurement lost, never traffic).
Needs ``CAP_NET_ADMIN``.
"""

from __future__ import annotations

import errno
import socket
import struct
import time
from dataclasses import dataclass
from typing import Optional

from ._capture import _attach_filter
from ._tcpinfo import parse_tcp_info

NETLINK_SOCK_DIAG = 4
SKNLGRP_INET_TCP_DESTROY = 1
SKNLGRP_INET6_TCP_DESTROY = 3
SOCK_DIAG_BY_FAMILY = 20
INET_DIAG_INFO = 2
SO_RCVBUFFORCE = 33
SOL_NETLINK = 270
NETLINK_ADD_MEMBERSHIP, NETLINK_DROP_MEMBERSHIP = 1, 2
#: Kernel buffer for notifications not read yet (a burst of closes at 10,000/s for 1 s is ~5 MB).
RECEIVE_BUFFER_BYTES = 16 * 1024 * 1024
_NLMSG = struct.Struct("=IHHII")
_DIAG_HEAD = struct.Struct("=BBBB")
_PORTS = struct.Struct("!HH")
_ATTR = struct.Struct("=HH")
#: ``struct inet_diag_msg``: 4 bytes, the 48-byte socket id, 5 u32.
_DIAG_MSG_BYTES = 72
#: Offset of ``idiag_sport`` in the netlink message (after the 16-byte ``nlmsghdr``).
_SPORT_OFFSET = 16 + 4


@dataclass(frozen=True)
class ClosedConnection:
    """One TCP socket of the server, as the kernel freed it."""

    #: ``time.time_ns()`` when the agent read the notification (within milliseconds of the close).
    closed_ns: int
    family: int
    local_addr: str
    local_port: int
    remote_addr: str
    remote_port: int
    #: TCP state at destroy (7 = CLOSE; a socket freed from another state was aborted).
    state: int
    #: The kernel's ``struct tcp_info`` as it came (read with :class:`iwprobe._tcpinfo.FieldReader`).
    info_raw: bytes

    @property
    def tcp_info(self) -> dict[str, int]:
        """Every field of the final ``TCP_INFO`` (parsed on demand: only sampled records need it)."""
        return parse_tcp_info(self.info_raw)


def _port_filter(ports: list[int]) -> list[tuple[int, int, int, int]]:
    """Classic BPF over the netlink message: accept when ``idiag_sport`` is one of ``ports``."""
    program: list[tuple[int, int, int, int]] = [(0x28, 0, 0, _SPORT_OFFSET)]  # ldh [20]
    count = len(ports)
    for index, port in enumerate(ports):
        program.append((0x15, count - index, 0, port))  # jeq #port, accept, next
    program.append((0x06, 0, 0, 0))  # drop
    program.append((0x06, 0, 0, 0xFFFFFFFF))  # accept whole message
    return program


def parse_message(data: bytes, offset: int, length: int, now_ns: int) -> Optional[ClosedConnection]:
    """One ``SOCK_DIAG_BY_FAMILY`` message (``data[offset:offset+length]``, header included)."""
    body = offset + _NLMSG.size
    end = offset + length
    if end - body < _DIAG_MSG_BYTES:
        return None
    family, state, _, _ = _DIAG_HEAD.unpack_from(data, body)
    if family not in (socket.AF_INET, socket.AF_INET6):
        return None
    sport, dport = _PORTS.unpack_from(data, body + 4)
    width = 4 if family == socket.AF_INET else 16
    local = socket.inet_ntop(family, data[body + 8 : body + 8 + width])
    remote = socket.inet_ntop(family, data[body + 24 : body + 24 + width])
    info = b""
    attr = body + _DIAG_MSG_BYTES
    while attr + _ATTR.size <= end:
        attr_len, attr_type = _ATTR.unpack_from(data, attr)
        if attr_len < _ATTR.size:
            break
        if attr_type == INET_DIAG_INFO:
            info = data[attr + _ATTR.size : attr + attr_len]
        attr += (attr_len + 3) & ~3
    return ClosedConnection(now_ns, family, local, sport, remote, dport, state, info)


class DestroyListener:
    """Subscribed to TCP destroy notifications of sockets with a local port in ``ports``."""

    def __init__(self, ports: list[int], receive_buffer: int = RECEIVE_BUFFER_BYTES) -> None:
        self.ports = sorted(set(ports))
        self.overruns = 0
        self.listening = True
        groups = (1 << (SKNLGRP_INET_TCP_DESTROY - 1)) | (1 << (SKNLGRP_INET6_TCP_DESTROY - 1))
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
        try:
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, receive_buffer)
            except OSError:
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            _attach_filter(self._sock, _port_filter(self.ports))
            self._sock.bind((0, groups))
        except OSError:
            self._sock.close()
            raise
        self._buffer = bytearray(1 << 20)

    def fileno(self) -> int:
        return self._sock.fileno()

    def listen(self, on: bool) -> None:
        """Join or leave the destroy groups.  While no socket of the network namespace is in them
        the kernel builds no notification at all (:mod:`iwprobe._tap_budget`); those already
        queued stay readable."""
        if on != self.listening:
            option = NETLINK_ADD_MEMBERSHIP if on else NETLINK_DROP_MEMBERSHIP
            for group in (SKNLGRP_INET_TCP_DESTROY, SKNLGRP_INET6_TCP_DESTROY):
                self._sock.setsockopt(SOL_NETLINK, option, group)
            self.listening = on

    def read(self, timeout_s: float) -> list[ClosedConnection]:
        """The notifications that arrived (waiting up to ``timeout_s`` for the first)."""
        self._sock.settimeout(timeout_s)
        closed: list[ClosedConnection] = []
        try:
            size = self._sock.recv_into(self._buffer)
        except (socket.timeout, BlockingIOError):
            return closed
        except OSError as error:
            if error.errno == errno.ENOBUFS:
                self.overruns += 1
                return closed
            raise
        self._sock.setblocking(False)
        while size:
            self._parse(size, closed)
            try:
                size = self._sock.recv_into(self._buffer)
            except BlockingIOError:
                break
            except OSError as error:
                if error.errno != errno.ENOBUFS:
                    raise
                self.overruns += 1
        return closed

    def _parse(self, size: int, closed: list[ClosedConnection]) -> None:
        data = bytes(self._buffer[:size])
        now_ns = time.time_ns()
        offset = 0
        while offset + _NLMSG.size <= size:
            length, kind, _, _, _ = _NLMSG.unpack_from(data, offset)
            if length < _NLMSG.size:
                break
            if kind == SOCK_DIAG_BY_FAMILY:
                connection = parse_message(data, offset, length, now_ns)
                if connection is not None and connection.local_port in self.ports:
                    closed.append(connection)
            offset += (length + 3) & ~3

    def close(self) -> None:
        self._sock.close()
