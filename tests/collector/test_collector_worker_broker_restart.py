"""The worker keeps working after Redis is SIGKILLed and restarted while it holds a task.

Real processes only: a ``redis-server`` of the test's own (append-only file, free port), a
real ``iwscope worker`` (concurrency 2, as deployed) on it, the session's database. A task is
held in flight by a table lock in PostgreSQL: the worker has taken it and not acknowledged
it (late acks: it sits in Redis' ``unacked`` hash), and with a second pool slot free the
worker is waiting in ``BRPOP`` for more -- the state in which kombu 5.7 closed the lost
connection's channel twice and stopped the worker ("Unrecoverable error: AttributeError:
'NoneType' object has no attribute 'hostname'", docs/reliability.md, ``redis`` row).

* With ``iwscope.broker``'s fix the worker reconnects by itself and runs the next task.
* Without it (kombu as shipped; a ``sitecustomize`` makes ``iwscope.broker.install`` a no-op)
  the worker must at least *exit non-zero* so a supervisor restarts it -- ``iwscope worker``
  used to exit 0 there -- and the restarted worker runs the next task.
"""

from __future__ import annotations

import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import redis
from celery import Celery
from testkit import close_celery_client, free_port, wait_for

from iwscope.localstack import RedisServer

REPO = pathlib.Path(__file__).resolve().parents[2]
IWSCOPE = [sys.executable, "-m", "iwscope.cli"]
#: The task held in flight (it reads origin_observations, which the test locks) ...
BLOCKED_TASK = "iwscope.trials.tasks.sweep"
#: ... and the one sent after the restart (idempotent, touches no locked table).
PROBE_TASK = "iwscope.trials.tasks.ensure_partitions"
REDIS_DOWN_S = 2.0
#: Celery retries the broker after 2 s, then 4 s, ...: a few attempts fit easily.
RECOVERY_TIMEOUT_S = 30.0
STARTUP_TIMEOUT_S = 60.0


@dataclass
class Broker(RedisServer):
    """A ``redis-server`` child (the local stack's kind: loopback, password, not root) with an
    append-only file, on a free port; SIGKILLed by :meth:`kill`."""

    daemon: bool = False

    def unacked(self) -> int:
        client = redis.Redis.from_url(self.url)
        try:
            return int(client.hlen("unacked"))
        finally:
            client.close()


@pytest.fixture
def broker() -> Iterator[Broker]:
    # Not under pytest's tmp_path: that is root's 0700 directory, which the redis user cannot enter.
    directory = pathlib.Path(f"/tmp/iwt-broker-{secrets.token_hex(4)}")
    server = Broker(directory, free_port(), secrets.token_urlsafe(18))
    server.start()
    try:
        yield server
    finally:
        server.kill()
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class Worker:
    env: dict[str, str]
    queue: str
    log_path: pathlib.Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            # Its own process group: the stop reaches the pool children too.
            self.process = subprocess.Popen(
                [*IWSCOPE, "worker", "--concurrency", "2"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=REPO,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


@contextmanager
def _client(url: str, queue: str) -> Iterator[Celery]:
    """A client app on ``url``; closed with its result backend's Redis connections (no leaked sockets)."""
    app = Celery("iwscope-test-broker-restart", broker=url, backend=url)
    app.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=True)
    try:
        yield app
    finally:
        close_celery_client(app)


def _wait(predicate: Callable[[], Any], timeout: float, what: str, worker: Worker) -> Any:
    return wait_for(predicate, timeout, 0.05, what, detail=lambda: f"worker log:\n{worker.log()[-6000:]}")


def _wait_ready(worker: Worker, url: str) -> None:
    with _client(url, worker.queue) as app:

        def answers() -> bool:
            assert worker.process is not None and worker.process.poll() is None, (
                f"worker exited with {worker.process.returncode}:\n{worker.log()[-6000:]}"
            )
            replies = app.control.ping(timeout=1.0) or []
            return any(name.startswith(f"iwscope-{worker.queue}-") for reply in replies for name in reply)

        _wait(answers, STARTUP_TIMEOUT_S, "the worker answering ping", worker)


@contextmanager
def _table_locked(database_url: str, table: str) -> Iterator[None]:
    """Hold an ACCESS EXCLUSIVE lock on ``table``: a task reading it waits until the block ends."""
    with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://", 1)) as connection:
        connection.execute("SET lock_timeout = '10s'")
        connection.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            connection.rollback()


def _restart_redis_with_a_task_in_flight(broker: Broker, worker: Worker, database_url: str) -> int:
    """SIGKILL Redis while the worker holds a task it has not acknowledged; restart it. Returns the count held."""
    with _table_locked(database_url, "origin_observations"):
        with _client(broker.url, worker.queue) as app:
            app.send_task(BLOCKED_TASK, queue=worker.queue)
        in_flight = _wait(broker.unacked, 20, "the task taken (unacked)", worker)
        time.sleep(0.5)  # the consumer is back in BRPOP for its free pool slot
        broker.kill()
        time.sleep(REDIS_DOWN_S)
        broker.start()
    return int(in_flight)


def _next_task_runs(broker: Broker, worker: Worker, timeout: float = RECOVERY_TIMEOUT_S) -> float:
    """Send a new task after the restart; seconds until its result came back.

    (Not ``control.ping``: its client reuses kombu's process-wide connection pool for this
    URL, whose BRPOP connection died with the old Redis; ``send_task`` retries.)
    """
    started = time.monotonic()
    with _client(broker.url, worker.queue) as app:
        try:
            partitions = app.send_task(PROBE_TASK, queue=worker.queue).get(timeout=timeout)
        except Exception as exc:  # reported with the worker's log
            status = worker.process.poll() if worker.process else None
            pytest.fail(
                f"no task ran after the Redis restart ({exc!r}; worker exit status {status}); worker log:\n{worker.log()[-6000:]}"
            )
    assert len(partitions) == 3 and all(name.startswith("trials_p") for name in partitions)
    return time.monotonic() - started


def _worker(service_env: dict[str, str], broker: Broker, tmp_path: pathlib.Path, **extra_env: str) -> Worker:
    queue = f"iwscope-test-brk-{secrets.token_hex(4)}"
    env = {**service_env, "REDIS_URL": broker.url, "IWSCOPE_CELERY_QUEUE": queue, "IWSCOPE_LOG_LEVEL": "INFO", **extra_env}
    return Worker(env, queue, tmp_path / "worker.log")


def test_worker_reconnects_after_redis_restart_with_task_in_flight(
    broker: Broker, service_env: dict[str, str], database_url: str, tmp_path: pathlib.Path
) -> None:
    worker = _worker(service_env, broker, tmp_path)
    worker.start()
    try:
        _wait_ready(worker, broker.url)
        in_flight = _restart_redis_with_a_task_in_flight(broker, worker, database_url)
        seconds = _next_task_runs(broker, worker)
        assert worker.process is not None and worker.process.poll() is None, worker.log()[-6000:]
        log = worker.log()
        assert "Connection to broker lost" in log  # the restart did reach the worker
        assert "Unrecoverable error" not in log, log[-6000:]
        print(
            f"{in_flight} task(s) in flight at the kill; the next task ran {seconds:.1f} s after the restart "
            f"(Redis down {REDIS_DOWN_S:.0f} s)"
        )
    finally:
        worker.stop()


@pytest.mark.slow  # 15 s: shows the failure the fix removes (the fix itself: the test above, in make test)
def test_without_the_fix_the_worker_exits_non_zero_and_a_restart_recovers(
    broker: Broker, service_env: dict[str, str], database_url: str, tmp_path: pathlib.Path
) -> None:
    """The safety net: kombu as shipped loses the consumer; the process must then exit non-zero."""
    unpatched = tmp_path / "unpatched"
    unpatched.mkdir()
    (unpatched / "sitecustomize.py").write_text("import iwscope.broker\niwscope.broker.install = lambda: None\n")
    python_path = os.pathsep.join(filter(None, [str(unpatched), service_env.get("PYTHONPATH")]))
    worker = _worker(service_env, broker, tmp_path, PYTHONPATH=python_path)
    worker.start()
    try:
        _wait_ready(worker, broker.url)
        _restart_redis_with_a_task_in_flight(broker, worker, database_url)
        assert worker.process is not None
        try:
            status = worker.process.wait(timeout=RECOVERY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            if "Unrecoverable error" not in worker.log():
                pytest.fail(
                    "kombu as shipped no longer loses the worker on this restart: the workaround in "
                    "iwscope.broker may be obsolete (check, then drop it and this test)"
                )
            pytest.fail(f"the worker lost its consumer but did not exit:\n{worker.log()[-6000:]}")
        assert "Unrecoverable error" in worker.log()
        assert status != 0, "the worker stopped on an unrecoverable error but exited 0 (a supervisor would not restart it)"
        worker.start()  # what the supervisor does
        _next_task_runs(broker, worker, timeout=STARTUP_TIMEOUT_S)
    finally:
        worker.stop()
