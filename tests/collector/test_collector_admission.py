"""Admission at the front door (``iwscope.admission``): past its limit an API process answers
503 + ``Retry-After`` at once, before reading the body; readers never take the last places from
probes; health and metrics always answer; nothing in progress is lost."""

from __future__ import annotations

import http.client
import select
import signal
import socket
import threading
import time
from typing import Any

import httpx
import orjson
import psycopg
import pytest
from testenv import libpq_url
from testkit import SlowUpload, enroll_probe, make_batch, make_trial

from iwprobe import wire
from iwscope.admission import OVERLOADED_DETAIL, RetryAfter, UploadLimit, is_probe_traffic

#: Three requests in progress per process, at most one of them not probe traffic.
SMALL_DOOR = {"IWSCOPE_MAX_IN_PROGRESS": "3", "IWSCOPE_MAX_OTHER_IN_PROGRESS": "1", "IWSCOPE_RETRY_AFTER_S": "1"}
HEARTBEAT = {"version": "test", "spool_backlog": 0, "spool_bytes": 0, "uptime_s": 1.0, "trials_measured": 0}


@pytest.fixture
def door(joinless_api_factory):
    """An API with a small door (its join tasks on a queue no worker reads)."""
    return joinless_api_factory(**SMALL_DOOR)


def _metric(url: str, name: str, kind: str, reason: str | None = None) -> float:
    labels = f'kind="{kind}"' + (f',reason="{reason}"' if reason else "")
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(f"{name}{{{labels}}}"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _wait_in_progress(url: str, kind: str, count: int) -> None:
    deadline = time.monotonic() + 20
    while _metric(url, "iwscope_requests_in_progress", kind) != count:
        assert time.monotonic() < deadline, f"never {count} {kind} requests in progress"
        time.sleep(0.05)


def _assert_refused_at_door(status: int, headers: Any, body: bytes) -> None:
    assert status == 503, (status, body)
    assert headers.get("retry-after") == "1", headers
    assert orjson.loads(body) == {"detail": OVERLOADED_DETAIL, "retry_after_s": 1}


@pytest.mark.unit
def test_probe_traffic_is_uploads_heartbeats_schedules_and_enrollment() -> None:
    assert is_probe_traffic("POST", wire.TRIALS_BATCH_PATH)
    assert is_probe_traffic("POST", wire.OBSERVATIONS_BATCH_PATH)
    assert is_probe_traffic("POST", wire.TRACES_BATCH_PATH)
    assert is_probe_traffic("POST", wire.PROBE_HEARTBEAT_PATH.format(probe_id="x"))
    assert is_probe_traffic("GET", wire.PROBE_SCHEDULE_PATH.format(probe_id="x"))
    assert is_probe_traffic("POST", wire.PROBE_ENROLL_PATH) and is_probe_traffic("POST", wire.ORIGIN_ENROLL_PATH)
    for method, path in (
        ("GET", "/api/v1/probes"),
        ("GET", "/api/v1/analysis/headline"),
        ("GET", "/api/v1/trials.csv"),
        ("GET", "/api/v1/trials/0b0e4a36-8d0e-4c3d-9a55-3a1c3b7f0c11/traces"),
        ("GET", wire.TRIALS_BATCH_PATH),
        ("POST", "/api/v1/campaigns"),
    ):
        assert not is_probe_traffic(method, path), (method, path)


def test_a_full_door_refuses_a_large_upload_before_its_body_and_loses_nothing(door, enroll_token: str, database_url: str) -> None:
    with httpx.Client(base_url=door.url, timeout=60) as client:
        probe = enroll_probe(client, enroll_token)
    batches = [[make_trial(probe.id) for _ in range(20)] for _ in range(3)]
    uploads = [
        SlowUpload(door.port, wire.TRIALS_BATCH_PATH, probe.credential, orjson.dumps(make_batch(probe.id, trials)))
        for trials in batches
    ]
    try:
        _wait_in_progress(door.url, "probe", 3)  # three bodies half sent: the door is full
        # A fourth upload announces 50 MB and sends only its headers: answered at once, without
        # the server waiting for (or reading) a byte of the body, and the connection closed.
        with socket.create_connection(("127.0.0.1", door.port), timeout=10) as sock:
            sock.sendall(
                (
                    f"POST {wire.TRIALS_BATCH_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Authorization: Bearer {probe.credential}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {50 * 1024 * 1024}\r\n\r\n"
                ).encode()
            )
            response = http.client.HTTPResponse(sock, method="POST")
            response.begin()
            _assert_refused_at_door(response.status, response.headers, response.read())
            assert response.headers.get("connection") == "close"
        # Everything else is refused too, small or large, probe or reader; health still answers.
        beat = httpx.post(
            f"{door.url}{wire.PROBE_HEARTBEAT_PATH.format(probe_id=probe.id)}", json=HEARTBEAT, headers=probe.headers, timeout=10
        )
        _assert_refused_at_door(beat.status_code, beat.headers, beat.content)
        assert "connection" not in beat.headers or beat.headers["connection"] != "close"  # small: kept alive
        read = httpx.get(f"{door.url}/api/v1/analysis/trials?limit=1", timeout=10)
        _assert_refused_at_door(read.status_code, read.headers, read.content)
        assert httpx.get(f"{door.url}/readyz", timeout=10).status_code == 200
        assert _metric(door.url, "iwscope_admission_rejected_total", "probe", "in_progress") == 2
        assert _metric(door.url, "iwscope_admission_rejected_total", "other", "in_progress") == 1
        # The three in progress finish and are stored; then the door is open again.
        for upload, trials in zip(uploads, batches, strict=True):
            status, answer = upload.finish()
            assert status == 200 and answer["accepted"] == len(trials), answer
    finally:
        for upload in uploads:
            upload.sock.close()
    _wait_in_progress(door.url, "probe", 0)
    beat = httpx.post(
        f"{door.url}{wire.PROBE_HEARTBEAT_PATH.format(probe_id=probe.id)}", json=HEARTBEAT, headers=probe.headers, timeout=10
    )
    assert beat.status_code == 204, beat.text
    ids = [trial["trial_id"] for trials in batches for trial in trials]
    with psycopg.connect(libpq_url(database_url)) as connection:
        stored = connection.execute("SELECT count(*) FROM trials WHERE trial_id = ANY(%s::uuid[])", (ids,)).fetchone()
    assert stored == (len(ids),)


def test_readers_never_take_the_places_probes_need(door, enroll_token: str, trials_locked: psycopg.Connection) -> None:
    with httpx.Client(base_url=door.url, timeout=60) as client:
        probe = enroll_probe(client, enroll_token)
    answers: list[httpx.Response] = []
    # One read of ``trials`` waits on the lock: the readers' one place is taken.
    reader = threading.Thread(target=lambda: answers.append(httpx.get(f"{door.url}/api/v1/analysis/trials?limit=1", timeout=60)))
    reader.start()
    try:
        _wait_in_progress(door.url, "other", 1)
        # A second reader is refused at the door (its body says so: not the database's 503) ...
        second = httpx.get(f"{door.url}/api/v1/analysis/trials?limit=2", timeout=30)
        _assert_refused_at_door(second.status_code, second.headers, second.content)
        # ... while probes still have the other two places.
        beat = httpx.post(
            f"{door.url}{wire.PROBE_HEARTBEAT_PATH.format(probe_id=probe.id)}", json=HEARTBEAT, headers=probe.headers, timeout=10
        )
        assert beat.status_code == 204, beat.text
        schedule = httpx.get(f"{door.url}{wire.PROBE_SCHEDULE_PATH.format(probe_id=probe.id)}", headers=probe.headers, timeout=10)
        assert schedule.status_code == 200, schedule.text
    finally:
        trials_locked.rollback()
        reader.join(timeout=60)
    assert [answer.status_code for answer in answers] in ([200], [503])  # 503: the database's own timeout


@pytest.mark.unit
def test_admission_limits_are_validated() -> None:
    from iwscope.config import ConfigurationError, Settings

    with pytest.raises((ConfigurationError, ValueError)):
        Settings(IWSCOPE_MAX_IN_PROGRESS=4, IWSCOPE_MAX_OTHER_IN_PROGRESS=5)  # type: ignore[call-arg]
    settings = Settings(IWSCOPE_MAX_IN_PROGRESS=4, IWSCOPE_MAX_OTHER_IN_PROGRESS=4)  # type: ignore[call-arg]
    assert (settings.max_in_progress, settings.max_other_in_progress) == (4, 4)


def test_a_lagging_event_loop_refuses_new_requests_until_it_catches_up(api_server_factory, enroll_token: str) -> None:
    """Requests that wait in front of the handlers are invisible to the in-progress count; a
    starved process (here: stopped for 4 s, as a saturated CPU would leave it) measures its own
    event-loop lag and refuses new work until it has caught up, health excepted."""
    server = api_server_factory(IWSCOPE_MAX_LOOP_LAG_S="0.1", IWSCOPE_RETRY_AFTER_S="1")
    with httpx.Client(base_url=server.url, timeout=60) as client:
        probe = enroll_probe(client, enroll_token)  # the first request starts the lag timer
        beat_path = wire.PROBE_HEARTBEAT_PATH.format(probe_id=probe.id)
        assert client.post(beat_path, json=HEARTBEAT, headers=probe.headers).status_code == 204
        server.process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(4.0)
        finally:
            server.process.send_signal(signal.SIGCONT)
        time.sleep(0.2)  # the late timer has fired: smoothed lag about 0.4 * 0.9^4
        beat = client.post(beat_path, json=HEARTBEAT, headers=probe.headers)
        _assert_refused_at_door(beat.status_code, beat.headers, beat.content)
        read = client.get("/api/v1/analysis/trials?limit=1")
        _assert_refused_at_door(read.status_code, read.headers, read.content)
        assert client.get("/readyz").status_code == 200
        assert _metric(server.url, "iwscope_admission_rejected_total", "probe", "loop_lag") >= 1
        assert _metric(server.url, "iwscope_admission_rejected_total", "other", "loop_lag") >= 1
        # caught up: the door opens again by itself
        deadline = time.monotonic() + 30
        while (status := client.post(beat_path, json=HEARTBEAT, headers=probe.headers).status_code) == 503:
            assert time.monotonic() < deadline, "the door never reopened"
            time.sleep(0.2)
        assert status == 204


@pytest.mark.unit
def test_an_upload_limit_shrinks_while_uploads_are_slow_and_grows_back_when_they_are_not() -> None:
    limit = UploadLimit(ceiling=96, target_s=0.5)
    assert limit.limit == 96 and limit.admits(95, now=0.0) and not limit.admits(96, now=0.0)
    now = 0.0
    seen = [limit.limit]
    for _ in range(20):  # a second at a time, each with one upload answered 0.9 s after it arrived
        limit.finished(0.9, now + 0.95)
        now += 1.0
        limit.admits(0, now)
        seen.append(limit.limit)
    assert seen[:4] == [96, 72, 54, 40], seen  # a quarter less each slow second
    assert min(seen) == seen[-1] == UploadLimit.FLOOR, seen  # and never below the floor
    # An upload that arrived before the last decrease (queued under the old limit) cuts nothing.
    grown = UploadLimit(ceiling=96, target_s=0.5)
    grown.admits(0, 0.0)
    grown.finished(0.9, 0.95)
    grown.admits(0, 1.0)
    assert grown.limit == 72
    grown.finished(1.5, 1.6)  # arrived at 0.1, before the decrease at 1.0
    grown.admits(0, 2.0)
    assert grown.limit == 72
    grown.finished(0.9, 2.95)  # arrived at 2.05: after it
    grown.admits(0, 3.0)
    assert grown.limit == 54
    assert not limit.admits(UploadLimit.FLOOR, now) and limit.admits(UploadLimit.FLOOR - 1, now)
    limit.admits(0, now + 5.0)  # seconds with no upload answered: unchanged
    assert limit.limit == UploadLimit.FLOOR
    now += 5.0
    # Ten uploads a second, one of them slow: the p90 is a fast one, so the limit grows.
    for _ in range(40):
        for index in range(10):
            limit.finished(2.0 if index == 0 else 0.05, now + 0.01 * index)
        now += 1.0
        limit.admits(0, now)
        seen.append(limit.limit)
    assert seen[-40:][:3] == [5, 6, 7], seen[-40:]
    assert max(seen) == seen[-1] == 96, seen  # back to the ceiling, never above it
    # Two slow of ten: the p90 is slow.
    for index in range(10):
        limit.finished(2.0 if index < 2 else 0.05, now + 0.01 * index)
    limit.admits(0, now + 1.0)
    assert limit.limit == 72
    with pytest.raises(ValueError):
        UploadLimit(ceiling=96, target_s=0.0)
    assert UploadLimit(ceiling=2, target_s=1.0).floor == 2  # a door smaller than the floor


def _upload_limit(url: str) -> float:
    """``iwscope_admission_upload_limit`` as the API's ``/metrics`` says it now."""
    lines = httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
    return float(next(line for line in lines if line.startswith("iwscope_admission_upload_limit ")).rsplit(" ", 1)[1])


def _admitted_or_refused(url: str, upload: SlowUpload, in_progress: int) -> bool:
    """Whether ``upload`` (its body half sent) took a place (True) or was answered at once (False)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if select.select([upload.sock], [], [], 0.05)[0]:
            response = http.client.HTTPResponse(upload.sock, method="POST")
            response.begin()
            _assert_refused_at_door(response.status, response.headers, response.read())
            return False
        if _metric(url, "iwscope_requests_in_progress", "probe") == in_progress + 1:
            return True
    raise AssertionError("an upload neither took a place nor was answered")


def test_uploads_the_collector_answered_slowly_make_the_door_take_fewer(
    joinless_api_factory, enroll_token: str, database_url: str
) -> None:
    """Uploads that wait for the database (here: on a lock of ``trials``, as behind a saturated
    PostgreSQL) make the process take fewer uploads at once: the next ones past the new limit
    are refused at the door while places are free, other probe traffic still gets in, and
    nothing of a refused upload is stored."""
    server = joinless_api_factory(
        IWSCOPE_MAX_IN_PROGRESS="8",
        IWSCOPE_MAX_OTHER_IN_PROGRESS="1",
        IWSCOPE_RETRY_AFTER_S="1",
        IWSCOPE_UPLOAD_LATENCY_TARGET_S="0.2",
    )
    with httpx.Client(base_url=server.url, timeout=60) as client:
        probe = enroll_probe(client, enroll_token)
    answers: list[httpx.Response] = []

    def upload(trials: list[dict[str, Any]]) -> None:
        body = orjson.dumps(make_batch(probe.id, trials))
        answers.append(httpx.post(f"{server.url}{wire.TRIALS_BATCH_PATH}", content=body, headers=probe.headers, timeout=60))

    lock = psycopg.connect(libpq_url(database_url))
    try:
        lock.execute("LOCK TABLE trials IN ACCESS EXCLUSIVE MODE")
        slow = [threading.Thread(target=upload, args=([make_trial(probe.id)],)) for _ in range(2)]
        for thread in slow:
            thread.start()
        _wait_in_progress(server.url, "probe", 2)
        time.sleep(1.5)  # answered 1.5 s after their bodies: over the target, past a whole second
    finally:
        lock.rollback()
        lock.close()
    for thread in slow:
        thread.join(timeout=60)
    assert [answer.status_code for answer in answers] == [200, 200], [answer.text for answer in answers]
    held: list[SlowUpload] = []
    refused: SlowUpload | None = None
    batches = [[make_trial(probe.id) for _ in range(5)] for _ in range(8)]
    try:
        for trials in batches:
            body = orjson.dumps(make_batch(probe.id, trials))
            candidate = SlowUpload(server.port, wire.TRIALS_BATCH_PATH, probe.credential, body)
            if not _admitted_or_refused(server.url, candidate, len(held)):
                refused = candidate
                break
            held.append(candidate)
        assert refused is not None, "the door took 8 uploads: its limit never shrank"
        assert UploadLimit.FLOOR <= len(held) < 8, len(held)
        assert _metric(server.url, "iwscope_admission_rejected_total", "probe", "upload_latency") == 1
        assert _metric(server.url, "iwscope_admission_rejected_total", "probe", "in_progress") == 0
        limit = _upload_limit(server.url)
        assert limit <= len(held), limit
        beat_path = wire.PROBE_HEARTBEAT_PATH.format(probe_id=probe.id)
        beat = httpx.post(f"{server.url}{beat_path}", json=HEARTBEAT, headers=probe.headers, timeout=10)
        assert beat.status_code == 204, beat.text  # not an upload: the door's other places are open
        for candidate in held:
            status, answer = candidate.finish()
            assert status == 200 and answer["accepted"] == 5, answer
        # Those uploads were in progress for seconds, their bodies arriving slowly; the collector
        # answered each at once after its last byte, and that is what counts: the next second's
        # adjustment finds them fast and the limit grows.
        time.sleep(1.1)
        upload([make_trial(probe.id)])
        assert answers[-1].status_code == 200, answers[-1].text
        assert _upload_limit(server.url) > limit
    finally:
        for candidate in [*held, *([refused] if refused is not None else [])]:
            candidate.sock.close()
    refused_ids = [trial["trial_id"] for trial in batches[len(held)]]
    stored_ids = [trial["trial_id"] for trials in batches[: len(held)] for trial in trials]
    with psycopg.connect(libpq_url(database_url)) as connection:
        count = "SELECT count(*) FROM trials WHERE trial_id = ANY(%s::uuid[])"
        assert connection.execute(count, (refused_ids,)).fetchone() == (0,)
        assert connection.execute(count, (stored_ids,)).fetchone() == (len(stored_ids),)


@pytest.mark.unit
def test_the_retry_after_grows_while_more_is_refused_than_admitted_and_falls_back_after() -> None:
    retry = RetryAfter(base_s=2, max_s=60)
    assert retry.refused(0.0) == 2  # the first second's window starts
    now = 0.0
    values = []
    for _ in range(60):  # a second at a time: 40 refused, 10 admitted
        for index in range(40):
            retry.refused(now + 0.02 * index)
        for index in range(10):
            retry.admitted(now + 0.9 + 0.005 * index)
        now += 1.0
        values.append(retry.refused(now))
    assert values[0] == 3  # 2 x 2 ** (1 / 2): damped by its own length
    assert values == sorted(values) and values[-1] > 20, values  # it grows, more slowly the longer it is
    assert max(values) <= 60
    for _ in range(200):  # sustained: up to the ceiling, never past it
        for index in range(40):
            retry.refused(now + 0.02 * index)
        now += 1.0
    assert retry.refused(now) == 60
    # As many refused as admitted: it stays where it is.
    held = retry.seconds
    for _ in range(5):
        for index in range(20):
            retry.refused(now + 0.02 * index)
            retry.admitted(now + 0.02 * index + 0.01)
        now += 1.0
    retry.admitted(now)
    assert abs(retry.seconds - held) < 1, (retry.seconds, held)
    # Quiet seconds (fewer than MIN_REFUSALS refusals each) halve it, down to the configured value.
    seen = []
    for _ in range(8):
        for index in range(RetryAfter.MIN_REFUSALS - 1):
            retry.refused(now + 0.05 * index)
        now += 1.0
        retry.admitted(now)
        seen.append(retry.value)
    assert seen[:2] == [30, 15] and seen == sorted(seen, reverse=True) and seen[-1] == 2, seen
    with pytest.raises(ValueError):
        RetryAfter(base_s=0, max_s=60)
    assert RetryAfter(base_s=5, max_s=1).max_s == 5  # a ceiling below the configured value is the value
