"""``iwscope api --workers N``: N processes behind one port, metrics summed, each a lame duck."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import httpx
from prometheus_client import multiprocess

IWSCOPE = [sys.executable, "-m", "iwscope.cli"]

WORKERS = 2


def _workers_of(pid: int) -> set[int]:
    """The API worker processes the supervisor ``pid`` spawned (not multiprocessing's helpers)."""
    workers: set[int] = set()
    try:
        children = pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        return workers
    for child in children:
        try:
            if b"spawn_main" in pathlib.Path(f"/proc/{child}/cmdline").read_bytes():
                workers.add(int(child))
        except FileNotFoundError:
            continue
    return workers


def _wait_for_workers(pid: int, count: int, timeout_s: float = 60.0, exclude: frozenset[int] = frozenset()) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = _workers_of(pid) - exclude
        if len(workers) == count:
            return workers
        time.sleep(0.2)
    raise AssertionError(f"expected {count} workers of {pid}, have {_workers_of(pid)}")


def _readyz_count(metrics_text: str) -> float:
    match = re.search(
        r'^iwscope_http_requests_total\{method="GET",route="/readyz",status="200"\} (\S+)$', metrics_text, re.MULTILINE
    )
    return float(match.group(1)) if match else 0.0


def _readyz_by_worker(directory: pathlib.Path) -> dict[int, float]:
    """Each worker's own count of answered ``/readyz``, from its file in the multiprocess directory."""
    counts: dict[int, float] = {}
    for path in directory.glob("counter_*.db"):
        pid = int(path.stem.split("_")[1])
        for metric in multiprocess.MultiProcessCollector.merge([str(path)], accumulate=True):
            for sample in metric.samples:
                if (
                    sample.name == "iwscope_http_requests_total"
                    and sample.labels.get("route") == "/readyz"
                    and sample.labels.get("status") == "200"
                ):
                    counts[pid] = counts.get(pid, 0.0) + sample.value
    return counts


def _fresh_connection_gets(url: str, count: int) -> None:
    """``count`` GETs, each on a new connection (so the kernel may hand each to any worker)."""
    for _ in range(count):
        with httpx.Client(timeout=30.0) as client:
            assert client.get(url).status_code == 200


def test_workers_serve_one_port_with_metrics_summed(api_server_factory, tmp_path: pathlib.Path) -> None:
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    server = api_server_factory(workers=WORKERS, PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    workers = _wait_for_workers(server.process.pid, WORKERS)

    _fresh_connection_gets(f"{server.url}/readyz", 60)
    by_worker = _readyz_by_worker(metrics_dir)
    assert sum(by_worker.values()) == 60, by_worker
    assert len([pid for pid, count in by_worker.items() if count > 0]) == WORKERS, by_worker  # both served
    # any one worker's /metrics reports the sum over all of them, not its own share
    for _ in range(4):
        assert _readyz_count(httpx.get(f"{server.url}/metrics", timeout=30.0).text) == 60

    # a worker that dies is replaced; what it counted stays in the sum
    victim = min(workers)
    os.kill(victim, signal.SIGKILL)
    replacements = _wait_for_workers(server.process.pid, WORKERS, exclude=frozenset({victim}))
    assert victim not in replacements
    _fresh_connection_gets(f"{server.url}/readyz", 10)
    assert _readyz_count(httpx.get(f"{server.url}/metrics", timeout=30.0).text) == 70


def test_workers_drain_together_then_exit(api_server_factory) -> None:
    server = api_server_factory(workers=WORKERS, IWSCOPE_DRAIN_SECONDS="3")
    supervisor = server.process
    workers = _wait_for_workers(supervisor.pid, WORKERS)
    started = time.monotonic()
    supervisor.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    # every worker drains: whichever answers says 503 "draining", while requests are still served
    for _ in range(6):
        with httpx.Client(timeout=10.0) as client:
            answer = client.get(f"{server.url}/readyz")
            assert answer.status_code == 503 and answer.json()["status"] == "draining"
            assert client.get(f"{server.url}/healthz").status_code == 200
    assert supervisor.wait(timeout=60) == 0
    assert time.monotonic() - started >= 3.0
    assert not any(pathlib.Path(f"/proc/{pid}").exists() for pid in workers)


def test_workers_that_cannot_start_stop_the_api(service_env: dict[str, str], tmp_path: pathlib.Path) -> None:
    """A worker that dies before it listens (here: a certificate that is no certificate) is not
    restarted over and over: the API stops with status 3."""
    not_pem = tmp_path / "broken.pem"
    not_pem.write_text("not a certificate\n")
    process = subprocess.run(
        [*IWSCOPE, "api", "--port", "0", "--workers", str(WORKERS), "--tls-cert", str(not_pem), "--tls-key", str(not_pem)],
        env=service_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert process.returncode == 3, process.stdout + process.stderr
    assert "failed to start" in process.stderr


def test_a_given_metrics_directory_starts_empty(api_server_factory, tmp_path: pathlib.Path) -> None:
    """Counts of an earlier run in the same ``PROMETHEUS_MULTIPROC_DIR`` are not summed in."""
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    first = api_server_factory(workers=WORKERS, PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    _fresh_connection_gets(f"{first.url}/readyz", 5)
    first.stop()
    assert sum(_readyz_by_worker(metrics_dir).values()) == 5  # the earlier run's files are there
    second = api_server_factory(workers=WORKERS, PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    _fresh_connection_gets(f"{second.url}/readyz", 3)
    assert _readyz_count(httpx.get(f"{second.url}/metrics", timeout=30.0).text) == 3
