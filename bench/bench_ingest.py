#!/usr/bin/env python3
"""Ingest benchmark: trials/s through the HTTP API (batches of 1,000) against a raw COPY of the same rows.

Everything runs against real services: its own database ``iwscope_bench_<random>`` on the
server of ``$IWSCOPE_TEST_DATABASE_URL`` (default: the local stack), a real ``iwscope api``
process (uvicorn), real HTTP over loopback.  Each repetition ingests the same generated rows
once by raw ``COPY trials FROM STDIN`` (psycopg 3, one transaction per 1,000 rows; no
idempotency registry, no validation) and once through ``POST /api/v1/trials/batch``
(validation, auth, the ``trial_ids`` registry, staging COPY, set-based insert), emptying the
tables in between; the order alternates between repetitions.  Prints a table and writes
``bench/results/ingest.json``.

    .venv/bin/python bench/bench_ingest.py [--batches 40] [--batch-size 1000] [--repeat 3] [--clients 3]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import http.client
import json
import os
import pathlib
import platform
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import httpx
import orjson
import psycopg

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
import testenv  # the tests' one home for scratch databases

from iwprobe import wire

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "ingest.json"

TCPI = {
    "rtt": 20_500,
    "rttvar": 800,
    "min_rtt": 20_000,
    "total_retrans": 0,
    "segs_in": 75,
    "data_segs_in": 70,
    "rcv_space": 65_000,
    "rcv_mss": 1448,
    "bytes_received": 100_250,
    "snd_cwnd": 10,
    "rcv_rtt": 21_000,
    "pmtu": 1500,
    "rto": 204_000,
    "ato": 40_000,
    "snd_mss": 1448,
    "advmss": 1448,
    "state": 7,
    "ca_state": 0,
}


def make_trials(probe_id: str, origin_id: str, campaign_id: int, count: int, rng: random.Random) -> list[dict[str, Any]]:
    now = dt.datetime.now(dt.UTC)
    trials = []
    for index in range(count):
        iw = rng.choice((3, 10))
        size = rng.choice((1_000, 10_000, 100_000, 1_000_000))
        started = now - dt.timedelta(seconds=rng.randint(0, 86_400 * 20))
        trials.append(
            {
                "trial_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                "probe_id": probe_id,
                "campaign_id": campaign_id,
                "origin_id": origin_id,
                "round": index // 8,
                "arm_iw": iw,
                "object_size": size,
                "url": f"http://10.0.0.1:{8000 + iw}/obj/{size}",
                "started_at": wire.utc_timestamp(started),
                "dns_us": 0,
                "connect_us": rng.randint(10_000, 300_000),
                "ttfb_us": rng.randint(10_000, 300_000),
                "total_us": rng.randint(20_000, 3_000_000),
                "bytes_received": size + 250,
                "http_status": 200,
                "error_kind": None,
                "error_detail": None,
                "syn_retrans": 0,
                "tcp_info": {**TCPI, "rtt": rng.randint(1_000, 400_000)},
            }
        )
    return trials


COPY_COLUMNS = (
    "trial_id",
    "started_at",
    "probe_id",
    "campaign_id",
    "origin_id",
    "round",
    "arm_iw",
    "object_size",
    "url",
    "dns_us",
    "connect_us",
    "ttfb_us",
    "total_us",
    "bytes_received",
    "http_status",
    "error_kind",
    "error_detail",
    "syn_retrans",
    "tcpi_rtt_us",
    "tcpi_rttvar_us",
    "tcpi_min_rtt_us",
    "tcpi_total_retrans",
    "tcpi_segs_in",
    "tcpi_data_segs_in",
    "tcpi_rcv_space",
    "tcpi_rcv_mss",
    "tcpi_bytes_received",
    "tcp_info",
)


def copy_rows(trials: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    rows = []
    for t in trials:
        tcp = t["tcp_info"]
        rows.append(
            (
                t["trial_id"],
                t["started_at"],
                t["probe_id"],
                t["campaign_id"],
                t["origin_id"],
                t["round"],
                t["arm_iw"],
                t["object_size"],
                t["url"],
                t["dns_us"],
                t["connect_us"],
                t["ttfb_us"],
                t["total_us"],
                t["bytes_received"],
                t["http_status"],
                t["error_kind"],
                t["error_detail"],
                t["syn_retrans"],
                tcp.get("rtt"),
                tcp.get("rttvar"),
                tcp.get("min_rtt"),
                tcp.get("total_retrans"),
                tcp.get("segs_in"),
                tcp.get("data_segs_in"),
                tcp.get("rcv_space"),
                tcp.get("rcv_mss"),
                tcp.get("bytes_received"),
                orjson.dumps(tcp).decode(),
            )
        )
    return rows


def run_copy(libpq_url: str, batches: list[list[tuple[Any, ...]]]) -> float:
    """Seconds to COPY every batch into ``trials`` (one transaction each)."""
    with psycopg.connect(libpq_url) as connection:
        started = time.perf_counter()
        for rows in batches:
            with connection.cursor() as cursor, cursor.copy(f"COPY trials ({', '.join(COPY_COLUMNS)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            connection.commit()
        return time.perf_counter() - started


def run_http(base_url: str, credential: str, bodies: list[bytes], clients: int) -> tuple[float, list[float]]:
    """Seconds to POST every body with ``clients`` concurrent connections; per-request latencies."""
    headers = {"Authorization": f"Bearer {credential}", "Content-Type": "application/json"}
    latencies: list[float] = []

    def worker(chunk: list[bytes]) -> list[float]:
        times = []
        with httpx.Client(base_url=base_url, timeout=120.0) as client:
            for body in chunk:
                sent = time.perf_counter()
                response = client.post(wire.TRIALS_BATCH_PATH, content=body, headers=headers)
                times.append(time.perf_counter() - sent)
                if response.status_code != 200 or response.json()["duplicates"] != 0:
                    raise RuntimeError(f"upload failed: {response.status_code} {response.text[:300]}")
        return times

    chunks = [bodies[index::clients] for index in range(clients)]
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for times in pool.map(worker, chunks):
            latencies.extend(times)
    return time.perf_counter() - started, latencies


def run_http_stdlib(host: str, port: int, credential: str, bodies: list[bytes], clients: int) -> tuple[float, list[float]]:
    """As :func:`run_http`, with the standard library's ``http.client`` (what ``iwprobe``'s uploader
    uses, through ``urllib``), one keep-alive connection per client thread: a lighter client than
    httpx, so less of the shared 2 cores goes to the client."""
    headers = {"Authorization": f"Bearer {credential}", "Content-Type": "application/json"}
    latencies: list[float] = []

    def worker(chunk: list[bytes]) -> list[float]:
        times = []
        connection = http.client.HTTPConnection(host, port, timeout=120.0)
        try:
            for body in chunk:
                sent = time.perf_counter()
                connection.request("POST", wire.TRIALS_BATCH_PATH, body=body, headers=headers)
                response = connection.getresponse()
                payload = response.read()
                times.append(time.perf_counter() - sent)
                if response.status != 200 or orjson.loads(payload)["duplicates"] != 0:
                    raise RuntimeError(f"upload failed: {response.status} {payload[:300]!r}")
        finally:
            connection.close()
        return times

    chunks = [bodies[index::clients] for index in range(clients)]
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for times in pool.map(worker, chunks):
            latencies.extend(times)
    return time.perf_counter() - started, latencies


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (``/proc/<pid>/stat``)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def empty_tables(libpq_url: str) -> None:
    with psycopg.connect(libpq_url, autocommit=True) as connection:
        connection.execute("TRUNCATE trials, trial_ids")
        connection.execute("VACUUM ANALYZE trials")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--clients", type=int, default=3, help="concurrent HTTP connections")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument(
        "--client",
        choices=("stdlib", "httpx"),
        default="stdlib",
        help="HTTP client of the benchmark: stdlib http.client (as iwprobe) or httpx",
    )
    parser.add_argument("--output", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args()

    server = testenv.server_database_url()
    redis_url = testenv.server_redis_url().rsplit("/", 1)[0] + "/14"
    name = f"iwscope_bench_{secrets.token_hex(4)}"
    database_url = testenv.named_database_url(name, server)
    libpq_url = database_url.replace("postgresql+psycopg://", "postgresql://", 1)
    queue = f"iwscope-bench-{secrets.token_hex(4)}"
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "IWSCOPE_CELERY_QUEUE": queue,
        "IWSCOPE_LOG_LEVEL": "WARNING",
        "IWSCOPE_DRAIN_SECONDS": "0",
        "IWSCOPE_ENV": "development",
    }
    testenv.create_database(name, server_url=server)
    api: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run([sys.executable, "-m", "iwscope.cli", "db", "upgrade"], env=env, check=True)
        tokens = {
            kind: subprocess.run(
                [sys.executable, "-m", "iwscope.cli", "token", "create", "--kind", kind],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            for kind in ("enroll", "origin", "admin")
        }
        port = free_port()
        api = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "iwscope.cli",
                "api",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                str(args.workers),
            ],
            env=env,
        )
        base_url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(f"{base_url}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        with httpx.Client(base_url=base_url) as client:
            probe = client.post(
                wire.PROBE_ENROLL_PATH,
                json={"name": "bench", "region": "bench"},
                headers={"Authorization": f"Bearer {tokens['enroll']}"},
            ).json()
            origin = client.post(
                wire.ORIGIN_ENROLL_PATH,
                json={
                    "name": "bench",
                    "region": "bench",
                    "host": "10.0.0.1",
                    "arms": [{"iw": 3, "port": 8003}, {"iw": 10, "port": 8010}],
                },
                headers={"Authorization": f"Bearer {tokens['origin']}"},
            ).json()
            campaign = client.post(
                "/api/v1/campaigns",
                json={
                    "name": "bench",
                    "origin_ids": [origin["id"]],
                    "arms": [3, 10],
                    "sizes": [1000],
                    "starts_at": wire.utc_timestamp(),
                },
                headers={"Authorization": f"Bearer {tokens['admin']}"},
            ).json()
        rng = random.Random(1)
        trial_batches = [
            make_trials(probe["id"], origin["id"], campaign["id"], args.batch_size, rng) for _ in range(args.batches)
        ]
        bodies = [
            orjson.dumps(
                {
                    "wire_version": 1,
                    "batch_id": wire.new_id(),
                    "probe_id": probe["id"],
                    "sent_at": wire.utc_timestamp(),
                    "trials": trials,
                    "path_samples": [],
                }
            )
            for trials in trial_batches
        ]
        rows = [copy_rows(trials) for trials in trial_batches]
        total = args.batches * args.batch_size
        runs: list[dict[str, Any]] = []
        for repetition in range(args.repeat):
            order = ("copy", "http") if repetition % 2 == 0 else ("http", "copy")
            for mode in order:
                empty_tables(libpq_url)
                client_cpu, api_cpu = time.process_time(), process_cpu_seconds(api.pid)
                if mode == "copy":
                    seconds, latencies = run_copy(libpq_url, rows), []
                elif args.client == "stdlib":
                    seconds, latencies = run_http_stdlib("127.0.0.1", port, probe["credential"], bodies, args.clients)
                else:
                    seconds, latencies = run_http(base_url, probe["credential"], bodies, args.clients)
                client_cpu, api_cpu = time.process_time() - client_cpu, process_cpu_seconds(api.pid) - api_cpu
                runs.append(
                    {
                        "repetition": repetition,
                        "mode": mode,
                        "seconds": seconds,
                        "trials_per_s": total / seconds,
                        "request_p50_ms": 1000 * statistics.median(latencies) if latencies else None,
                        "client_cpu_ms_per_1000": 1000 * client_cpu / (total / 1000),
                        "api_cpu_ms_per_1000": 1000 * api_cpu / (total / 1000) if mode == "http" else None,
                        "load_average_1m": os.getloadavg()[0],
                    }
                )
                print(
                    f"rep {repetition} {mode:4s}: {total / seconds:10,.0f} trials/s ({seconds:.2f} s); CPU per "
                    f"1,000 trials: client {1000 * client_cpu / (total / 1000):.1f} ms"
                    + (f", API {1000 * api_cpu / (total / 1000):.1f} ms" if mode == "http" else "")
                    + f"; load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
        with psycopg.connect(libpq_url) as connection:
            stored = connection.execute("SELECT count(*) FROM trials").fetchone()[0]
        assert stored == total, f"expected {total} rows, found {stored}"
    finally:
        if api is not None:
            api.send_signal(signal.SIGTERM)
            api.wait(timeout=30)
        testenv.drop_database(name, server_url=server)
        import redis

        client = redis.Redis.from_url(redis_url)
        client.delete(queue)
        client.close()

    def summary(mode: str) -> dict[str, float]:
        rates = [run["trials_per_s"] for run in runs if run["mode"] == mode]
        return {
            "median": statistics.median(rates),
            "min": min(rates),
            "max": max(rates),
            "spread_pct": 100 * (max(rates) - min(rates)) / statistics.median(rates),
        }

    copy_stats, http_stats = summary("copy"), summary("http")
    ratio = http_stats["median"] / copy_stats["median"]
    print()
    print(f"{'path':<28}{'median/s':>12}{'min/s':>12}{'max/s':>12}{'spread':>9}")
    for label, stats in (
        ("raw COPY (psycopg)", copy_stats),
        (f"HTTP API ({args.workers}w/{args.clients}c/{args.client})", http_stats),
    ):
        print(f"{label:<28}{stats['median']:>12,.0f}{stats['min']:>12,.0f}{stats['max']:>12,.0f}{stats['spread_pct']:>8.0f}%")
    print(f"HTTP / COPY = {ratio:.2f} (target >= 0.5); HTTP median {http_stats['median']:,.0f}/s (target >= 20,000)")
    result = {
        "generated_at": wire.utc_timestamp(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "batches": args.batches,
        "batch_size": args.batch_size,
        "repeat": args.repeat,
        "clients": args.clients,
        "client": args.client,
        "api_workers": args.workers,
        "trials_per_run": total,
        "copy": copy_stats,
        "http": http_stats,
        "http_over_copy": ratio,
        "meets_targets": ratio >= 0.5 and http_stats["median"] >= 20_000,
        "runs": runs,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
