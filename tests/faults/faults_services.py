"""Throwaway PostgreSQL and Redis servers for the fault suite.

The session's local PostgreSQL and Redis are shared by every test and every engineer, so a
suite that restarts them must bring its own: a cluster made with ``initdb`` (as the
``postgres`` user, PostgreSQL refuses root) under a temporary directory, and a
``redis-server`` child, each on a free loopback port.
"""

from __future__ import annotations

import glob
import os
import pathlib
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field

import psycopg


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _pg_bin(name: str) -> str:
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not candidates:
        raise RuntimeError(f"PostgreSQL's {name} not found (run make setup)")
    return candidates[-1]


def _as_postgres(argv: list[str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["runuser", "-u", "postgres", "--", *argv], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done


@dataclass
class ThrowawayPostgres:
    """A PostgreSQL cluster of its own under ``directory`` on ``port`` (trust auth, loopback only)."""

    directory: pathlib.Path
    port: int = field(default_factory=free_port)
    database: str = "iwscope_faults"

    @property
    def data_dir(self) -> pathlib.Path:
        return self.directory / "pgdata"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{self.database}"

    def start(self) -> None:
        uid = pwd.getpwnam("postgres").pw_uid
        if not (self.data_dir / "PG_VERSION").exists():
            self.directory.mkdir(parents=True, exist_ok=True)
            os.chown(self.directory, uid, -1)
            self.data_dir.mkdir(mode=0o700)
            os.chown(self.data_dir, uid, -1)
            _as_postgres([_pg_bin("initdb"), "-D", str(self.data_dir), "-U", "postgres", "--auth=trust",
                          "--encoding=UTF8", "--locale=C.UTF-8"])
            with open(self.data_dir / "postgresql.conf", "a", encoding="utf-8") as conf:
                conf.write(f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                           f"unix_socket_directories = '{self.directory}'\nmax_connections = 100\n"
                           "fsync = on\nsynchronous_commit = on\n")
            self._pg_ctl("start")
            with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{self.database}"')
        else:
            self._pg_ctl("start")

    def _pg_ctl(self, action: str, *extra: str) -> None:
        _as_postgres([_pg_bin("pg_ctl"), "-D", str(self.data_dir), "-l", str(self.directory / "postgres.log"),
                      "-w", "-t", "60", *extra, action])

    def crash_restart(self, down_s: float) -> None:
        """Stop like a crash (``-m immediate``: no checkpoint, WAL recovery at start), stay down, start."""
        self._pg_ctl("stop", "-m", "immediate")
        time.sleep(down_s)
        self._pg_ctl("start")

    def stop(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            try:
                self._pg_ctl("stop", "-m", "fast")
            except RuntimeError:
                pass
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class ThrowawayRedis:
    """A ``redis-server`` child with append-only persistence (like the local stack's) on ``port``."""

    directory: pathlib.Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "redis.log", "ab") as log:
            self.process = subprocess.Popen(
                [shutil.which("redis-server") or "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                 "--dir", str(self.directory), "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not _listening(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: {(self.directory / 'redis.log').read_text()[-1000:]}")
            time.sleep(0.05)

    def kill_restart(self, down_s: float) -> None:
        """SIGKILL (whatever was not yet fsynced to the append-only file is gone), stay down, start."""
        self.stop_hard()
        time.sleep(down_s)
        self.start()

    def stop_hard(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        self.stop_hard()
        shutil.rmtree(self.directory, ignore_errors=True)
