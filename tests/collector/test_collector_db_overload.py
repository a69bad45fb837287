"""Database connections under load (docs/reliability.md "Load"): a real API process against
this session's PostgreSQL, no mocks.

* Authentication does not keep a connection while the body streams in: slow uploads, more
  of them than the pool has connections, cannot starve the API (the collapse of the load
  benchmark: connection holders waiting for threads that wait for connections).
* With a pool of one connection and many concurrent uploads every answer is 200 or 503 with
  ``Retry-After`` (never a 500, never a hang); every acknowledged trial is stored exactly
  once and nothing of a refused batch is stored.
* A busy database (the only slot held by an export waiting on a lock) is a 503 too, and the
  probe's uploader honours it: it keeps its spool and comes back after ``Retry-After``.
* Public reads (analysis API, CSV exports), however many and slow, take at most half the
  slots: probes still get through; a streamed export gives its slot back when the client
  goes away midway.
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import psycopg
import pytest
from testenv import libpq_url
from testkit import Enrolled, SlowUpload, enroll_probe, make_batch, make_trial

from iwprobe import wire

#: Settings of the deliberately tiny API: one connection, turned away after 0.4 s.
TINY_POOL = {
    "IWSCOPE_DB_POOL_SIZE": "1",
    "IWSCOPE_DB_MAX_OVERFLOW": "0",
    "IWSCOPE_DB_POOL_TIMEOUT_S": "0.4",
    "IWSCOPE_RETRY_AFTER_S": "1",
}


def _local_ports_to(pid: int, remote_port: int) -> set[int]:
    """Local TCP ports of the sockets process ``pid`` holds towards ``remote_port`` (its
    PostgreSQL connections), from /proc: independent of how the process names them."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[9] in inodes and int(fields[2].rsplit(":", 1)[1], 16) == remote_port:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def backends_of(pid: int, database_url: str) -> list[tuple[str | None, str | None]]:
    """``(state, wait_event_type)`` of every PostgreSQL backend serving process ``pid``."""
    ports = _local_ports_to(pid, urlsplit(database_url).port or 5432)
    if not ports:
        return []
    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        return [
            (row[0], row[1])
            for row in connection.execute(
                "SELECT state, wait_event_type FROM pg_stat_activity WHERE client_port = ANY(%s) "
                "AND datname = current_database()",
                (sorted(ports),),
            )
        ]


def stored_counts(database_url: str, trial_ids: list[str]) -> tuple[int, int, int]:
    """Rows in ``trials``, distinct trial ids among them, rows in the ``trial_ids`` registry."""
    with psycopg.connect(libpq_url(database_url)) as connection:
        rows, distinct = connection.execute(
            "SELECT count(*), count(DISTINCT trial_id) FROM trials WHERE trial_id = ANY(%s::uuid[])", (trial_ids,)
        ).fetchone()  # type: ignore[misc]
        registry = connection.execute("SELECT count(*) FROM trial_ids WHERE trial_id = ANY(%s::uuid[])", (trial_ids,)).fetchone()[
            0
        ]  # type: ignore[index]
    return rows, distinct, registry


def _batch_body(probe: Enrolled, count: int) -> tuple[bytes, list[str]]:
    trials = [make_trial(probe.id) for _ in range(count)]
    return orjson.dumps(make_batch(probe.id, trials)), [trial["trial_id"] for trial in trials]


class _WaitRecorder(threading.Event):
    """A ``stop`` event for ``Uploader.drain`` that is never set and records each wait asked of it."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        return super().wait(timeout)


def _assert_busy_answer(status: int, headers: Any, body: Any) -> None:
    assert status == 503, (status, body)
    assert headers.get("retry-after") == "1", headers
    assert isinstance(body, dict) and "retry later" in body["detail"] and body["retry_after_s"] == 1, body


@pytest.fixture
def tiny_api(joinless_api_factory):
    """An API with a pool of one (every API here is joinless: these tests check admission and
    storage, not joins, with thousands of small uploads)."""
    return joinless_api_factory(**TINY_POOL)


def test_slow_upload_bodies_hold_no_connection_and_cannot_starve_the_api(
    joinless_api_factory, enroll_token: str, database_url: str
) -> None:
    # Default sizing (pool 20 + overflow 0): more slow uploads than the pool has connections.
    server = joinless_api_factory()
    assert server.process is not None
    with httpx.Client(base_url=server.url, timeout=60) as client:
        probe = enroll_probe(client, enroll_token)
    uploads: list[tuple[SlowUpload, list[str]]] = []
    try:
        for _ in range(25):
            body, ids = _batch_body(probe, 20)
            uploads.append((SlowUpload(server.port, wire.TRIALS_BATCH_PATH, probe.credential, body), ids))
        # Authentication takes a few ms per upload; then, while the bodies are incomplete, no
        # backend of the API may sit in a transaction (before: 20 of 20 "idle in transaction",
        # each held by an upload waiting for its body).
        deadline = time.monotonic() + 10
        while True:
            states = backends_of(server.process.pid, database_url)
            if states and all(state == "idle" for state, _ in states):
                break
            assert time.monotonic() < deadline, states
            time.sleep(0.2)
        # A fast request goes through while all 25 bodies are still incomplete (before: it waited
        # for a connection the slow uploads held, then failed).
        with httpx.Client(base_url=server.url, timeout=60) as client:
            body, fast_ids = _batch_body(probe, 5)
            fast = client.post(wire.TRIALS_BATCH_PATH, content=body, headers=probe.headers)
            assert fast.status_code == 200, fast.text
        assert _busy(server.url, "admission") == _busy(server.url, "pool") == 0  # nobody found the slots taken
        for upload, ids in uploads:
            status, answer = upload.finish()
            assert status == 200 and answer["accepted"] == len(ids), answer
        all_ids = fast_ids + [trial_id for _, ids in uploads for trial_id in ids]
        assert stored_counts(database_url, all_ids) == (len(all_ids),) * 3
    finally:
        for upload, _ in uploads:
            upload.sock.close()


def test_tiny_pool_under_concurrent_uploads_answers_200_or_503_and_stores_each_trial_once(
    joinless_api_factory, enroll_token: str, database_url: str
) -> None:
    # One connection, 0.1 s of patience: 120 uploads of 300 trials are far more than it can
    # take at once, so some must be turned away.
    tiny_api = joinless_api_factory(**{**TINY_POOL, "IWSCOPE_DB_POOL_TIMEOUT_S": "0.1"})
    with httpx.Client(base_url=tiny_api.url, timeout=60) as client:
        probes = [enroll_probe(client, enroll_token) for _ in range(10)]
    batches = [(probe, *_batch_body(probe, 300)) for probe in probes for _ in range(12)]
    barrier = threading.Barrier(len(batches))

    def upload(item: tuple[Enrolled, bytes, list[str]]) -> tuple[int, Any, Any]:
        probe, body, _ = item
        with httpx.Client(base_url=tiny_api.url, timeout=60) as client:
            barrier.wait()
            answer = client.post(wire.TRIALS_BATCH_PATH, content=body, headers=probe.headers)
            try:
                return answer.status_code, answer.headers, answer.json()
            except ValueError:
                return answer.status_code, answer.headers, answer.text

    with concurrent.futures.ThreadPoolExecutor(len(batches)) as pool:
        answers = list(pool.map(upload, batches))
    statuses = [status for status, _, _ in answers]
    print(f"\n{len(batches)} concurrent uploads on a pool of 1: {statuses.count(200)} x 200, {statuses.count(503)} x 503")
    assert set(statuses) <= {200, 503}, statuses
    assert statuses.count(200) and statuses.count(503), "both answers expected under this overload"
    acknowledged: list[str] = []
    refused: list[tuple[Enrolled, bytes, list[str]]] = []
    for (status, headers, answer), item in zip(answers, batches, strict=True):
        if status == 200:
            assert (answer["accepted"], answer["duplicates"]) == (len(item[2]), 0), answer
            acknowledged += item[2]
        else:
            _assert_busy_answer(status, headers, answer)
            refused.append(item)
    # Acknowledged: stored once each (trials and registry); refused: nothing at all.
    assert stored_counts(database_url, acknowledged) == (len(acknowledged),) * 3
    assert stored_counts(database_url, [trial_id for item in refused for trial_id in item[2]]) == (0, 0, 0)
    # The refused batches, sent again one by one, are stored; everything exactly once.
    with httpx.Client(base_url=tiny_api.url, timeout=60) as client:
        for probe, body, ids in refused:
            again = client.post(wire.TRIALS_BATCH_PATH, content=body, headers=probe.headers)
            assert again.status_code == 200 and again.json()["accepted"] == len(ids), again.text
        replay = client.post(wire.TRIALS_BATCH_PATH, content=batches[0][1], headers=batches[0][0].headers)
        assert replay.status_code == 200 and replay.json()["duplicates"] == len(batches[0][2])
    every = [trial_id for item in batches for trial_id in item[2]]
    assert stored_counts(database_url, every) == (len(every),) * 3


def test_busy_database_is_a_503_and_the_probe_uploader_keeps_its_spool_and_returns(
    tiny_api, enroll_token: str, database_url: str, trials_locked: psycopg.Connection, tmp_path
) -> None:
    from iwprobe._collector import CollectorClient
    from iwprobe._spool import Spool
    from iwprobe._upload import Uploader

    assert tiny_api.process is not None
    with httpx.Client(base_url=tiny_api.url, timeout=60) as client:
        probe = enroll_probe(client, enroll_token)
    # The CSV export holds the only database slot (pool of one, readers' share one): its query
    # waits for the lock on ``trials``.
    export_status: list[int] = []

    def export() -> None:
        with httpx.stream("GET", f"{tiny_api.url}/api/v1/trials.csv", params={"probe_id": probe.id}, timeout=60) as answer:
            answer.read()
            export_status.append(answer.status_code)

    exporter = threading.Thread(target=export)
    exporter.start()
    deadline = time.monotonic() + 20
    while ("active", "Lock") not in backends_of(tiny_api.process.pid, database_url):
        assert time.monotonic() < deadline, "the export never reached the lock"
        time.sleep(0.05)
    # Any request needing the database now waits for a slot 0.4 s and is answered 503.
    body, ids = _batch_body(probe, 10)
    busy = httpx.post(f"{tiny_api.url}{wire.TRIALS_BATCH_PATH}", content=body, headers=probe.headers, timeout=60)
    _assert_busy_answer(busy.status_code, busy.headers, busy.json())
    assert _busy(tiny_api.url, "admission") == 1  # refused by admission (no slot within 0.4 s), not a hang
    # The probe's uploader: a 503 + Retry-After 1 s with a 0.3 s deadline returns at once,
    # nothing leaves the spool, and nothing is sent again before Retry-After.
    spool = Spool(str(tmp_path / "spool.sqlite"))
    records = [make_trial(probe.id) for _ in range(30)]
    for record in records:
        spool.add("trial", record["trial_id"], record)
    uploader = Uploader(spool, CollectorClient(tiny_api.url, probe.credential), "probe", probe.id, backoff_base_s=0.01)
    started = time.monotonic()
    waits = _WaitRecorder()
    assert uploader.drain(deadline=time.monotonic() + 0.3, stop=waits) is False
    assert waits.timeouts == []  # returned after the one answer: no waiting out Retry-After, no backoff
    assert uploader.backlog() == len(records)
    assert uploader.not_before >= started + 1.0
    assert _upload_answers(tiny_api.url) == {"503": 2}  # ours above and the uploader's single try
    # The lock goes away: the export finishes, the uploader waits out Retry-After, then uploads.
    trials_locked.rollback()
    exporter.join(timeout=30)
    assert export_status == [200]
    assert uploader.drain(deadline=time.monotonic() + 30) is True
    assert time.monotonic() >= uploader.not_before
    assert uploader.backlog() == 0
    spool.close()
    record_ids = [record["trial_id"] for record in records]
    assert stored_counts(database_url, record_ids) == (len(records),) * 3
    assert stored_counts(database_url, ids) == (0, 0, 0)
    assert _upload_answers(tiny_api.url) == {"503": 2, "200": 1}
    assert 'iwscope_db_busy_total{where="admission"} 2.0' in httpx.get(f"{tiny_api.url}/metrics").text


HEARTBEAT = {"version": "test", "spool_backlog": 0, "spool_bytes": 0, "uptime_s": 1.0, "trials_measured": 0}


def _busy(url: str, where: str) -> float:
    """Requests of the API at ``url`` that found no database slot in time, by where they waited."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f'iwscope_db_busy_total{{where="{where}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_public_reads_leave_half_the_slots_to_probes(
    joinless_api_factory, enroll_token: str, database_url: str, trials_locked: psycopg.Connection
) -> None:
    # Two slots; readers may hold one. Reads of ``trials`` block on the lock.
    server = joinless_api_factory(**{**TINY_POOL, "IWSCOPE_DB_POOL_SIZE": "2", "IWSCOPE_DB_POOL_TIMEOUT_S": "1"})
    assert server.process is not None
    with httpx.Client(base_url=server.url, timeout=60) as client:
        probe = enroll_probe(client, enroll_token)
    # Only reads of ``trials`` (the roll-up reads, e.g. headline, would pass the lock and free
    # their slot for the next reader).
    read_paths = [
        "/api/v1/analysis/trials?limit=1",
        "/api/v1/analysis/trials?limit=3&offset=1",
        f"/api/v1/trials.csv?probe_id={probe.id}",
        "/api/v1/analysis/trials.csv",
        "/api/v1/trials.csv",
        "/api/v1/analysis/trials?limit=2",
    ]
    answers: dict[str, tuple[int, Any, str]] = {}

    def read(path: str) -> None:
        answer = httpx.get(f"{server.url}{path}", timeout=60)
        answers[path] = (answer.status_code, answer.headers, answer.text)

    readers = [threading.Thread(target=read, args=(path,)) for path in read_paths]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + 20
    while ("active", "Lock") not in backends_of(server.process.pid, database_url):
        assert time.monotonic() < deadline, "no read reached the lock"
        time.sleep(0.05)
    # A probe is served while the reads pile up (before: the reads took both connections
    # outside any admission, the heartbeat waited pool_timeout and got a 503).
    beat = httpx.post(
        f"{server.url}{wire.PROBE_HEARTBEAT_PATH.format(probe_id=probe.id)}", headers=probe.headers, json=HEARTBEAT, timeout=30
    )
    assert beat.status_code == 204, beat.text
    schedule = httpx.get(f"{server.url}{wire.PROBE_SCHEDULE_PATH.format(probe_id=probe.id)}", headers=probe.headers)
    assert schedule.status_code == 200, schedule.text
    # Every read but the admitted one gives up after 1 s with a 503; then the lock goes away.
    deadline = time.monotonic() + 20
    while len(answers) < len(read_paths) - 1:
        assert time.monotonic() < deadline, answers
        time.sleep(0.05)
    trials_locked.rollback()
    for reader in readers:
        reader.join(timeout=30)
    statuses = sorted(status for status, _, _ in answers.values())
    assert statuses == [200] + [503] * (len(read_paths) - 1), answers
    for status, headers, text in answers.values():
        if status == 503:
            _assert_busy_answer(status, headers, orjson.loads(text))
    assert _busy(server.url, "reads") == len(read_paths) - 1
    # Without the lock every read goes through again: no slot was kept by a refused read.
    for path in read_paths:
        assert httpx.get(f"{server.url}{path}", timeout=30).status_code == 200, path


def test_an_abandoned_csv_export_gives_its_slot_back(joinless_api_factory, enroll_token: str, database_url: str) -> None:
    server = joinless_api_factory(**{**TINY_POOL, "IWSCOPE_DB_POOL_TIMEOUT_S": "2"})  # one slot in all
    assert server.process is not None
    with httpx.Client(base_url=server.url, timeout=60) as client:
        probe = enroll_probe(client, enroll_token)
        for _ in range(6):  # 6,000 trials: several MB of CSV, more than the socket buffers hold
            body, _ = _batch_body(probe, 1000)
            assert client.post(wire.TRIALS_BATCH_PATH, content=body, headers=probe.headers).status_code == 200
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        sock.sendall(f"GET /api/v1/trials.csv?probe_id={probe.id} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # RST: the client is gone midway
        # The one slot comes back: a heartbeat (which needs it) is answered, not refused.
        beat = httpx.post(
            f"{server.url}{wire.PROBE_HEARTBEAT_PATH.format(probe_id=probe.id)}",
            headers=probe.headers,
            timeout=30,
            json=HEARTBEAT,
        )
        assert beat.status_code == 204, beat.text
    # And the export's backend is not left in a transaction or a query.
    deadline = time.monotonic() + 10
    while any(state != "idle" for state, _ in backends_of(server.process.pid, database_url)):
        assert time.monotonic() < deadline, backends_of(server.process.pid, database_url)
        time.sleep(0.1)
    whole = httpx.get(f"{server.url}/api/v1/trials.csv", params={"probe_id": probe.id}, timeout=60)
    assert whole.status_code == 200 and whole.text.count("\n") == 6001


def _upload_answers(url: str) -> dict[str, int]:
    """Answers of the upload route so far, by status, from the API's own counter."""
    answers = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("iwscope_http_requests_total{") and 'route="/api/v1/trials/batch"' in line:
            status = line.split('status="', 1)[1].split('"', 1)[0]
            answers[status] = int(float(line.rsplit(" ", 1)[1]))
    return answers


@pytest.mark.unit
def test_pool_settings_are_validated() -> None:
    from pydantic import ValidationError

    from iwscope.config import Settings

    settings = Settings(IWSCOPE_DB_POOL_SIZE=4, IWSCOPE_DB_MAX_OVERFLOW=2, IWSCOPE_DB_POOL_TIMEOUT_S=1.5)
    assert (settings.db_connections, settings.db_pool_timeout_s) == (6, 1.5)
    for bad in (
        {"IWSCOPE_DB_POOL_SIZE": 0},
        {"IWSCOPE_DB_MAX_OVERFLOW": -1},
        {"IWSCOPE_DB_POOL_TIMEOUT_S": 0},
        {"IWSCOPE_DB_POOL_TIMEOUT_S": 120},
        {"IWSCOPE_API_THREADS": 2},
        {"IWSCOPE_RETRY_AFTER_S": 0},
        {"IWSCOPE_DB_POOL_SIZE": 150, "IWSCOPE_DB_MAX_OVERFLOW": 100},
    ):
        with pytest.raises(ValidationError):
            Settings(**bad)  # type: ignore[arg-type]
