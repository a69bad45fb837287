"""The uploader against a collector that misbehaves: garbage, 5xx, hangs, resets, answers that
do not acknowledge the batch.  It must back off, keep every record spooled, and once the
real collector answers, store each trial exactly once.

A small TCP proxy in front of the real API process (PostgreSQL behind it) plays the
misbehaving collector; in ``pass`` mode it relays requests unchanged.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from iwprobe import wire
from iwprobe._agent import enroll_probe
from iwprobe._collector import CollectorClient
from iwprobe._fetch import FetchResult
from iwprobe._spool import Spool
from iwprobe._upload import Uploader

#: Misbehaviours, each answering a whole upload attempt.
HOSTILE_MODES = {
    "non-http bytes": b"\x16\x03\x01 this is not HTTP at all\r\n\r\n",
    "http 500": b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\nConnection: close\r\n\r\noops!",
    "http 502 html": (
        b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\nContent-Length: 22\r\n"
        b"Connection: close\r\n\r\n<html>upstream</html>\n"
    ),
    "http 200 garbage body": b'HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\n{"acc":}x',
    "http 200 captive portal": (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 25\r\nConnection: close\r\n\r\n<html>Please log in</html>"
    ),
    "http 200 other batch": None,  # valid JSON, but it acknowledges a batch the probe never sent
    "http 200 truncated": b'HTTP/1.1 200 OK\r\nContent-Length: 500\r\nConnection: close\r\n\r\n{"batch_id": "',
    "reset": b"",
    "hang": b"",
}


class HostileCollector:
    """A TCP proxy: ``mode`` picks a misbehaviour from :data:`HOSTILE_MODES`, or ``pass``."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.mode = "pass"
        self.requests: dict[str, int] = {}
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stop.set()
        self._server.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(connection,), daemon=True).start()

    def _handle(self, connection: socket.socket) -> None:
        mode = self.mode
        self.requests[mode] = self.requests.get(mode, 0) + 1
        with connection:
            connection.settimeout(30)
            method, path, headers, body = _read_request(connection)
            if mode == "pass":
                connection.sendall(self._relay(method, path, headers, body))
            elif mode == "hang":
                self._stop.wait(10)  # longer than the client's timeout
            elif mode == "reset":
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            elif mode == "http 200 other batch":
                answer = json.dumps({"batch_id": wire.new_id(), "accepted": 1, "duplicates": 0}).encode()
                connection.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(answer)).encode()
                    + b"\r\nConnection: close\r\n\r\n"
                    + answer
                )
            else:
                connection.sendall(HOSTILE_MODES[mode])

    def _relay(self, method: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
        upstream = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=30)
        try:
            upstream.request(
                method,
                path,
                body=body or None,
                headers={k: v for k, v in headers.items() if k.lower() not in ("connection", "host")},
            )
            response = upstream.getresponse()
            payload = response.read()
        finally:
            upstream.close()
        head = f"HTTP/1.1 {response.status} {response.reason}\r\n"
        head += "".join(
            f"{k}: {v}\r\n"
            for k, v in response.getheaders()
            if k.lower() not in ("connection", "content-length", "transfer-encoding")
        )
        head += f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
        return head.encode("latin-1") + payload


def _read_request(connection: socket.socket) -> tuple[str, str, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            return "", "", {}, b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    length = int(headers.get("Content-Length", "0"))
    while len(body) < length:
        chunk = connection.recv(65536)
        if not chunk:
            break
        body += chunk
    return method, path, headers, body


@pytest.fixture()
def hostile(api_server: Any) -> Iterator[HostileCollector]:
    proxy = HostileCollector(api_server.port)
    try:
        yield proxy
    finally:
        proxy.close()


def _trial(probe_id: str) -> Any:
    return FetchResult(
        url="http://192.0.2.1:8010/obj/9000",
        started_at=wire.utc_timestamp(),
        dns_us=0,
        connect_us=1000,
        ttfb_us=2000,
        total_us=5000,
        bytes_received=9100,
        body_bytes=9000,
        http_status=200,
    ).to_trial(wire.new_id(), probe_id, None, None, 0, 10, 9000)


def _stored(database_url: str, probe_id: str) -> list[str]:
    with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://", 1)) as connection:
        rows = connection.execute("SELECT trial_id FROM trials WHERE probe_id = %s", (probe_id,)).fetchall()
    return [str(row[0]) for row in rows]


def test_misbehaving_collector_loses_nothing_and_stores_once(
    hostile: HostileCollector, api_server: Any, enroll_token: str, database_url: str, tmp_path: Path
) -> None:
    credentials, _ = enroll_probe(
        api_server.url, enroll_token, wire.EnrollRequest(name="hostile-test", region="x"), str(tmp_path)
    )
    spool = Spool(str(tmp_path / "spool.sqlite"))
    client = CollectorClient(hostile.url, credentials.credential, timeout_s=1.5)
    uploader = Uploader(spool, client, "probe", credentials.id, max_records=4, backoff_base_s=0.05, backoff_cap_s=0.2)
    measured: list[str] = []
    for mode in HOSTILE_MODES:
        # The probe keeps measuring while the collector misbehaves: new records join the spool.
        for _ in range(3):
            trial = _trial(credentials.id)
            spool.add("trial", trial.trial_id, wire.to_dict(trial))
            measured.append(trial.trial_id)
        hostile.mode = mode
        failures_before = uploader.failures
        assert not uploader.drain(deadline=time.monotonic() + 2.5), mode
        assert uploader.failures > failures_before, mode  # it saw a failure and backed off
        assert spool.backlog() == len(measured), f"{mode}: records left the spool unacknowledged"
        assert hostile.requests.get(mode, 0) >= 1, mode
    assert _stored(database_url, credentials.id) == [] or set(_stored(database_url, credentials.id)) <= set(measured)
    hostile.mode = "pass"
    assert uploader.drain(deadline=time.monotonic() + 60)
    stored = _stored(database_url, credentials.id)
    assert sorted(stored) == sorted(measured)  # every trial, each exactly once
    assert spool.backlog() == 0 and spool.rejected_count() == 0
    spool.close()
