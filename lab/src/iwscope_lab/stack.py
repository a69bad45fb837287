"""The collector stack a lab campaign reports to: API, Celery worker and beat, dashboard.

Started as child processes of the project's own ``iwscope`` command with the local
PostgreSQL and Redis (or ``DATABASE_URL`` / ``REDIS_URL`` when set).  A *detached* stack
(``make demo``) outlives the command that started it: its processes are recorded in
``.run/stack.json`` so a second run reuses it and ``iwscope lab stack stop`` ends it.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from iwscope.db import make_engine, session_scope
from iwscope.localstack import default_stack

from .service_address import DEFAULT_LISTEN, SERVICE_ADDRESS
from .service_address import ensure as ensure_service_address

#: Default ports of the lab's stack (chosen away from the usual 8000 / 8050).
API_PORT = 8700
DASHBOARD_PORT = 8750


class StackError(RuntimeError):
    """The stack's API answered with an error."""


@dataclass
class Stack:
    """A running collector stack."""

    database_url: str
    redis_url: str
    api_port: int = API_PORT
    dashboard_port: int | None = DASHBOARD_PORT
    run_dir: pathlib.Path = field(default_factory=lambda: default_stack().run_dir)
    #: Celery queue of this stack's API and worker (two stacks on one Redis stay apart).
    celery_queue: str = "iwscope"
    #: Addresses the API and the dashboard listen on: loopback and the lab's service address
    #: unless the user asks for more (``iwscope lab demo --expose``: every interface).
    listen: tuple[str, ...] = DEFAULT_LISTEN
    pids: dict[str, int] = field(default_factory=dict)
    #: Extra environment of the stack's processes (e.g. ``IWSCOPE_CELERY_QUEUE`` for a private queue).
    extra_env: dict[str, str] = field(default_factory=dict)
    _children: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: name -> argv of every process this stack started (so one can be restarted alone).
    _commands: dict[str, list[str]] = field(default_factory=dict)
    _detached: bool = False
    _sessionmaker: sessionmaker[Session] | None = None

    @property
    def local_api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def api_url_for(self, address: str = SERVICE_ADDRESS) -> str:
        """The API's URL as a lab host reaches it (the lab's service address, see service_address.py)."""
        return f"http://{address}:{self.api_port}"

    def api(self, method: str, path: str, body: dict[str, Any] | None = None, *, token: str | None = None) -> Any:
        """One JSON request to this stack's API (loopback); :class:`StackError` for an error status."""
        request = urllib.request.Request(
            self.local_api_url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                payload = response.read()
        except urllib.error.HTTPError as error:
            raise StackError(f"{method} {path}: HTTP {error.code}: {error.read()[:500]!r}") from error
        return json.loads(payload) if payload else None

    @property
    def dashboard_url(self) -> str | None:
        return None if self.dashboard_port is None else f"http://127.0.0.1:{self.dashboard_port}/"

    def session(self) -> contextlib.AbstractContextManager[Session]:
        """A database session on this stack's database (commits on success)."""
        if self._sessionmaker is None:
            self._sessionmaker = sessionmaker(bind=make_engine(self.database_url, pool_size=2), expire_on_commit=False)
        return session_scope(self._sessionmaker)

    def close_sessions(self) -> None:
        """Close this process's database connections (the stack's processes keep running)."""
        if self._sessionmaker is not None:
            engine = self._sessionmaker.kw["bind"]
            engine.dispose()
            self._sessionmaker = None

    @property
    def analysis_copy_dir(self) -> pathlib.Path:
        """Where the stack's worker keeps the analysis copy its API and dashboard read
        (``IWSCOPE_ANALYSIS_COPY_DIR`` when set; else one directory per database in the run dir)."""
        configured = self.extra_env.get("IWSCOPE_ANALYSIS_COPY_DIR") or os.environ.get("IWSCOPE_ANALYSIS_COPY_DIR")
        return (
            pathlib.Path(configured) if configured else self.run_dir / "analysis-copy" / str(make_url(self.database_url).database)
        )

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            **self.extra_env,
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            "IWSCOPE_ANALYSIS_COPY_DIR": str(self.analysis_copy_dir),
        }

    def activate(self) -> None:
        """Point this process's own database reads at the stack (the runner reads progress)."""
        os.environ["DATABASE_URL"] = self.database_url
        os.environ["REDIS_URL"] = self.redis_url

    # ----- lifecycle -----

    def start(self, *, detached: bool = False, beat: bool = True) -> Stack:
        """Migrate, then start API, worker, beat and (when installed) the dashboard."""
        from iwscope import migrate

        self.activate()
        migrate.upgrade(database_url=self.database_url)
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        iwscope = [sys.executable, "-m", "iwscope.cli"]
        if SERVICE_ADDRESS in self.listen:
            ensure_service_address()
        hosts = [argument for address in self.listen for argument in ("--host", address)]
        commands: dict[str, list[str]] = {
            "api": [*iwscope, "api", *hosts, "--port", str(self.api_port)],
            "worker": [*iwscope, "worker"],
        }
        if beat:
            commands["beat"] = [*iwscope, "beat"]
        if self.dashboard_port is not None and _dashboard_installed():
            commands["dashboard"] = [*iwscope, "dashboard", *hosts, "--port", str(self.dashboard_port)]
        else:
            self.dashboard_port = None
        self._detached = detached
        for name, argv in commands.items():
            self._commands[name] = argv
            self._spawn(name)
        try:
            _wait_http(self.local_api_url + "/readyz", "the API", timeout_s=60, log=logs / "api.log")
            if self.dashboard_url:
                _wait_http(self.dashboard_url, "the dashboard", timeout_s=90, log=logs / "dashboard.log")
        except BaseException:
            self.stop()
            raise
        if detached:  # holds the database and Redis URLs with their passwords: root only
            state = self._state_file()
            state.touch(mode=0o600)
            os.chmod(state, 0o600)
            state.write_text(json.dumps(self._describe(), indent=2))
        return self

    def _spawn(self, name: str) -> None:
        with open(self.run_dir / "logs" / f"{name}.log", "ab") as log:
            # Each process leads its own process group, so a kill reaches the worker's pool children too.
            child = subprocess.Popen(
                self._commands[name],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.run_dir,
            )
        self._children.append(child)
        self.pids[name] = child.pid

    def kill(self, name: str, signum: int = signal.SIGKILL) -> None:
        """Send ``signum`` to process ``name`` (``api``, ``worker``, ``beat``, ...) and its group; wait for it."""
        pid = self.pids[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signum)
        for child in self._children:
            if child.pid == pid:
                child.wait(timeout=30)
        self._children = [child for child in self._children if child.pid != pid]

    def restart(self, name: str) -> None:
        """Start process ``name`` again with the same command (after :meth:`kill`); waits for the API."""
        if name in self.pids and _alive(self.pids[name]):
            raise RuntimeError(f"{name} (pid {self.pids[name]}) is still running")
        self._spawn(name)
        if name == "api":
            _wait_http(self.local_api_url + "/readyz", "the API", timeout_s=60, log=self.run_dir / "logs" / "api.log")

    def stop(self) -> None:
        """Stop every process of the stack (SIGTERM, then SIGKILL after a grace period)."""
        self.close_sessions()
        pids = list(self.pids.values())
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for child in self._children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for pid in pids:
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            _signal(pid, signal.SIGKILL)
        recorded = self._state_file()
        try:
            if json.loads(recorded.read_text()).get("pids") == self.pids:
                recorded.unlink()  # only the record of *this* stack: another may share run_dir
        except (OSError, ValueError):
            pass
        self.pids.clear()
        self._children.clear()

    # ----- detached stacks -----

    @classmethod
    def attach(cls, run_dir: pathlib.Path | None = None) -> Stack | None:
        """The detached stack recorded in ``.run/stack.json`` if it is still serving."""
        run_dir = run_dir or default_stack().run_dir
        path = run_dir / "stack.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        stack = cls(
            database_url=data["database_url"],
            redis_url=data["redis_url"],
            api_port=data["api_port"],
            dashboard_port=data.get("dashboard_port"),
            celery_queue=data.get("celery_queue", "iwscope"),
            listen=tuple(data.get("listen", DEFAULT_LISTEN)),
            run_dir=run_dir,
            pids=data["pids"],
        )
        if all(_alive(pid) for pid in stack.pids.values()) and _http_ok(stack.local_api_url + "/readyz"):
            stack.activate()
            return stack
        stack.stop()
        return None

    def _state_file(self) -> pathlib.Path:
        return self.run_dir / "stack.json"

    def _describe(self) -> dict[str, Any]:
        return {
            "database_url": self.database_url,
            "redis_url": self.redis_url,
            "celery_queue": self.celery_queue,
            "api_port": self.api_port,
            "listen": list(self.listen),
            "dashboard_port": self.dashboard_port,
            "pids": self.pids,
        }


def local_stack(
    api_port: int = API_PORT,
    dashboard_port: int | None = DASHBOARD_PORT,
    *,
    database: str | None = None,
    redis_db: int = 0,
    celery_queue: str = "iwscope",
    listen: tuple[str, ...] = DEFAULT_LISTEN,
) -> Stack:
    """A stack on ``DATABASE_URL`` / ``REDIS_URL``, or on the local services (started if needed).

    ``database`` (created if missing), ``redis_db`` and ``celery_queue`` keep a second stack
    (e.g. the reproduction's) apart from the demo's on the same services.
    """
    database_url = os.environ.get("DATABASE_URL")
    redis_url = os.environ.get("REDIS_URL")
    if not database_url or not redis_url:
        services = default_stack()
        services.start()
        database_url = database_url or services.database_url
        redis_url = redis_url or services.redis_url.rsplit("/", 1)[0] + f"/{redis_db}"
    if database:
        database_url = _ensure_database(database_url, database)
    return Stack(
        database_url=database_url,
        redis_url=redis_url,
        api_port=api_port,
        dashboard_port=dashboard_port,
        celery_queue=celery_queue,
        listen=listen,
    )


def _ensure_database(database_url: str, name: str) -> str:
    """``database_url`` pointing at database ``name``, created on that server if missing."""
    import psycopg

    url = make_url(database_url)
    admin = url.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as connection:
        if connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            connection.execute(f'CREATE DATABASE "{name}"')
    return url.set(database=name).render_as_string(hide_password=False)


def _dashboard_installed() -> bool:
    try:
        import iwscope_dashboard.cli  # noqa: F401
    except ImportError:
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child is not alive
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            status: int = response.status  # typeshed types urlopen's result as Any
            return 200 <= status < 300
    except (urllib.error.URLError, OSError):
        return False


def _wait_http(url: str, what: str, timeout_s: float, log: pathlib.Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not _http_ok(url):
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{what} did not become ready at {url} within {timeout_s:.0f} s; log tail:\n{tail}")
        time.sleep(0.3)
