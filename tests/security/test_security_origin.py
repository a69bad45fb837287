"""The origin under hostile clients: objects over the limit, non-HTTP bytes, slowloris, many
connections, per-client rate limits (no traffic amplifier), bounded threads and memory; it
drops CAP_NET_ADMIN once serving; the probe runs without root."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from testkit import free_base_port, stop_process

from iwprobe._agent import ORIGIN_CREDENTIALS, Credentials, save_credentials
from iwprobe._caps import CAP_NET_ADMIN
from iwprobe._origin import Origin, OriginConfig

REPO = Path(__file__).resolve().parents[2]
PROBE_SRC = REPO / "probe" / "src"
MAX_OBJECT = 1_000_000
REQUEST_TIMEOUT_S = 1.5
WORKERS = 4


def _wait_port(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


@dataclass
class OriginProcess:
    process: subprocess.Popen[bytes]
    port: int

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/task"))

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def origin_process() -> Iterator[OriginProcess]:
    """``iwprobe origin`` (CLI, no collector) on 127.0.0.1, arms 3 and 10, 4 workers, 1.5 s request timeout."""
    base = free_base_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "iwprobe",
            "--log-level",
            "WARNING",
            "origin",
            "--no-upload",
            "--bind",
            "127.0.0.1",
            "--arms",
            "3,10",
            "--base-port",
            str(base),
            "--max-object-bytes",
            str(MAX_OBJECT),
            "--request-timeout",
            str(REQUEST_TIMEOUT_S),
            "--workers",
            str(WORKERS),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    try:
        _wait_port(base + 10)
        yield OriginProcess(process, base + 10)
    finally:
        stop_process(process)


def exchange(port: int, payload: bytes, source: str = "127.0.0.1", timeout_s: float = 5.0) -> bytes:
    """Send ``payload`` from ``source`` and read the whole answer (until the origin closes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s, source_address=(source, 0)) as sock:
        sock.sendall(payload)
        answer = bytearray()
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
        return bytes(answer)


def get(port: int, size: int, source: str = "127.0.0.1") -> tuple[int, bytes]:
    answer = exchange(port, f"GET /obj/{size} HTTP/1.1\r\nHost: o\r\n\r\n".encode(), source)
    head, _, body = answer.partition(b"\r\n\r\n")
    return (int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0), body


def _unanswered(sock: socket.socket) -> bool:
    """The origin has neither answered ``sock`` nor closed it (its request is still pending)."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)  # b"" (closed) or the answer's first byte
    except BlockingIOError:
        return True
    except OSError:  # reset
        pass
    return False


def test_objects_over_the_limit_and_non_http_bytes_get_quick_4xx(origin_process: OriginProcess) -> None:
    """Refused from the request head alone: a short 4xx, not the object first nor silence until
    the request timeout (which closes a connection without a word, see the slowloris test)."""
    port = origin_process.port
    status, body = get(port, MAX_OBJECT + 1, "127.0.4.1")
    assert status == 413 and b"larger than" in body and len(body) < 100, (status, len(body), body[:100])
    hostile = {
        "tls client hello": b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + os.urandom(200),
        "binary zeros": b"\x00" * 300,
        "other method": b"POST /obj/10 HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
        "ssh banner": b"SSH-2.0-OpenSSH_9.2\r\n",
        "bad request line": b"GET /obj/10 HTTP/9.9\r\n\r\n",
    }
    for name, payload in hostile.items():
        answer = exchange(port, payload, "127.0.4.2")
        # An answer at all: the origin judged the bytes at once (the timeout would close in silence).
        assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), (name, answer[:100])
    huge_head = b"GET /obj/10 HTTP/1.1\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n"
    assert exchange(port, huge_head, "127.0.4.3").startswith(b"HTTP/1.1 431 ")
    assert get(port, 5000, "127.0.4.4") == (200, bytes(range(256)) * 19 + bytes(range(136)))
    assert origin_process.process.poll() is None


def test_slowloris_is_cut_off_and_others_are_served_meanwhile(origin_process: OriginProcess) -> None:
    port = origin_process.port
    threads_before = origin_process.threads()
    slow: list[socket.socket] = []
    try:
        for index in range(200):  # 50x the worker count, from 20 addresses
            sock = socket.create_connection(("127.0.0.1", port), source_address=(f"127.0.5.{1 + index % 20}", 0))
            sock.sendall(b"GET /obj/100 HTTP/1.1\r\n")
            slow.append(sock)
        # While 200 requests dribble in, other clients are served: answered while every slow
        # request is still pending (a worker tied up by one would serve them only once the
        # request timeout had cut the slow ones off).
        latencies = []
        served_meanwhile = 0
        for _ in range(10):
            started = time.monotonic()
            assert get(port, 20_000, "127.0.6.1")[0] == 200
            latencies.append(time.monotonic() - started)
            if not all(_unanswered(sock) for sock in slow):
                break  # a slow machine reached the request timeout: later fetches would prove nothing
            served_meanwhile += 1
            for sock in slow[:50]:
                sock.send(b"X")  # one byte now and then: keeps no worker busy
        assert served_meanwhile >= 1, latencies
        print(
            f"slowloris: 200 dribbling connections from 20 addresses; {served_meanwhile} of another client's "
            f"20 kB fetches served meanwhile in {min(latencies) * 1000:.1f}-{max(latencies) * 1000:.1f} ms; "
            f"origin threads {origin_process.threads()}"
        )
        assert origin_process.threads() == threads_before
        # After the request timeout every slow connection has been closed by the origin.
        time.sleep(REQUEST_TIMEOUT_S + 0.7)
        closed = 0
        for sock in slow:
            sock.settimeout(2)
            try:
                closed += sock.recv(100) == b""
            except ConnectionResetError:
                closed += 1
        assert closed == len(slow)
    finally:
        for sock in slow:
            sock.close()


def test_many_connections_keep_threads_and_memory_bounded(origin_process: OriginProcess) -> None:
    port = origin_process.port
    threads_before, rss_before = origin_process.threads(), origin_process.rss_kib()
    idle: list[socket.socket] = []
    peak_threads = threads_before
    failures: list[str] = []

    def fetch_many(source: str) -> None:
        for _ in range(5):
            try:
                status, body = get(port, MAX_OBJECT, source)
                if status != 200 or len(body) != MAX_OBJECT:
                    failures.append(f"{source}: {status} {len(body)}")
            except OSError as error:
                failures.append(f"{source}: {error}")

    try:
        for index in range(800):  # idle connections from 40 addresses
            idle.append(socket.create_connection(("127.0.0.1", port), source_address=(f"127.0.7.{1 + index % 40}", 0)))
        fetchers = [threading.Thread(target=fetch_many, args=(f"127.0.8.{i + 1}",)) for i in range(16)]
        for thread in fetchers:
            thread.start()
        while any(thread.is_alive() for thread in fetchers):
            peak_threads = max(peak_threads, origin_process.threads())
            time.sleep(0.02)
        rss_loaded = origin_process.rss_kib()
    finally:
        for sock in idle:
            sock.close()
    assert failures == []
    assert peak_threads == threads_before  # a fixed pool: 1 accept + 4 workers + main (+ none per connection)
    growth_mib = (rss_loaded - rss_before) / 1024
    print(
        f"origin: {threads_before} threads throughout; RSS {rss_before} -> {rss_loaded} KiB under 800 idle "
        f"connections and 80 x 1 MB fetches from 16 clients ({growth_mib:.1f} MiB)"
    )
    assert growth_mib < 40
    assert origin_process.process.poll() is None


@pytest.fixture
def limited_origin() -> Iterator[Origin]:
    """An in-process origin with small per-client limits (20 requests/s, 200 kB/s, 5 connections)."""
    base = free_base_port()
    origin = Origin(
        OriginConfig(
            bind="127.0.0.1",
            arms=[3],
            base_port=base,
            set_marks=False,
            workers=4,
            max_object_bytes=100_000,
            request_timeout_s=2.0,
            client_requests_per_s=20,
            client_request_burst=20,
            client_bytes_per_s=200_000,
            client_max_connections=5,
        )
    )
    origin.start()
    try:
        yield origin
    finally:
        origin.stop()


def test_per_client_request_and_byte_rates_are_limited(limited_origin: Origin) -> None:
    port = limited_origin.config.port(3)
    # Requests: a burst of 20, then 20/s; 60 back-to-back requests mostly get 429 with Retry-After.
    started = time.monotonic()
    statuses = []
    for _ in range(60):
        answer = exchange(port, b"GET /obj/10 HTTP/1.1\r\n\r\n", "127.0.9.1")
        statuses.append(int(answer.split(b" ", 2)[1]))
        if statuses[-1] == 429:
            assert b"Retry-After: 1\r\n" in answer
    elapsed = time.monotonic() - started
    allowed = 20 + 20 * elapsed + 1
    assert 20 <= statuses.count(200) <= allowed, (statuses, elapsed)
    assert statuses[:20] == [200] * 20 and statuses.count(429) >= 60 - allowed
    # Another address is not affected.
    assert get(port, 10, "127.0.9.2")[0] == 200
    # Bytes: the bucket holds 200 kB (two objects of the 100 kB limit), refilled at 200 kB/s.
    bytes_started = time.monotonic()
    served = [get(port, 100_000, "127.0.9.3") for _ in range(6)]
    window = time.monotonic() - bytes_started
    served_bytes = sum(len(body) for status, body in served if status == 200)
    assert [status for status, _ in served][:2] == [200, 200] and 429 in [status for status, _ in served]
    assert served_bytes <= 200_000 + 200_000 * window + 100_000
    assert limited_origin.stats.rate_limited >= statuses.count(429)
    print(
        f"rate limit 20/s burst 20: {statuses.count(200)} of 60 requests in {elapsed:.2f} s served, "
        f"{statuses.count(429)} got 429; bytes 200 kB/s: {served_bytes} bytes of 6 x 100 kB served in {window:.2f} s"
    )


def test_per_client_connection_cap(limited_origin: Origin) -> None:
    port = limited_origin.config.port(3)
    held = [socket.create_connection(("127.0.0.1", port), source_address=("127.0.10.1", 0)) for _ in range(5)]
    try:
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", port), source_address=("127.0.10.1", 0), timeout=2)
        try:
            refused = extra.recv(10) == b""  # closed at accept, nothing read
        except ConnectionResetError:
            refused = True
        extra.close()
        assert refused
        assert get(port, 10, "127.0.10.2")[0] == 200  # other clients unaffected
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)
    assert get(port, 10, "127.0.10.1")[0] == 200  # the budget is returned when connections close


def _cap_eff(status_path: Path) -> int:
    for line in status_path.read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no CapEff in {status_path}")


@pytest.fixture
def netns() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    name = f"iwt{secrets.token_hex(3)}c"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.mark.parametrize("with_uploader", [False, True], ids=["no-upload", "uploader"])
def test_origin_drops_cap_net_admin_after_route_setup(netns: str, tmp_path: Path, with_uploader: bool) -> None:
    """Every thread, the uploader included (it talks to the network), runs without CAP_NET_ADMIN."""
    log_path = tmp_path / "origin.log"
    upload_args = ["--no-upload"]
    expected_threads = 5  # main + accept + 3 workers
    if with_uploader:
        # Enrolled against a collector that is not there: the uploader thread runs and backs off.
        state = tmp_path / "state"
        save_credentials(
            str(state),
            ORIGIN_CREDENTIALS,
            Credentials(role="origin", id=str(uuid.uuid4()), credential="x.y", collector="http://127.0.0.1:9"),
        )
        upload_args = ["--state-dir", str(state)]
        expected_threads += 1
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                netns,
                sys.executable,
                "-m",
                "iwprobe",
                "--log-level",
                "INFO",
                "origin",
                *upload_args,
                "--setup-routes",
                "--bind",
                "127.0.0.1",
                "--arms",
                "3,10",
                "--base-port",
                "8100",
                "--workers",
                "3",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
            cwd=REPO,
        )
    try:
        deadline = time.monotonic() + 20
        tasks = Path(f"/proc/{process.pid}/task")
        capabilities: dict[str, int] = {}
        while time.monotonic() < deadline:
            assert process.poll() is None, log_path.read_text()
            capabilities = {task.name: _cap_eff(task / "status") for task in tasks.iterdir()}
            if len(capabilities) >= expected_threads and all(not caps & (1 << CAP_NET_ADMIN) for caps in capabilities.values()):
                break
            time.sleep(0.1)
        # Main + accept + 3 workers (+ uploader), none with CAP_NET_ADMIN; the process CapEff too.
        assert len(capabilities) >= expected_threads, capabilities
        assert all(not caps & (1 << CAP_NET_ADMIN) for caps in capabilities.values()), capabilities
        assert not _cap_eff(Path(f"/proc/{process.pid}/status")) & (1 << CAP_NET_ADMIN)
        assert all(caps & (1 << 10) for caps in capabilities.values())  # only NET_ADMIN went (NET_BIND_SERVICE stays)
        bounding = [line for line in Path(f"/proc/{process.pid}/status").read_text().splitlines() if line.startswith("CapBnd:")][
            0
        ]
        assert not int(bounding.split()[1], 16) & (1 << CAP_NET_ADMIN)  # and it cannot come back
        rules = subprocess.run(["ip", "-n", netns, "rule", "show"], capture_output=True, text=True, check=True).stdout
        assert "fwmark 0x1f003 lookup 21003" in rules and "fwmark 0x1f00a lookup 21010" in rules
        # It still serves.
        fetched = subprocess.run(
            ["ip", "netns", "exec", netns, sys.executable, "-m", "iwprobe", "fetch", "--json", "http://127.0.0.1:8110/obj/20000"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert json.loads(fetched.stdout)["http_status"] == 200, fetched.stderr
    finally:
        stop_process(process, timeout=10)


def test_probe_fetch_runs_as_nobody(origin_process: OriginProcess, request: pytest.FixtureRequest) -> None:
    """The probe is standard library only and needs no privilege: the system Python, user nobody."""
    runuser, python = shutil.which("runuser"), shutil.which("python3", path="/usr/bin:/bin")
    if runuser is None or python is None:
        pytest.skip("runuser or a system python3 is missing")
    # A copy nobody can read: the checkout may sit in a 0700 home (as root's does on Debian).
    readable = Path(tempfile.mkdtemp(prefix="iwt-probe-"))
    readable.chmod(0o755)
    shutil.copytree(PROBE_SRC / "iwprobe", readable / "iwprobe", ignore=shutil.ignore_patterns("__pycache__"))
    for path in readable.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    request.addfinalizer(lambda: shutil.rmtree(readable, ignore_errors=True))
    completed = subprocess.run(
        [
            runuser,
            "-u",
            "nobody",
            "--",
            "env",
            f"PYTHONPATH={readable}",
            python,
            "-c",
            "import os, sys, runpy; print(os.geteuid(), file=sys.stderr); "
            "sys.argv = ['iwprobe', 'fetch', '--json', sys.argv[1]]; "
            "runpy.run_module('iwprobe', run_name='__main__')",
            f"http://127.0.0.1:{origin_process.port}/obj/50000",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stderr.split()[0] == str(65534)
    record = json.loads(completed.stdout)
    assert record["http_status"] == 200 and record["bytes_received"] >= 50_000 and record["tcp_info"]
