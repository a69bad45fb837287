"""Helpers shared by the tests of several parts (``from testkit import ...``; tests/ is on
``sys.path`` through the root conftest, as for ``testenv``).

* The API as probes and origins see it: ``Enrolled``, ``bearer``, ``enroll_probe``, ``enroll_origin``,
  ``SlowUpload``, ``revoke_unnoticed``.
* Valid wire records to start from: ``make_trial``, ``make_batch``, ``make_observation``,
  ``make_observation_batch``, ``make_path_sample``.
* Waiting: ``wait_for``, ``wait_folded``.
* Processes, ports, clients: ``stop_process``, ``free_port``, ``free_base_port``, ``close_celery_client``.
* The box's own noise: ``SchedulingNoise`` (how late a sleeping thread wakes while a test runs).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.client
import os
import pathlib
import random
import secrets
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import psycopg
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from testenv import libpq_url

from iwprobe import wire

REPO = pathlib.Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- the API
@dataclass
class Enrolled:
    """A probe or origin enrolled through the API."""

    id: str
    credential: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.credential}"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def enroll_probe(client: httpx.Client, enroll_token: str, region: str = "eu-west", name: str | None = None) -> Enrolled:
    response = client.post(
        wire.PROBE_ENROLL_PATH,
        headers=bearer(enroll_token),
        json={
            "name": name or f"probe-{uuid.uuid4().hex[:6]}",
            "region": region,
            "country": "DE",
            "asn": 3320,
            "labels": {"access": "dsl"},
            "version": "0.1.0",
        },
    )
    assert response.status_code == 201, response.text
    body = response.json()
    return Enrolled(body["id"], body["credential"])


def enroll_origin(client: httpx.Client, origin_token: str, arms: tuple[int, ...] = (3, 10)) -> Enrolled:
    response = client.post(
        wire.ORIGIN_ENROLL_PATH,
        headers=bearer(origin_token),
        json={
            "name": f"origin-{uuid.uuid4().hex[:6]}",
            "region": "eu-central",
            "host": "10.0.0.1",
            "arms": [{"iw": iw, "port": 8000 + iw} for iw in arms],
            "version": "0.1.0",
        },
    )
    assert response.status_code == 201, response.text
    body = response.json()
    return Enrolled(body["id"], body["credential"])


class SlowUpload:
    """A ``POST`` whose body arrives in two parts: the first half now, the rest at ``finish()``
    (a probe on a slow uplink)."""

    def __init__(self, port: int, path: str, credential: str, body: bytes) -> None:
        self.body = body
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {credential}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.sock.sendall(head + body[: len(body) // 2])

    def finish(self) -> tuple[int, Any]:
        self.sock.sendall(self.body[len(self.body) // 2 :])
        response = http.client.HTTPResponse(self.sock, method="POST")
        response.begin()
        answer = orjson.loads(response.read())
        self.sock.close()
        return response.status, answer


def create_campaign(client: httpx.Client, admin_token: str, origin_id: str, **fields: Any) -> dict[str, Any]:
    """``POST /api/v1/campaigns`` of a campaign on ``origin_id`` open from 5 minutes ago for an hour
    (arms 3 and 10 unless ``fields`` say otherwise); the created campaign."""
    now = dt.datetime.now(dt.UTC)
    body = {
        "origin_ids": [origin_id],
        "arms": [3, 10],
        "starts_at": (now - dt.timedelta(minutes=5)).isoformat(),
        "ends_at": (now + dt.timedelta(hours=1)).isoformat(),
        **fields,
    }
    response = client.post("/api/v1/campaigns", headers=bearer(admin_token), json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


def revoke_unnoticed(database_url: str, probe_id: str) -> None:
    """Revoke a probe with migration 0008's notifying trigger disabled: no API process hears of
    it, so only the credential cache's expiry (or another notification) can refuse the probe."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        connection.execute("ALTER TABLE probes DISABLE TRIGGER probes_credential_change")
        try:
            connection.execute("UPDATE probes SET revoked_at = now() WHERE id = %s", (probe_id,))
        finally:
            connection.execute("ALTER TABLE probes ENABLE TRIGGER probes_credential_change")


# ----------------------------------------------------------------------------- wire records
def make_trial(probe_id: str, origin_id: str | None = None, campaign_id: int | None = None, **overrides: Any) -> dict[str, Any]:
    """A valid wire ``TrialRecord`` as a dict (arm 3 or 10 at random unless ``arm_iw`` is given)."""
    arm_iw = overrides.pop("arm_iw", random.choice((3, 10)))
    total_us = random.randint(20_000, 400_000)
    record = {
        "trial_id": wire.new_id(),
        "probe_id": probe_id,
        "campaign_id": campaign_id,
        "origin_id": origin_id,
        "round": 0,
        "arm_iw": arm_iw,
        "object_size": 100_000,
        "url": f"http://10.0.0.1:{8000 + arm_iw}/obj/100000",
        "started_at": wire.utc_timestamp(),
        "dns_us": 0,
        "connect_us": 20_000,
        "ttfb_us": 21_000,
        "total_us": total_us,
        "bytes_received": 100_250,
        "http_status": 200,
        "error_kind": None,
        "error_detail": None,
        "syn_retrans": 0,
        "tcp_info": {
            "rtt": 20_500,
            "rttvar": 800,
            "min_rtt": 20_000,
            "total_retrans": 0,
            "segs_in": 75,
            "data_segs_in": 70,
            "rcv_space": 65_000,
            "rcv_mss": 1448,
            "bytes_received": 100_250,
        },
    }
    record.update(overrides)
    return record


def make_batch(probe_id: str, trials: list[dict[str, Any]], path_samples: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "wire_version": 1,
        "batch_id": wire.new_id(),
        "probe_id": probe_id,
        "sent_at": wire.utc_timestamp(),
        "trials": trials,
        "path_samples": path_samples or [],
    }


def make_observation(trial: dict[str, Any] | str, origin_id: str, **overrides: Any) -> dict[str, Any]:
    """A valid wire ``OriginObservation`` of ``trial`` (a record of ``make_trial``, or only a
    trial id: then of an arm-10 fetch of 100 kB just now)."""
    if isinstance(trial, str):
        trial = {"trial_id": trial, "arm_iw": 10, "object_size": 100_000, "started_at": wire.utc_timestamp()}
    record = {
        "trial_id": trial["trial_id"],
        "origin_id": origin_id,
        "arm_iw": trial["arm_iw"],
        "port": 8000 + trial["arm_iw"],
        "client_addr": "10.0.1.2",
        "object_size": trial["object_size"],
        "request_at": trial["started_at"],
        "first_byte_us": 150,
        "response_latency_us": 90_000,
        "snd_cwnd_at_accept": trial["arm_iw"],
        "cwnd_mismatch": False,
        "rwnd_limited": False,
        "peer_rwnd": 65_535,
        "http_status": 200,
        "error_kind": None,
        "tcp_info": {
            "total_retrans": 1,
            "bytes_retrans": 1448,
            "rtt": 21_000,
            "min_rtt": 19_000,
            "delivery_rate": 1_250_000,
            "segs_out": 72,
            "bytes_sent": 100_250,
            "snd_cwnd": 20,
            "snd_ssthresh": 2_147_483_647,
            "busy_time": 80_000,
            "rwnd_limited": 0,
            "sndbuf_limited": 0,
        },
    }
    record.update(overrides)
    return record


def make_observation_batch(origin_id: str, observations: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "wire_version": 1,
        "batch_id": wire.new_id(),
        "origin_id": origin_id,
        "sent_at": wire.utc_timestamp(),
        "observations": observations,
    }


def make_path_sample(probe_id: str, origin_id: str, **overrides: Any) -> dict[str, Any]:
    record = {
        "sample_id": wire.new_id(),
        "probe_id": probe_id,
        "origin_id": origin_id,
        "measured_at": wire.utc_timestamp(),
        "min_rtt_us": 19_500,
        "bottleneck_bps": 10_000_000,
        "transfer_bytes": 2_000_000,
        "method": "delivery_rate_max",
    }
    record.update(overrides)
    return record


# ----------------------------------------------------------------------------- waiting
def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 60.0,
    interval: float = 0.2,
    what: str = "condition",
    detail: Callable[[], str] | None = None,
) -> Any:
    """``predicate()``'s first truthy value, polled every ``interval`` s for at most ``timeout`` s;
    the AssertionError names ``what`` and carries ``detail()`` (a log tail, say)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            message = f"{what} not reached within {timeout:.0f} s"
            raise AssertionError(f"{message}:\n{detail()}" if detail is not None else message)
        time.sleep(interval)


def wait_folded(engine: Engine, probe_id: str, timeout: float = 60.0) -> None:
    """Until the worker's refresh has folded everything of ``probe_id`` received or joined so far
    into the roll-ups and path estimates (both watermarks past it)."""
    from iwscope.analysis.rollups import caught_up
    from iwscope.trials.models import Trial

    latest = select(func.max(Trial.received_at), func.max(Trial.joined_at)).where(Trial.probe_id == probe_id)

    def folded() -> bool:
        with Session(engine) as session:
            return caught_up(session, *session.execute(latest).one())

    wait_for(folded, timeout, what="the roll-ups folding in every trial of the probe")


# ----------------------------------------------------------------------------- the box's noise
class SchedulingNoise:
    """How late a thread that sleeps ``interval_s`` at a time wakes, sampled while the ``with``
    block runs: the scheduling delay every userspace part of a lab path (the emulator, the
    origin's echo, the probe's Python threads) can add to a time it measures.  A timing bound
    from physics (a buffer's drain time) is only a bound on a box that was not starved; on a
    2-core box shared with another suite a 5 ms sleep has woken 50 ms late.
    """

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.lateness_s: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="scheduling-noise", daemon=True)

    def __enter__(self) -> SchedulingNoise:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while True:
            start = time.perf_counter()
            if self._stop.wait(self.interval_s):
                return
            self.lateness_s.append(max(0.0, time.perf_counter() - start - self.interval_s))

    def quantile_ms(self, q: float) -> float:
        """The ``q`` quantile of the wake-up lateness in ms (0 without samples)."""
        if not self.lateness_s:
            return 0.0
        ordered = sorted(self.lateness_s)
        return 1000.0 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ----------------------------------------------------------------------------- processes, ports, clients
def stop_process(process: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """SIGTERM, ``timeout`` s to exit, then SIGKILL (nothing if it has exited already)."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


def free_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on (at the time of the call)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class DashboardServer:
    """A real ``iwscope dashboard`` process (:func:`running_dashboard`)."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: pathlib.Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.contextmanager
def running_dashboard(
    database_url: str, log_path: pathlib.Path, *options: str, timeout_s: float = 60.0
) -> Iterator[DashboardServer]:
    """``iwscope dashboard`` (gunicorn) on 127.0.0.1 and a free port over ``database_url`` (the
    environment's own ``DATABASE_URL`` and ``IWSCOPE_ADMIN_TOKEN`` left out), with ``options``
    (e.g. ``--cache-seconds 0``); yielded once ``/_dash-layout`` answers, stopped at the end."""
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "IWSCOPE_ADMIN_TOKEN")}
    env |= {"DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "iwscope.cli", "dashboard", "--host", "127.0.0.1", "--port", str(port), *options]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    server = DashboardServer(f"http://127.0.0.1:{port}", process, log_path)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"iwscope dashboard exited with {process.returncode}:\n{server.log()}")
            try:
                if httpx.get(server.url + "/_dash-layout", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"iwscope dashboard not up within {timeout_s} s:\n{server.log()}")
            time.sleep(0.2)
        yield server
    finally:
        stop_process(process)


def free_base_port(arms: tuple[int, ...] = (3, 10)) -> int:
    """An origin's ``--base-port`` whose arm ports (base + iw of each arm) are free on 127.0.0.1."""
    for _ in range(50):
        base = 20000 + secrets.randbelow(30000)
        try:
            for iw in arms:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", base + iw))
            return base
        except OSError:
            continue
    raise RuntimeError("no free ports")


def close_celery_client(app) -> None:
    """Close a client app and the Redis connections of its result backend (no leaked sockets)."""
    backend = getattr(app._local, "backend", None)  # only if this thread created one
    if backend is not None:
        consumer = getattr(backend, "result_consumer", None)
        pubsub = getattr(consumer, "_pubsub", None)
        if pubsub is not None:
            pubsub.close()
        client = getattr(backend, "client", None)
        if client is not None:
            client.connection_pool.disconnect()
    app.close()


def census_record(
    probe_id: str, url: str = "https://example.org/big", campaign_id: int | None = None, **overrides: Any
) -> dict[str, Any]:
    """A wire v5 census record (a CDN's IW 10 over TCP) with ``overrides``."""
    record: dict[str, Any] = {
        "census_id": wire.new_id(),
        "probe_id": probe_id,
        "campaign_id": campaign_id,
        "round": 0,
        "url": url,
        "measured_at": wire.utc_timestamp(),
        "status": "ok",
        "iw_segments": 10,
        "iw_bytes": 14_480,
        "mss": 1448,
        "reason": "",
        "connections": 3,
        "connections_ok": 3,
        "announced_mss": None,
        "rtt_us": 60_000,
        "family": "ipv4",
        "tls_version": "TLSv1.3",
        "http_status": 206,
        "error_detail": None,
    }
    record.update(overrides)
    return record
