"""Admission at the front door (``iwscope.admission``): past its limit an API process answers
503 + ``Retry-After`` at once, before reading the body; readers never take the last places from
probes; health and metrics always answer; nothing in progress is lost."""

from __future__ import annotations

import http.client
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
from iwscope.admission import OVERLOADED_DETAIL, is_probe_traffic

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
