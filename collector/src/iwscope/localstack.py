"""A local PostgreSQL and Redis from the system binaries, with data under ``.run/``.

Used by ``iwscope up`` / ``iwscope services`` for a one-machine stack and by ``make test``.
Production points ``DATABASE_URL`` and ``REDIS_URL`` at managed services instead.
PostgreSQL refuses to run as root, so the cluster belongs to the ``postgres`` system user
that Debian's package creates.
"""

from __future__ import annotations

import glob
import os
import pathlib
import pwd
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass

#: Ports of the local services (chosen away from the system defaults 5432 / 6379).
PG_PORT = int(os.environ.get("IWSCOPE_LOCAL_PG_PORT", "54329"))
REDIS_PORT = int(os.environ.get("IWSCOPE_LOCAL_REDIS_PORT", "63799"))
PG_DATABASE = "iwscope"
PG_USER = "postgres"


@dataclass(frozen=True)
class LocalStack:
    """Where the local services keep their data and how to reach them."""

    run_dir: pathlib.Path

    @property
    def pg_dir(self) -> pathlib.Path:
        return self.run_dir / "postgres"

    @property
    def redis_dir(self) -> pathlib.Path:
        return self.run_dir / "redis"

    @property
    def database_url(self) -> str:
        return f"postgresql+psycopg://{PG_USER}@127.0.0.1:{PG_PORT}/{PG_DATABASE}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{REDIS_PORT}/0"

    def start(self) -> None:
        """Start PostgreSQL and Redis unless already listening (idempotent)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not _listening(PG_PORT):
            self._start_postgres()
        if not _listening(REDIS_PORT):
            self._start_redis()
        _wait_listening(PG_PORT, "PostgreSQL")
        _wait_listening(REDIS_PORT, "Redis")
        self._ensure_database()

    def stop(self) -> None:
        """Stop both services if they run from this stack's directories."""
        if (self.pg_dir / "postmaster.pid").exists():
            _as_postgres([_pg_bin("pg_ctl"), "-D", str(self.pg_dir), "-m", "fast", "-w", "stop"], check=False)
        if _listening(REDIS_PORT):
            subprocess.run(
                [_which("redis-cli"), "-p", str(REDIS_PORT), "shutdown", "nosave"],
                check=False, capture_output=True,
            )

    def _start_postgres(self) -> None:
        postgres_uid = pwd.getpwnam(PG_USER).pw_uid
        if not (self.pg_dir / "PG_VERSION").exists():
            self.pg_dir.mkdir(parents=True, exist_ok=True)
            os.chown(self.pg_dir, postgres_uid, -1)
            os.chmod(self.pg_dir, 0o700)
            _as_postgres([_pg_bin("initdb"), "-D", str(self.pg_dir), "-U", PG_USER,
                          "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8"])
            with open(self.pg_dir / "postgresql.conf", "a", encoding="utf-8") as conf:
                conf.write(
                    "\n# iwscope local stack\n"
                    f"port = {PG_PORT}\nlisten_addresses = '*'\n"
                    "unix_socket_directories = '/tmp'\n"
                    "max_connections = 200\nshared_buffers = 512MB\n"
                    "fsync = on\nsynchronous_commit = off\n"
                    "max_wal_size = 4GB\n"
                )
            with open(self.pg_dir / "pg_hba.conf", "a", encoding="utf-8") as hba:
                # The lab's namespaces reach the stack over private addresses.
                hba.write("host all all 0.0.0.0/0 trust\n")
        log = self.run_dir / "postgres.log"
        log.touch()
        os.chown(log, postgres_uid, -1)
        _as_postgres([_pg_bin("pg_ctl"), "-D", str(self.pg_dir), "-l", str(log), "-w", "start"])

    def _start_redis(self) -> None:
        self.redis_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [_which("redis-server"), "--port", str(REDIS_PORT), "--bind", "0.0.0.0",
             "--protected-mode", "no", "--daemonize", "yes", "--dir", str(self.redis_dir),
             "--appendonly", "yes", "--logfile", str(self.run_dir / "redis.log"),
             "--pidfile", str(self.run_dir / "redis.pid")],
            check=True,
        )

    def _ensure_database(self) -> None:
        psql = [_pg_bin("psql"), "-h", "127.0.0.1", "-p", str(PG_PORT), "-U", PG_USER, "-d", "postgres", "-tAc"]
        exists = subprocess.run(psql + [f"SELECT 1 FROM pg_database WHERE datname='{PG_DATABASE}'"],
                                check=True, capture_output=True, text=True).stdout.strip()
        if exists != "1":
            subprocess.run(psql + [f"CREATE DATABASE {PG_DATABASE}"], check=True, capture_output=True)


def default_stack() -> LocalStack:
    """The stack under ``$IWSCOPE_RUN_DIR`` or ``<repository>/.run``."""
    run_dir = os.environ.get("IWSCOPE_RUN_DIR")
    if run_dir:
        return LocalStack(pathlib.Path(run_dir).resolve())
    return LocalStack(pathlib.Path(__file__).resolve().parents[3] / ".run")


def _pg_bin(name: str) -> str:
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if candidates:
        return candidates[-1]
    return _which(name)


def _which(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found: run `make setup` (installs postgresql and redis-server)")
    return found


def _as_postgres(argv: list[str], check: bool = True) -> None:
    subprocess.run(["runuser", "-u", PG_USER, "--", *argv], check=check, capture_output=True)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait_listening(port: int, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not _listening(port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start listening on port {port}")
        time.sleep(0.1)
