"""A local PostgreSQL and Redis from the system binaries, safe on a networked machine.

Used by ``iwscope services`` / ``iwscope up`` for a one-machine stack, by ``make test`` and
(with throwaway directories and ports) by the fault suite.  Production points ``DATABASE_URL``
and ``REDIS_URL`` at managed services instead.

What "safe" means here (docs/security.md "Local stack"):

* both listen on loopback only (nothing in the lab's namespaces talks to them: lab hosts
  reach the API, never the database or the broker);
* both require a password: a secret generated per checkout into ``.run/services.json``
  (mode 0600, root's); PostgreSQL with ``scram-sha-256``, Redis with ``requirepass`` and
  protected mode on;
* neither runs as root: PostgreSQL as the ``postgres`` user of Debian's package, Redis as
  the ``redis`` user of Debian's package; the application connects as ``iwscope``, a role
  that may create databases but is not a superuser (a superuser can run programs on the
  server with ``COPY ... TO PROGRAM``); the ``postgres`` superuser has no password and is
  reachable only over the cluster's own Unix socket (peer authentication);
* their data lives under ``/var/lib/iwscope/<checkout>/`` (``$IWSCOPE_SERVICES_DIR``), not
  in the checkout: a checkout under a 0700 home directory is unreachable for the service
  users, and Debian creates home directories 0700.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import pathlib
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

from iwscope import config

#: Ports of the local services (chosen away from the system defaults 5432 / 6379).
PG_PORT = int(os.environ.get("IWSCOPE_LOCAL_PG_PORT", "54329"))
REDIS_PORT = int(os.environ.get("IWSCOPE_LOCAL_REDIS_PORT", "63799"))
PG_DATABASE = "iwscope"
#: The application's role: LOGIN, CREATEDB (tests and the reproduction make databases), no superuser.
PG_USER = "iwscope"
#: Where the services' data directories go, one sub-directory per checkout.
SERVICES_ROOT = pathlib.Path(os.environ.get("IWSCOPE_SERVICES_DIR", "/var/lib/iwscope"))
LOOPBACK = "127.0.0.1"


class ServiceError(RuntimeError):
    """A local service could not be started or reached; the message says why."""


# ---- one PostgreSQL cluster -----------------------------------------------------------------


@dataclass
class PostgresServer:
    """A PostgreSQL cluster under ``directory`` on ``127.0.0.1:port``, run by the ``postgres`` user.

    ``directory`` must be reachable by that user (every parent searchable); it holds the data
    directory (``pgdata``, also the Unix socket's home) and the log.
    """

    directory: pathlib.Path
    port: int
    password: str
    database: str = PG_DATABASE
    user: str = PG_USER
    #: ``synchronous_commit``: ``off`` for the dev stack (speed), ``on`` where a crash must lose nothing.
    synchronous_commit: str = "off"
    extra_conf: str = ""

    @property
    def data_dir(self) -> pathlib.Path:
        return self.directory / "pgdata"

    @property
    def log_path(self) -> pathlib.Path:
        return self.directory / "postgres.log"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{self.user}:{quote(self.password, safe='')}@{LOOPBACK}:{self.port}/{self.database}"

    def running(self) -> bool:
        """Whether this cluster's postmaster runs (by its pid file, not by the port)."""
        return _pid_alive(self.data_dir / "postmaster.pid")

    def start(self) -> None:
        """Create the cluster if needed, start it, and make the role and database (idempotent)."""
        owner = pwd.getpwnam("postgres")
        if self.running():
            _require_same_port(self.port, "PostgreSQL", "IWSCOPE_LOCAL_PG_PORT", self.directory)
        if not (self.data_dir / "PG_VERSION").exists():
            self._init(owner)
        self._write_config()
        if not self.running():
            _require_free(self.port, "PostgreSQL", self.directory)
            if not self.log_path.exists():
                self.log_path.touch(mode=0o600)
            os.chown(self.log_path, owner.pw_uid, owner.pw_gid)
            self._pg_ctl("start")
        self._ensure_role_and_database()

    def _init(self, owner: pwd.struct_passwd) -> None:
        _make_dir(self.directory, 0o755)
        _make_dir(self.data_dir, 0o700, owner)
        _run_as(
            owner,
            [
                _pg_bin("initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "--auth-local=peer",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
            ],
        )

    def _write_config(self) -> None:
        """Rewrite iwscope's settings each start, so an older, looser configuration cannot survive."""
        owner = pwd.getpwnam("postgres")
        conf = self.data_dir / "iwscope.conf"
        conf.write_text(
            "# Written by iwscope at every start (collector/src/iwscope/localstack.py).\n"
            f"port = {self.port}\n"
            f"listen_addresses = '{LOOPBACK}'\n"
            f"unix_socket_directories = '{self.data_dir}'\n"
            "unix_socket_permissions = 0700\n"
            "password_encryption = 'scram-sha-256'\n"
            "max_connections = 200\n"
            "shared_buffers = 512MB\n"
            "fsync = on\n"
            f"synchronous_commit = {self.synchronous_commit}\n"
            "max_wal_size = 4GB\n" + self.extra_conf
        )
        os.chown(conf, owner.pw_uid, owner.pw_gid)
        main_conf = self.data_dir / "postgresql.conf"
        if "include_if_exists = 'iwscope.conf'" not in main_conf.read_text():
            with open(main_conf, "a", encoding="utf-8") as handle:
                handle.write("\ninclude_if_exists = 'iwscope.conf'\n")
        hba = self.data_dir / "pg_hba.conf"
        hba.write_text(
            "# Written by iwscope at every start: the superuser only over the cluster's own socket,\n"
            "# everyone else with a password over loopback.\n"
            "local all postgres peer\n"
            f"host all all {LOOPBACK}/32 scram-sha-256\n"
        )
        os.chown(hba, owner.pw_uid, owner.pw_gid)
        os.chmod(hba, 0o600)

    def _pg_ctl(self, action: str, *extra: str) -> None:
        _run_as(
            pwd.getpwnam("postgres"),
            [_pg_bin("pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_path), "-w", "-t", "60", *extra, action],
        )

    def _psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` as the superuser over the Unix socket; returns unaligned tuples."""
        done = _run_as(
            pwd.getpwnam("postgres"),
            [
                _pg_bin("psql"),
                "-h",
                str(self.data_dir),
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                database,
                "-v",
                "ON_ERROR_STOP=1",
                "-tAc",
                sql,
            ],
        )
        return done.stdout.strip()

    def _ensure_role_and_database(self) -> None:
        literal = "'" + self.password.replace("'", "''") + "'"
        if self._psql(f"SELECT 1 FROM pg_roles WHERE rolname = '{self.user}'") != "1":
            self._psql(f'CREATE ROLE "{self.user}" LOGIN CREATEDB PASSWORD {literal}')
        else:  # the secret may have been regenerated
            self._psql(f'ALTER ROLE "{self.user}" LOGIN CREATEDB NOSUPERUSER PASSWORD {literal}')
        if self._psql(f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'") != "1":
            self._psql(f'CREATE DATABASE "{self.database}" OWNER "{self.user}"')

    def reload(self) -> None:
        self._pg_ctl("reload")

    def crash_restart(self, down_s: float) -> None:
        """Stop like a crash (``-m immediate``: no checkpoint, WAL recovery at start), stay down, start."""
        self._pg_ctl("stop", "-m", "immediate")
        time.sleep(down_s)
        self._pg_ctl("start")

    def stop(self) -> None:
        if self.running():
            with contextlib.suppress(ServiceError):
                self._pg_ctl("stop", "-m", "fast")


# ---- one Redis server -----------------------------------------------------------------------


@dataclass
class RedisServer:
    """A ``redis-server`` on ``127.0.0.1:port`` with a password, run by the ``redis`` user.

    ``daemon=True`` (the dev stack) lets it outlive the command that started it; otherwise it
    is a child process (the fault suite SIGKILLs it).
    """

    directory: pathlib.Path
    port: int
    password: str
    daemon: bool = True
    appendfsync: str = "everysec"
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://:{quote(self.password, safe='')}@{LOOPBACK}:{self.port}/0"

    @property
    def pid_path(self) -> pathlib.Path:
        return self.directory / "redis.pid"

    def running(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return _pid_alive(self.pid_path)

    def start(self) -> None:
        if self.running():  # before redis.conf is rewritten with this start's port
            _require_same_port(self.port, "Redis", "IWSCOPE_LOCAL_REDIS_PORT", self.directory)
        owner = _redis_user()
        _make_dir(self.directory, 0o700, owner)
        conf = self.directory / "redis.conf"
        # In a file readable by the redis user only: a --requirepass argument would show in ps.
        conf.write_text(
            "# Written by iwscope at every start (collector/src/iwscope/localstack.py).\n"
            f"port {self.port}\n"
            f"bind {LOOPBACK} -::1\n"
            "protected-mode yes\n"
            f"requirepass {self.password}\n"
            "enable-protected-configs no\nenable-debug-command no\nenable-module-command no\n"
            f"dir {self.directory}\n"
            f"daemonize {'yes' if self.daemon else 'no'}\n"
            f"pidfile {self.pid_path}\n"
            f"logfile {self.directory / 'redis.log'}\n"
            f"appendonly yes\nappendfsync {self.appendfsync}\n"
        )
        os.chown(conf, owner.pw_uid, owner.pw_gid)
        os.chmod(conf, 0o600)
        if self.running():
            return
        _require_free(self.port, "Redis", self.directory)
        argv = [_which("redis-server"), str(conf)]
        if self.daemon:
            _run_as(owner, argv)
        else:
            self.process = subprocess.Popen(
                argv,
                user=owner.pw_uid,
                group=owner.pw_gid,
                extra_groups=[],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
            )
        _wait_listening(
            self.port,
            "Redis",
            log=self.directory / "redis.log",
            alive=lambda: self.process is None or self.process.poll() is None,
        )

    def kill_restart(self, down_s: float) -> None:
        """SIGKILL (whatever was not yet fsynced to the append-only file is gone), stay down, start."""
        self.kill()
        time.sleep(down_s)
        self.start()

    def kill(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGKILL)
                self.process.wait(timeout=10)
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.kill()
            return
        if _pid_alive(self.pid_path):
            subprocess.run(
                [_which("redis-cli"), "-h", LOOPBACK, "-p", str(self.port), "shutdown", "nosave"],
                check=False,
                capture_output=True,
                env={**os.environ, "REDISCLI_AUTH": self.password},
            )


# ---- the checkout's stack -------------------------------------------------------------------


@dataclass(frozen=True)
class LocalStack:
    """The local services of one checkout: secrets under ``run_dir``, data under ``data_dir``."""

    run_dir: pathlib.Path
    data_dir: pathlib.Path

    @property
    def secrets_path(self) -> pathlib.Path:
        return self.run_dir / "services.json"

    def _secrets(self, create: bool) -> dict[str, str]:
        try:
            return dict(json.loads(self.secrets_path.read_text()))
        except FileNotFoundError:
            if not create:
                return {"postgres_password": "", "redis_password": ""}
        values = {"postgres_password": secrets.token_urlsafe(24), "redis_password": secrets.token_urlsafe(24)}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.secrets_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump(values, handle)
        return values

    def postgres(self, create_secrets: bool = False) -> PostgresServer:
        return PostgresServer(self.data_dir / "postgres", PG_PORT, self._secrets(create_secrets)["postgres_password"])

    def redis(self, create_secrets: bool = False) -> RedisServer:
        return RedisServer(self.data_dir / "redis", REDIS_PORT, self._secrets(create_secrets)["redis_password"])

    @property
    def database_url(self) -> str:
        return self.postgres().url

    @property
    def redis_url(self) -> str:
        return self.redis().url

    def start(self) -> None:
        """Start PostgreSQL and Redis unless they already run from this stack (idempotent)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _make_dir(self.data_dir.parent, 0o755)
        _make_dir(self.data_dir, 0o755)
        (self.data_dir / "checkout").write_text(str(self.run_dir.parent) + "\n")
        self.postgres(create_secrets=True).start()
        self.redis(create_secrets=True).start()

    def stop(self) -> None:
        """Stop both services if they run from this stack's directories."""
        self.postgres().stop()
        self.redis().stop()


def default_stack() -> LocalStack:
    """The stack of this checkout: ``$IWSCOPE_RUN_DIR`` or ``<repository>/.run`` for its secrets,
    ``$IWSCOPE_SERVICES_DIR/<checkout name>-<hash of its path>`` for its data."""
    configured = os.environ.get("IWSCOPE_RUN_DIR")
    run_dir = (pathlib.Path(configured) if configured else pathlib.Path(__file__).resolve().parents[3] / ".run").resolve()
    digest = hashlib.sha256(str(run_dir).encode()).hexdigest()[:10]
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in run_dir.parent.name)[:32] or "root"
    return LocalStack(run_dir, SERVICES_ROOT / f"{name}-{digest}")


def _development_urls() -> tuple[str, str]:
    stack = default_stack()
    return stack.database_url, stack.redis_url


# Development settings that leave DATABASE_URL / REDIS_URL unset use this checkout's stack
# (the settings do not import this module: production never loads it).
config.use_development_urls(_development_urls)


# ---- helpers --------------------------------------------------------------------------------


def _pg_bin(name: str) -> str:
    candidates = sorted(
        glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
        key=lambda path: int(path.split("/")[4]) if path.split("/")[4].isdigit() else 0,
    )
    if candidates:
        return candidates[-1]
    return _which(name)


def _which(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise ServiceError(f"{name} not found: run `make setup` (installs postgresql and redis-server)")
    return found


def _redis_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("redis")
    except KeyError:
        raise ServiceError("no 'redis' user: install Debian's redis-server package (make setup)") from None


def _make_dir(path: pathlib.Path, mode: int, owner: pwd.struct_passwd | None = None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if owner is not None:
        os.chown(path, owner.pw_uid, owner.pw_gid)
    os.chmod(path, mode)


def _run_as(owner: pwd.struct_passwd, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``owner`` (PostgreSQL refuses root; Redis need not be root)."""
    done = subprocess.run(
        argv,
        user=owner.pw_uid,
        group=owner.pw_gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        cwd="/",
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": owner.pw_dir},
        timeout=180,
    )
    if done.returncode != 0:
        raise ServiceError(f"`{' '.join(argv)}` failed: {(done.stderr or done.stdout).strip()[-2000:]}")
    return done


def _pid_alive(pid_file: pathlib.Path) -> bool:
    try:
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((LOOPBACK, port)) == 0


def _require_free(port: int, what: str, directory: pathlib.Path) -> None:
    if _listening(port):
        raise ServiceError(
            f"port {port} is taken by a {what} that is not this stack's ({directory}): stop it "
            f"(an older iwscope stack? `iwscope services stop` from its checkout) or choose "
            f"another port with IWSCOPE_LOCAL_PG_PORT / IWSCOPE_LOCAL_REDIS_PORT"
        )


def _require_same_port(port: int, what: str, variable: str, directory: pathlib.Path) -> None:
    """This stack's service runs (its pid file says so) but not on ``port``: it was started with
    another ``variable`` (a second stack of the same checkout shares its data directory).
    Saying "running" would hand out a URL nothing answers on."""
    if not _listening(port):
        raise ServiceError(
            f"this checkout's {what} ({directory}) runs, but not on port {port}: it was started with "
            f"another {variable}; stop it with that {variable} set (`iwscope services stop`), then start again"
        )


def _wait_listening(port: int, what: str, log: pathlib.Path, alive: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not _listening(port):
        if time.monotonic() > deadline or not alive():
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise ServiceError(f"{what} did not start listening on port {port}:\n{tail}")
        time.sleep(0.05)
