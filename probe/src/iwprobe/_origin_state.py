"""What the origin keeps while it serves: connections whose request head (or ClientHello) is
still arriving, its counters, and how a connection's IP version is told."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from ._measure import Connection


@dataclass
class PendingHead:
    """A connection whose request head is still arriving (read non-blocking by the accept thread)."""

    conn: Connection
    deadline: float
    buffer: bytearray = field(default_factory=bytearray)


@dataclass
class OriginStats:
    connections: int = 0
    shed: int = 0
    rate_limited: int = 0
    observations: int = 0
    dropped_observations: int = 0
    errors: dict[str, int] = field(default_factory=dict)


def connection_family(listener: socket.socket, client: str) -> str:
    """The IP version of a connection: an IPv4-mapped client of an IPv6 listener is IPv4."""
    if listener.family == socket.AF_INET6 and not client.startswith("::ffff:"):
        return "ipv6"
    return "ipv4"
