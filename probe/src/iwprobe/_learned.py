"""The ``learned`` arm: temporal sharing of the congestion window per client prefix.

As in RFC 9040 (TCP control block sharing, temporal) and Riptide (Akamai): when a connection
to a client ends, the origin remembers the congestion window it ended with (``snd_cwnd``,
or ``snd_ssthresh`` when that is lower: a loss halved the window and the next flow should
not start above it), keyed by the client's prefix (/24 for IPv4, /48 for IPv6).  The next
connection from that prefix to the learned arm starts there: the value is installed as a
per-prefix route ``<prefix> ... table T initcwnd K`` in the learned arm's table (the
kernel reads ``initcwnd`` from the route when the connection is established).

Bounds: a learned window is clamped to ``[min_iw, cap_iw]``; a prefix not refreshed within
``ttl_s`` is forgotten and its route removed (the next connection starts at ``base_iw``
again); :meth:`LearnedWindows.close` removes every route it installed.  Route changes are
made by one thread started before the origin drops ``CAP_NET_ADMIN`` (capabilities are per
thread): it is the only thread that keeps the capability, and it only runs
``ip route replace|del <prefix> ... table <learned table>``.
"""

from __future__ import annotations

import ipaddress
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Optional

from ._routes import run_ip

log = logging.getLogger("iwprobe.origin")

#: ``tcpi_snd_ssthresh`` before any loss ("infinite").
_SSTHRESH_INFINITE = 0x7FFFFFFF


@dataclass
class _Entry:
    iw: int
    updated: float
    #: The value the table's route holds now (0 = no route yet).
    installed: int = 0


def client_prefix(address: str, v4_bits: int = 24, v6_bits: int = 48) -> str:
    """The prefix a client address is remembered under, e.g. ``10.1.2.0/24``."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    bits = v4_bits if ip.version == 4 else v6_bits
    return str(ipaddress.ip_network(f"{ip}/{bits}", strict=False))


def window_to_learn(tcp_info: dict[str, int]) -> Optional[int]:
    """The window a finished connection hands on: ``snd_cwnd``, or ``snd_ssthresh`` if lower."""
    cwnd = tcp_info.get("snd_cwnd")
    if not cwnd:
        return None
    ssthresh = tcp_info.get("snd_ssthresh", _SSTHRESH_INFINITE)
    if 0 < ssthresh < cwnd:
        return ssthresh
    return cwnd


class LearnedWindows:
    """Remembered windows per client prefix and the routes that apply them."""

    def __init__(
        self,
        table: int,
        base_iw: int,
        cap_iw: int,
        *,
        min_iw: int = 2,
        ttl_s: float = 600.0,
        initrwnd: int = 64,
        apply_routes: bool = True,
    ) -> None:
        if not 1 <= min_iw <= base_iw <= cap_iw:
            raise ValueError(f"learned windows need 1 <= min {min_iw} <= base {base_iw} <= cap {cap_iw}")
        self.table = table
        self.base_iw = base_iw
        self.cap_iw = cap_iw
        self.min_iw = min_iw
        self.ttl_s = ttl_s
        self.initrwnd = initrwnd
        self.apply_routes = apply_routes
        self.route_errors = 0
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._updates: queue.Queue[Optional[str]] = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()

    # -- what the serving threads call
    def intended(self, client_addr: str) -> int:
        """The initial window a new connection from ``client_addr`` should have started with."""
        try:
            prefix = client_prefix(client_addr)
        except ValueError:
            return self.base_iw
        with self._lock:
            entry = self._entries.get(prefix)
            return entry.installed if entry is not None and entry.installed else self.base_iw

    def observe(self, client_addr: str, tcp_info: dict[str, int]) -> Optional[int]:
        """Remember the window a finished connection ended with; the clamped value, or None."""
        window = window_to_learn(tcp_info)
        if window is None:
            return None
        try:
            prefix = client_prefix(client_addr)
        except ValueError:
            return None
        value = max(self.min_iw, min(self.cap_iw, window))
        with self._lock:
            entry = self._entries.setdefault(prefix, _Entry(value, time.monotonic()))
            entry.iw, entry.updated = value, time.monotonic()
            changed = entry.installed != value
        if changed:
            self._updates.put(prefix)
        return value

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """prefix -> (remembered window, window the route holds)."""
        with self._lock:
            return {prefix: (entry.iw, entry.installed) for prefix, entry in self._entries.items()}

    # -- the route thread (keeps CAP_NET_ADMIN)
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="origin-learned-routes", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the route thread; it removes every route it installed before it ends (it is the
        thread that still holds CAP_NET_ADMIN).  Without a thread, remove them here."""
        self._stop.set()
        self._updates.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)
        else:
            self._remove_all()

    def _remove_all(self) -> None:
        with self._lock:
            installed = [prefix for prefix, entry in self._entries.items() if entry.installed]
            self._entries.clear()
        for prefix in installed:
            self._delete(prefix)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    prefix = self._updates.get(timeout=min(5.0, self.ttl_s / 4))
                except queue.Empty:
                    prefix = None
                if prefix is not None and not self._stop.is_set():
                    self._install(prefix)
                self._expire()
        finally:
            self._remove_all()

    def _install(self, prefix: str) -> None:
        with self._lock:
            entry = self._entries.get(prefix)
            if entry is None or entry.installed == entry.iw:
                return
            value = entry.iw
        if self._replace(prefix, value):
            with self._lock:
                current = self._entries.get(prefix)
                if current is not None:
                    current.installed = value
                    if current.iw != value:
                        self._updates.put(prefix)

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            stale = [p for p, e in self._entries.items() if now - e.updated > self.ttl_s]
            gone = [p for p in stale if self._entries.pop(p).installed]
        for prefix in gone:
            self._delete(prefix)

    def _nexthop(self, prefix: str) -> list[str]:
        """``via G dev D`` (or ``dev D``) of the main table's route to the prefix."""
        network = ipaddress.ip_network(prefix)
        family = "-4" if network.version == 4 else "-6"
        outcome = run_ip(["ip", family, "route", "get", str(network.network_address)])
        words = outcome.stdout.split()
        hop: list[str] = []
        for key in ("via", "dev"):
            if key in words and words.index(key) + 1 < len(words):
                hop += [key, words[words.index(key) + 1]]
        return hop

    def _replace(self, prefix: str, value: int) -> bool:
        if not self.apply_routes:
            return True
        hop = self._nexthop(prefix)
        family = "-6" if ":" in prefix else "-4"
        command = [
            "ip",
            family,
            "route",
            "replace",
            prefix,
            *hop,
            "table",
            str(self.table),
            "initcwnd",
            str(value),
            "initrwnd",
            str(self.initrwnd),
        ]
        outcome = run_ip(command)
        if outcome.returncode != 0:
            self.route_errors += 1
            log.warning("learned arm: %s failed: %s", " ".join(command), outcome.stderr.strip())
            return False
        return True

    def _delete(self, prefix: str) -> None:
        if not self.apply_routes:
            return
        family = "-6" if ":" in prefix else "-4"
        run_ip(["ip", family, "route", "del", prefix, "table", str(self.table)])


__all__ = ["LearnedWindows", "client_prefix", "window_to_learn"]
