"""The daemons' stop: SIGTERM and SIGINT set one event that every loop waits on."""

from __future__ import annotations

import signal
import threading


def stop_event() -> threading.Event:
    """An event set by SIGTERM or SIGINT (handlers installed in the calling, main, thread)."""
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop
