"""The API behind TLS (a CA made at test time): probes enroll and run against https with the
pinned CA; another CA or a wrong host name fails with a clear certificate error before any
HTTP byte (and so the token) is sent."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from security_helpers import Pki, make_pki, sign_leaf
from sqlalchemy import text
from sqlalchemy.engine import Engine
from testkit import free_port, stop_process

REPO = Path(__file__).resolve().parents[2]
IWSCOPE = [sys.executable, "-m", "iwscope.cli"]
IWPROBE = [sys.executable, "-m", "iwprobe"]


@dataclass
class TlsApi:
    url: str
    pki: Pki
    log_path: Path


@pytest.fixture(scope="module")
def tls_api(service_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsApi]:
    """``iwscope api --tls-cert --tls-key`` on 127.0.0.1 with a certificate of a fresh test CA."""
    directory = tmp_path_factory.mktemp("tls")
    pki = make_pki(directory / "good", hosts=("127.0.0.1",))
    port = free_port()
    log_path = directory / "api.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                *IWSCOPE,
                "api",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--tls-cert",
                str(pki.cert_file),
                "--tls-key",
                str(pki.key_file),
            ],
            env=service_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log_path.read_text()
            try:
                if (
                    httpx.get(f"{url}/healthz", verify=ssl.create_default_context(cafile=str(pki.ca_file)), timeout=1).status_code
                    == 200
                ):
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        yield TlsApi(url, pki, log_path)
    finally:
        stop_process(process)


def iwprobe(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*IWPROBE, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_api_serves_only_tls_and_the_probe_enrolls_and_runs_with_the_pinned_ca(
    tls_api: TlsApi, enroll_token: str, db_engine: Engine, tmp_path: Path
) -> None:
    # Plain HTTP to the TLS port is no API.
    with pytest.raises(httpx.TransportError):
        httpx.get(tls_api.url.replace("https://", "http://") + "/healthz", timeout=5)
    name = f"tls-probe-{tmp_path.name[-6:]}"
    enrolled = iwprobe(
        "enroll",
        "--collector",
        tls_api.url,
        "--token",
        enroll_token,
        "--name",
        name,
        "--region",
        "sec-tls",
        "--state-dir",
        str(tmp_path),
        "--ca-file",
        str(tls_api.pki.ca_file),
    )
    assert enrolled.returncode == 0, enrolled.stderr
    # The daemon talks to the https collector with the stored CA: heartbeat and schedule.
    ran = iwprobe("run", "--once", "--state-dir", str(tmp_path), "--upload-timeout", "20", "--campaign", "2147483000")
    assert ran.returncode == 0, ran.stderr
    with db_engine.connect() as connection:
        seen = connection.execute(text("SELECT last_seen_at, last_heartbeat FROM probes WHERE name = :n"), {"n": name}).one()
    assert seen.last_seen_at is not None and seen.last_heartbeat is not None


class _Recorder:
    """A TLS listener with a given certificate that records every decrypted byte a client sends."""

    def __init__(self, pki: Pki) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(str(pki.cert_file), str(pki.key_file))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.received = bytearray()
        self.handshakes_failed = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        while self.listener.fileno() >= 0:
            try:
                raw, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            raw.settimeout(5)
            try:
                with self.context.wrap_socket(raw, server_side=True) as tls:
                    while chunk := tls.recv(65536):
                        self.received += chunk
            except (ssl.SSLError, OSError):
                self.handshakes_failed += 1

    def close(self) -> None:
        self.listener.close()
        self.thread.join(timeout=5)


@pytest.mark.parametrize("case", ["other_ca", "wrong_host"])
def test_untrusted_certificate_fails_clearly_and_the_token_is_never_sent(case: str, tls_api: TlsApi, tmp_path: Path) -> None:
    # other_ca: a certificate for the right address from a CA the probe does not pin.
    # wrong_host: a certificate from the pinned CA, but for another host name.
    pki = make_pki(tmp_path / "rogue", hosts=("127.0.0.1",), label="rogue") if case == "other_ca" else None
    if case == "wrong_host":
        pki = sign_leaf(tls_api.pki, tmp_path / "wrong-host", host="collector.example")
    assert pki is not None
    recorder = _Recorder(pki)
    token = "iws_enroll_" + "S" * 43
    try:
        outcome = iwprobe(
            "enroll",
            "--collector",
            f"https://127.0.0.1:{recorder.port}",
            "--token",
            token,
            "--name",
            "rogue",
            "--region",
            "x",
            "--state-dir",
            str(tmp_path / "state"),
            "--ca-file",
            str(tls_api.pki.ca_file),
            timeout=60,
        )
    finally:
        recorder.close()
    assert outcome.returncode == 2
    assert "TLS certificate of https://127.0.0.1" in outcome.stderr and "not trusted" in outcome.stderr
    expected = "unable to get local issuer certificate" if case == "other_ca" else "IP address mismatch"
    assert expected in outcome.stderr, outcome.stderr
    assert recorder.handshakes_failed >= 1
    assert bytes(recorder.received) == b""  # no request line, no header, no token
    assert token not in outcome.stderr + outcome.stdout
    assert not (tmp_path / "state" / "probe.json").exists()
