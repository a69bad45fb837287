"""Credential-cache invalidation: PostgreSQL tells every API process when a credential changes.

Migration ``0008`` notifies channel :data:`CHANNEL` whenever a probe's or origin's (and, since
``0013_passive``, a server's) ``secret_hash``, ``revoked_at``, name or region is updated, or the
row deleted -- whoever changes it (the API, the CLI, plain SQL).  Each API process listens on
one connection of its own (:class:`CredentialListener`, a thread) and empties its credential caches on every
notification.  While it listens, verified credentials are remembered for
``IWSCOPE_CREDENTIAL_CACHE_NOTIFIED_S`` (300 s): a probe's ~60 s cycle costs one lookup in
five minutes instead of one per request, and a revocation still takes effect at once.  While
it does not (starting, connection lost), the caches are emptied and entries live only
``IWSCOPE_CREDENTIAL_CACHE_S`` (5 s), as before notifications existed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

import psycopg
from sqlalchemy.engine import Engine

from iwscope.db import dedicated_connection

log = logging.getLogger(__name__)

#: The notification channel of migration 0008's trigger (payload ``<table>:<id>``).
CHANNEL = "iwscope_credentials"
#: Pause before reconnecting after the listening connection failed.
RECONNECT_S = 1.0


def listener_name(pid: int | None = None) -> str:
    """``application_name`` of a process's listening connection (as ``iwscope[<pid>]`` names its
    pool's), so ``pg_stat_activity`` tells whose it is."""
    return f"iwscope-credential-listener[{os.getpid() if pid is None else pid}]"


class CredentialListener:
    """Calls ``on_change`` with the payload of every credential notification (``<table>:<id>``),
    and with ``None`` whenever it starts or stops listening (what was cached meanwhile may be
    stale).  ``listening`` says whether changes are being heard right now."""

    def __init__(self, engine: Engine, on_change: Callable[[str | None], None]) -> None:
        self._engine = engine
        self._on_change = on_change
        self._stopping = threading.Event()
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="credential-listener", daemon=True)
        self._thread.start()

    def wait_listening(self, timeout_s: float) -> bool:
        """Block until listening (True) or ``timeout_s`` passed (False: the short cache applies)."""
        return self._listening.wait(timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _connect(self) -> psycopg.Connection:
        """A connection of its own (not one of the pool's: it is held for the process's life)."""
        # TCP keepalives (and a user timeout) so that a peer gone silently -- no FIN, no RST --
        # is noticed in ~30 s rather than never: an idle listener sends nothing by itself.
        return dedicated_connection(
            self._engine,
            listener_name(),
            autocommit=True,
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=5,
            keepalives_count=3,
            tcp_user_timeout=30_000,
        )

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                with self._connect() as connection:
                    connection.execute(f"LISTEN {CHANNEL}")
                    self._listening.set()
                    self._on_change(None)  # entries cached before LISTEN took effect might be stale
                    log.info("listening to credential changes")
                    while not self._stopping.is_set():
                        # a lost connection raises here (the backend's end closes the socket)
                        for notify in connection.notifies(timeout=1.0):
                            log.debug("credential changed: %s", notify.payload)
                            self._on_change(notify.payload)
            except Exception:  # any failure: stop trusting the long cache, retry
                if not self._stopping.is_set():
                    log.warning("credential listener lost its connection; retrying", exc_info=True)
            finally:
                self._listening.clear()
                self._on_change(None)
            self._stopping.wait(RECONNECT_S)
