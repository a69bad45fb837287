"""Session fixtures shared by every part's tests (contract: docs/architecture.md "Tests").

* ``database_url``: a fresh database ``iwscope_test_<random>`` on the server of
  ``IWSCOPE_TEST_DATABASE_URL``, migrated to head once per session, dropped at the end.
* ``db_session``: a SQLAlchemy session inside a transaction rolled back after each test.
* ``redis_url``: ``IWSCOPE_TEST_REDIS_URL`` with a database index other than 0.
* ``celery_worker``: a real ``iwscope worker`` process on a queue unique to this session.
* ``api_server``: a real ``iwscope api`` (uvicorn) process on a free port, listening on
  127.0.0.1 and the lab's service address (where lab hosts reach it), never on every
  interface; with ``.url``, ``.port``, ``.stop()`` and ``.start()``.
* ``admin_token``, ``enroll_token``, ``origin_token``: created with ``iwscope token create``.
* ``client``: an HTTP client of ``api_server``; ``probe``, ``origin``: enrolled through it
  (``testkit.Enrolled``: id, credential, headers).

Helpers shared by several parts' tests are in ``testkit`` (API, wire records, waiting,
processes and ports) and ``testenv`` (where the services are, databases).
"""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import random
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from sqlalchemy import create_engine, pool
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from study_seed import SeededDatabase, seed_study
from testenv import create_database, drop_database, server_redis_url, temporary_database
from testkit import Enrolled, close_celery_client, enroll_origin, enroll_probe, free_port, stop_process

from iwscope_lab.service_address import ensure as ensure_service_address

REPO = pathlib.Path(__file__).resolve().parents[1]
IWSCOPE = [sys.executable, "-m", "iwscope.cli"]
#: Seconds to wait for a subprocess service to come up.
STARTUP_TIMEOUT_S = 60.0


@pytest.fixture(scope="session")
def test_id() -> str:
    """A random suffix naming this session's databases, queues and processes."""
    return secrets.token_hex(4)


@pytest.fixture(scope="session")
def database_url(test_id: str) -> Iterator[str]:
    """A fresh, migrated database for this session (dropped at the end)."""
    with temporary_database(f"iwscope_test_{test_id}", migrated=True) as url:
        yield url


@pytest.fixture(scope="session")
def db_engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(database_url, poolclass=pool.NullPool)
    yield engine
    engine.dispose()


@pytest.fixture
def db_session(db_engine: Engine) -> Iterator[Session]:
    """A session in a transaction that is rolled back after the test (commits become savepoints)."""
    connection = db_engine.connect()
    transaction = connection.begin()
    session = Session(bind=connection, join_transaction_mode="create_savepoint")
    try:
        yield session
    finally:
        session.close()
        if transaction.is_active:
            transaction.rollback()
        connection.close()


@pytest.fixture(scope="session")
def study_db(test_id: str) -> Iterator[SeededDatabase]:
    """A database of its own holding the seeded study (``study_seed``), roll-ups refreshed as the
    worker refreshes them: what the dashboard and the exports are checked on."""
    from iwscope.analysis import refresh_rollups

    name = f"iwscope_test_study_{test_id}"
    url = create_database(name, migrated=True)
    try:
        engine = create_engine(url, poolclass=pool.NullPool)
        try:
            with Session(engine) as session:
                summary = seed_study(session, dt.datetime.now(dt.UTC))
                session.commit()
            with Session(engine) as session:
                refresh_rollups(session)
                session.commit()
        finally:
            engine.dispose()
        yield SeededDatabase(url, summary)
    finally:
        drop_database(name)


@pytest.fixture(scope="session")
def study_session(study_db: SeededDatabase) -> Iterator[Session]:
    """A session on the seeded study, to compute what a figure, an export or the notebook must show."""
    engine = create_engine(study_db.url, poolclass=pool.NullPool)
    with Session(engine) as session:
        yield session
    engine.dispose()


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The test Redis with a database index other than 0 (0 belongs to the running stack)."""
    base = server_redis_url()
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, f"/{random.randint(1, 15)}", parts.query, parts.fragment))


@pytest.fixture(scope="session")
def celery_queue(test_id: str) -> str:
    return f"iwscope-test-{test_id}"


@pytest.fixture(scope="session")
def service_env(database_url: str, redis_url: str, celery_queue: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment of the subprocesses (API, worker, CLI) pointing at this session's services;
    the worker keeps an analysis copy (``pathcopy``) that the API and the dashboard read."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("IWSCOPE_ADMIN_TOKEN", "IWSCOPE_ENROLL_TOKEN", "IWSCOPE_ENV")
    }
    environment.update(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "IWSCOPE_CELERY_QUEUE": celery_queue,
            "IWSCOPE_DRAIN_SECONDS": "0.5",
            "IWSCOPE_LOG_LEVEL": "WARNING",
            "IWSCOPE_ENV": "development",
            "PYTHONUNBUFFERED": "1",
            "IWSCOPE_ANALYSIS_COPY_DIR": str(tmp_path_factory.mktemp("analysis-copy")),
        }
    )
    return environment


@dataclass
class CeleryWorker:
    """A running ``iwscope worker`` subprocess and a client app to talk to it."""

    process: subprocess.Popen[bytes]
    queue: str
    redis_url: str
    log_path: pathlib.Path

    def client(self):
        from celery import Celery

        app = Celery("iwscope-test-client", broker=self.redis_url, backend=self.redis_url)
        app.conf.update(task_default_queue=self.queue, broker_connection_retry_on_startup=True)
        return app

    def send(self, name: str, *args: object, timeout: float = 60.0) -> object:
        """Run task ``name`` on the worker and return its result.

        The result is polled from the backend (a GET per 0.1 s), not awaited on Redis pub/sub: a
        subscription that misses the worker's publication would wait out the whole timeout.  On a
        timeout the message carries the task's state and the worker log's tail.
        """
        app = self.client()
        try:
            task_id = app.send_task(name, args=list(args), queue=self.queue).id
            deadline = time.monotonic() + timeout
            while True:
                meta = app.backend.get_task_meta(task_id)
                if meta["status"] == "SUCCESS":
                    return meta["result"]
                if meta["status"] in ("FAILURE", "REVOKED"):
                    raise RuntimeError(f"task {name} {meta['status']}: {meta.get('traceback') or meta['result']}")
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"task {name} still {meta['status']} after {timeout} s; worker log tail:\n{self.log()[-3000:]}"
                    )
                time.sleep(0.1)
        finally:
            close_celery_client(app)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture(scope="session")
def celery_worker(
    service_env: dict[str, str], celery_queue: str, redis_url: str, test_id: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CeleryWorker]:
    """A real Celery worker (concurrency 1) on this session's queue; waits until it answers ping."""
    log_path = tmp_path_factory.mktemp("worker") / "worker.log"
    with open(log_path, "wb") as log:
        # INFO: a task that times out shows the worker's last received/succeeded lines in the message.
        process = subprocess.Popen(
            [*IWSCOPE, "worker", "--concurrency", "1"],
            env={**service_env, "IWSCOPE_LOG_LEVEL": "INFO"},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    worker = CeleryWorker(process, celery_queue, redis_url, log_path)
    app = worker.client()
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"worker exited with {process.returncode}:\n{worker.log()}")
            replies = app.control.ping(timeout=1.0) or []
            if any(name.startswith(f"iwscope-{celery_queue}-") for reply in replies for name in reply):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker did not answer ping within {STARTUP_TIMEOUT_S} s:\n{worker.log()}")
        yield worker
    finally:
        close_celery_client(app)
        stop_process(process)


@dataclass
class ApiServer:
    """A real ``iwscope api`` process on ``127.0.0.1:port`` and ``SERVICE_ADDRESS:port``;
    ``stop()``/``start()`` take it down and back."""

    env: dict[str, str]
    port: int
    log_path: pathlib.Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = field(default=0)
    #: ``iwscope api --workers``: API processes behind the one port.
    workers: int = 1

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        if self.running():
            return
        with open(self.log_path, "ab") as log:
            listen = [argument for host in ("127.0.0.1", ensure_service_address()) for argument in ("--host", host)]
            self.process = subprocess.Popen(
                [*IWSCOPE, "api", *listen, "--port", str(self.port), "--workers", str(self.workers)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        self.starts += 1
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"API exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"API not up within {STARTUP_TIMEOUT_S} s:\n{self.log()}")

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture(scope="session")
def _api_server_process(service_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    server = ApiServer(service_env, free_port(), tmp_path_factory.mktemp("api") / "api.log")
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def api_server(_api_server_process: ApiServer) -> ApiServer:
    """The session's API process, (re)started if a previous test stopped it."""
    _api_server_process.start()
    return _api_server_process


@pytest.fixture
def api_server_factory(
    service_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., ApiServer]]:
    """Start extra API processes with environment overrides (``factory(IWSCOPE_DRAIN_SECONDS="3")``),
    ``workers`` processes behind the port (``factory(workers=2)``)."""
    servers: list[ApiServer] = []

    def start(workers: int = 1, **overrides: str) -> ApiServer:
        server = ApiServer(
            {**service_env, **overrides}, free_port(), tmp_path_factory.mktemp("api-extra") / "api.log", workers=workers
        )
        servers.append(server)
        server.start()
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def unused_tcp_port() -> int:
    """A TCP port nothing listens on (at the time of the call)."""
    return free_port()


def _create_token(service_env: dict[str, str], kind: str) -> str:
    completed = subprocess.run(
        [*IWSCOPE, "token", "create", "--kind", kind, "--label", "pytest"],
        env=service_env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"iwscope token create failed: {completed.stderr}")
    return completed.stdout.strip()


@pytest.fixture(scope="session")
def admin_token(service_env: dict[str, str]) -> str:
    return _create_token(service_env, "admin")


@pytest.fixture(scope="session")
def enroll_token(service_env: dict[str, str]) -> str:
    return _create_token(service_env, "enroll")


@pytest.fixture(scope="session")
def origin_token(service_env: dict[str, str]) -> str:
    return _create_token(service_env, "origin")


@pytest.fixture
def client(api_server: ApiServer) -> Iterator[httpx.Client]:
    """An HTTP client of the session's API."""
    with httpx.Client(base_url=api_server.url, timeout=60.0) as session:
        yield session


@pytest.fixture
def probe(client: httpx.Client, enroll_token: str) -> Enrolled:
    return enroll_probe(client, enroll_token)


@pytest.fixture
def origin(client: httpx.Client, origin_token: str) -> Enrolled:
    return enroll_origin(client, origin_token)
