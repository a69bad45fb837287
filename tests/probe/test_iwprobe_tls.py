"""The collector client verifies TLS: a pinned CA file is trusted, an unknown CA is not."""

from __future__ import annotations

import http.server
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from iwprobe._collector import CollectorClient, CollectorError

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services


class _Healthz(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # http.server API
        body = b'{"status":"ok"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )
    server = http.server.HTTPServer(("127.0.0.1", 0), _Healthz)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_pinned_ca_is_trusted_and_unknown_ca_refused(tls_server: tuple[str, Path]) -> None:
    url, cert = tls_server
    status, body = CollectorClient(url, ca_file=str(cert), timeout_s=5).get_json("/healthz")
    assert status == 200 and body == {"status": "ok"}
    with pytest.raises(CollectorError, match="CERTIFICATE_VERIFY_FAILED") as refused:
        CollectorClient(url, timeout_s=5).get_json("/healthz")
    assert refused.value.status is None and refused.value.retryable


def test_collector_url_must_be_http_or_https() -> None:
    with pytest.raises(ValueError, match="must start with http:// or https://"):
        CollectorClient("ftp://collector")
