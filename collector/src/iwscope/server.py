"""The server pieces both ways of running the API use: one process (:func:`iwscope.api.serve`)
and several (:mod:`iwscope.supervisor`).  They live apart from the app so that neither of those
two imports the other: ``api`` -> ``supervisor`` -> ``server``, one way."""

from __future__ import annotations

import gc
import logging
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from types import FrameType

import uvicorn

from iwscope.health import DRAINING

log = logging.getLogger(__name__)

#: The cyclic collector's youngest-generation threshold in a serving API process (CPython's
#: default: 700 allocations).  A request's objects die by reference count; at 700 the collector
#: still took 8.2 % of the API's CPU at the fleet's shape under ``perf``, and no sample in 30 s
#: with this threshold and start-up frozen (docs/ingest-throughput.md, 2026-12-02).
GC_YOUNG_THRESHOLD = 20_000


def settle_garbage_collector() -> None:
    """Once the app is up: what start-up built is frozen (never traversed again) and young
    collections run every :data:`GC_YOUNG_THRESHOLD` allocations; the older generations keep
    CPython's ratios."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


class LameDuckServer(uvicorn.Server):
    """On the first SIGTERM, report not-ready for ``drain_seconds`` before shutting down.

    ``on_started`` is called once the server listens (the supervisor tells a worker that died
    starting up from one that died later by it)."""

    def __init__(self, config: uvicorn.Config, drain_seconds: float, on_started: Callable[[], object] | None = None) -> None:
        super().__init__(config)
        self.drain_seconds = drain_seconds
        self.on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            settle_garbage_collector()
        if self.started and self.on_started is not None:
            self.on_started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self.drain_seconds > 0 and not DRAINING.is_set():
            DRAINING.set()
            log.info("SIGTERM: draining for %.1f s (readyz answers 503)", self.drain_seconds)
            timer = threading.Timer(self.drain_seconds, super().handle_exit, args=(sig, frame))
            timer.daemon = True
            timer.start()
            return
        super().handle_exit(sig, frame)


def listening_sockets(hosts: Sequence[str], port: int) -> list[socket.socket]:
    """One bound, listening TCP socket per address in ``hosts`` (IPv4 or IPv6 literals).

    The API listens only where it is told: loopback by default, plus e.g. the lab's service
    address; ``0.0.0.0`` / ``::`` (every interface) only when given explicitly.
    """
    sockets: list[socket.socket] = []
    try:
        for host in dict.fromkeys(hosts):
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            listener = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(listener)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            listener.bind((host, port))
            listener.listen(2048)
            listener.set_inheritable(True)
    except OSError:
        for listener in sockets:
            listener.close()
        raise
    return sockets
