"""A collector stand-in for the probe's uploader tests: a real HTTP server on 127.0.0.1 that
records every POST and answers what the test's ``answer`` function says (``from stubcollector
import StubCollector``; tests/ is on ``sys.path`` through the root conftest).

The uploader's tests use it where what matters is the uploader's side of the exchange (what it
sends, when, and what it does with 404, 503 + ``Retry-After``); the collector itself is tested
against the real API elsewhere.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Post:
    """One request the stub received: its path, JSON body and arrival (``time.monotonic``)."""

    path: str
    body: dict[str, Any]
    at: float


#: ``answer(stub, post) -> (status, JSON body, extra headers)``; ``stub.posts`` already holds ``post``.
Answer = Callable[["StubCollector", Post], tuple[int, dict[str, Any], dict[str, str]]]


def accept_all(_: StubCollector, post: Post) -> tuple[int, dict[str, Any], dict[str, str]]:
    """The collector's answer to a batch it stores whole (``UploadResultOut``)."""
    records = sum(len(post.body.get(key, [])) for key in ("trials", "path_samples", "observations", "traces"))
    return 200, {"batch_id": post.body["batch_id"], "accepted": records, "duplicates": 0}, {}


class StubCollector(ThreadingHTTPServer):
    """Records every POST in ``posts`` and answers by ``answer``."""

    def __init__(self, answer: Answer = accept_all) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer = answer
        self.posts: list[Post] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: StubCollector

    def do_POST(self) -> None:
        post = Post(self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"]))), time.monotonic())
        self.server.posts.append(post)
        status, answer, headers = self.server.answer(self.server, post)
        payload = json.dumps(answer).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def stub_collectors() -> Iterator[Callable[[Answer], StubCollector]]:
    """A factory of running stubs, all shut down on exit (for a fixture's ``yield``)."""
    servers: list[StubCollector] = []

    def start(answer: Answer = accept_all) -> StubCollector:
        server = StubCollector(answer)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
