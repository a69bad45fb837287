"""The origin's configuration: its arms and ports, its worker pool and its per-client limits.

The per-client limits default to values read from the environment (``IWPROBE_ORIGIN_*``),
since the CLI has no flags for them yet; they are read each time an :class:`OriginConfig`
is built.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Union

from . import wire
from ._arms import LEARNED_CAP_IW, Arm, parse_arms
from ._routes import DEFAULT_INITRWND, DEFAULT_MARK_BASE, DEFAULT_TABLE_BASE


def _env_number(name: str, default: int) -> int:
    """An integer limit from the environment (``name``), or ``default``; a bad value is an error."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(float(text))
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    return value


@dataclass
class OriginConfig:
    #: Address(es) every arm listens on: one (``"0.0.0.0"``, ``"fd99::1"``) or several (IPv4
    #: and IPv6, say); an address with a colon is IPv6.
    bind: Union[str, Sequence[str]] = "0.0.0.0"
    #: Arm labels (``"10"``, ``"10p"``, ``"learned"``) or plain IWs; see :mod:`iwprobe._arms`.
    arms: Sequence[Union[int, str, Arm]] = (3, 10, 16, 32)
    base_port: int = 8000
    max_object_bytes: int = wire.MAX_OBJECT_BYTES
    workers: int = 32
    queue_size: int = 128
    request_timeout_s: float = 10.0
    ack_timeout_s: float = 60.0
    poll_interval_s: float = 0.0005
    #: Fixed send buffer in bytes; 0 keeps the kernel's autotuning (recommended).
    sndbuf_bytes: int = 0
    mark_base: int = DEFAULT_MARK_BASE
    set_marks: bool = True
    origin_id: str = ""
    #: The learned arm: table of its per-prefix routes, window cap, forgetting time, and whether
    #: to install routes at all (False in tests without CAP_NET_ADMIN).
    table_base: int = DEFAULT_TABLE_BASE
    learned_cap_iw: int = LEARNED_CAP_IW
    learned_ttl_s: float = 600.0
    learned_routes: bool = True
    initrwnd: int = DEFAULT_INITRWND
    #: TCP congestion control of every connection (``TCP_CONGESTION`` on the listeners, inherited
    #: by accepted sockets), e.g. ``cubic``; empty keeps the host's default (which varies: CUBIC
    #: on a fresh Debian, BBR on some hosts; BBR paces everything after the first 10 segments).
    congestion_control: str = ""
    #: Serve the interactive flow's UDP echo on ``base_port`` (see :mod:`iwprobe._echo`).
    echo: bool = True
    #: HTTP/3 is served next to every plain and paced arm (:mod:`iwprobe._quic`): HTTPS answers say so in
    #: ``Alt-Svc`` (``h3=":<the arm's port>"``: the same number, on UDP).
    quic: bool = False
    #: How responses are written (:data:`iwprobe._sendpath.SEND_PATH_CHOICES`): ``writev``,
    #: ``sendfile`` or ``mss-writes``; every observation says which path it took.
    send_path: str = "writev"
    # Per-client limits (per source address; enforced by :mod:`iwprobe._budgets`).  The defaults
    # leave room for an offered-load round (up to 256 trials in flight from one probe) and for a
    # 100 Mbit/s probe fetching back to back; the environment variables below override them (the
    # CLI has no flags for them yet).
    #: Connections still sending their request head (read by the accept thread); beyond: closed at once.
    max_pending: int = field(default_factory=lambda: _env_number("IWPROBE_ORIGIN_MAX_PENDING", 1024))
    #: Open connections per client address (head being read, queued or served); beyond: closed at accept.
    client_max_connections: int = field(default_factory=lambda: _env_number("IWPROBE_ORIGIN_CLIENT_CONNECTIONS", 512))
    #: Requests per second per client address (token bucket; 0 = no limit); beyond: 429.
    client_requests_per_s: float = field(default_factory=lambda: float(_env_number("IWPROBE_ORIGIN_CLIENT_RPS", 1000)))
    client_request_burst: int = field(default_factory=lambda: _env_number("IWPROBE_ORIGIN_CLIENT_BURST", 2000))
    #: Response bytes per second per client address (0 = no limit); beyond: 429.  The bucket holds
    #: at least two objects of ``max_object_bytes`` so that any single object is servable.
    client_bytes_per_s: float = field(
        default_factory=lambda: float(_env_number("IWPROBE_ORIGIN_CLIENT_BYTES_PER_S", 64 * 1024 * 1024))
    )

    #: HTTPS on every arm (:mod:`iwprobe._tls`): the chain (PEM, leaf first) and its key.
    tls_cert: str = ""
    tls_key: str = ""

    def addresses(self) -> list[str]:
        """The listening addresses, in order, without repeats."""
        given = [self.bind] if isinstance(self.bind, str) else list(self.bind)
        unique = list(dict.fromkeys(address.strip().strip("[]") for address in given if address.strip()))
        if not unique:
            raise ValueError("the origin needs at least one address to listen on")
        return unique

    def policies(self) -> list[Arm]:
        return parse_arms(list(self.arms))

    def port(self, arm: Union[int, str, Arm]) -> int:
        """The listening port of an arm (a plain IW ``N`` is ``base_port + N``)."""
        return (arm if isinstance(arm, Arm) else parse_arms([arm])[0]).port(self.base_port)
