"""Throwaway PostgreSQL and Redis servers for the fault suite.

The session's local PostgreSQL and Redis are shared by every test and every engineer, so a
suite that restarts them must bring its own: the same server classes as the local stack
(``iwscope.localstack``: loopback only, passwords, not root), under a temporary directory
and on free loopback ports, with every commit durable (``synchronous_commit = on``) and a
Redis that is a child process, so a case can SIGKILL it.
"""

from __future__ import annotations

import secrets
import shutil
import socket
from dataclasses import dataclass, field

from iwscope.localstack import PostgresServer, RedisServer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ThrowawayPostgres(PostgresServer):
    """A cluster of its own under ``directory``, removed by :meth:`stop`."""

    port: int = field(default_factory=free_port)
    password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    database: str = "iwscope_faults"
    synchronous_commit: str = "on"

    def stop_immediately(self) -> None:
        """Stop like a crash and stay down (:meth:`start_again` brings it back)."""
        self._pg_ctl("stop", "-m", "immediate")

    def start_again(self) -> None:
        self._pg_ctl("start")

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class ThrowawayRedis(RedisServer):
    """A ``redis-server`` child with append-only persistence on a free port, removed by :meth:`stop`."""

    port: int = field(default_factory=free_port)
    password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    daemon: bool = False

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.directory, ignore_errors=True)


__all__ = ["ThrowawayPostgres", "ThrowawayRedis", "free_port"]
