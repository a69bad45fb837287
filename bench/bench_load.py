#!/usr/bin/env python3
"""Load test: a fleet of simulated probes against the collector's API and ONE Celery worker.

Everything is real and local (loopback only): a database of its own
``iwscope_load_<random>`` on the server of ``$IWSCOPE_TEST_DATABASE_URL`` (default: the local
stack), its own Redis db index and Celery queue, one ``iwscope api --workers N`` (uvicorn,
``--api-workers``, default 1 process) and one ``iwscope worker --concurrency 1``.  The driver
is asyncio (one process, its open-file limit raised; each simulated probe has one kept-alive
HTTP/1.1 connection on bare asyncio streams, ``ProbeConnection``, and its event-loop lag is
reported so the driver's own share of the latency is visible):

1. enrolls ``--probes`` probes through ``POST /api/v1/probes/enroll`` (32 at a time) and one
   origin, creates a campaign;
2. runs stages with more and more active probes (``--stages``, e.g. 250,1000 or 10000), each
   ``--stage-s`` seconds.  Every active probe loops as ``iwprobe run`` does: pull its schedule
   with ``If-None-Match`` (304 while unchanged), measure a round of ``--batch-min``..``--batch-max``
   trials -- their observations go to its origin at once, as the origin serves them -- for
   ``--think-s`` (randomised +-50 %), then upload the round's batch (carrying its heartbeat once a
   minute) (``POST /api/v1/trials/batch``); so an observation usually reaches the collector
   before its trial (until 2026-11-28 the driver handed them over after the upload).
   ``--origins`` simulated origins (probes assigned round
   robin) upload what they were handed as ``iwprobe origin``'s uploader does: everything
   pending, in batches of at most ``wire.MAX_BATCH_RECORDS``, then a pause of 2 s
   (``Uploader.run_forever``).  A refused (503) upload of either kind is sent again when
   iwprobe's spools would send it (its ``Retry-After``, or exponential backoff after repeated
   refusals); the latency counted is the accepted request's;
3. samples every second: the Celery queue length in Redis (the worker's backlog) and the
   CPU seconds of the API processes, the worker (with its pool), the PostgreSQL backends of
   this database, and the driver itself, from ``/proc``, and every 5 s the API's upload limit
   (``iwscope_admission_upload_limit``).

Per stage: sustained trials/s (stored, i.e. 200 answers), p50/p99 upload latency of accepted
uploads, every status answered, error share, backlog, CPU shares -- the stage where trials/s
stops growing while latency grows is where it saturates, and the CPU shares say which process
limits it (the driver's own share included).  Writes ``bench/results/load.json``.
``--keep-database`` leaves the run's database in place (to EXPLAIN the worker's statements on
a fleet's data afterwards).

    .venv/bin/python bench/bench_load.py [--probes 1000] [--stages 250,1000] [--stage-s 30]
    .venv/bin/python bench/bench_load.py --probes 10000 --stages 10000 --think-s 60 --batch-min 10 --batch-max 30
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import gc
import json
import os
import pathlib
import platform
import random
import re
import resource
import secrets
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import psycopg
import redis

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
import testenv
from bench_ingest import COPY_COLUMNS, TCPI, copy_rows, free_port

from iwprobe import wire
from iwprobe._collector import CollectorError
from iwprobe._upload import retry_delay
from iwscope import worker_client

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "load.json"
#: Trials the raw COPY baseline stores (and deletes) before the stages of each run.
COPY_BASELINE_ROWS = 20_000
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: A simulated probe's heartbeat interval (``iwprobe run --heartbeat-s``, default 60 s).
HEARTBEAT_S = 60.0


# ------------------------------------------------------------------------------ /proc


def _cpu_seconds(pid: int) -> float:
    """utime + stime of one process, seconds (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (OSError, IndexError):
        return 0.0


def _group_pids(pgid: int) -> list[int]:
    """Every process in process group ``pgid`` (the worker and its pool children)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[2]) == pgid:
                        pids.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return pids


#: The process a backend's ``application_name`` names (``iwscope[1234]``, ``iwscope-upload-lane[1234]``).
_OWNER_PID = re.compile(r"\[(\d+)\]")


class CpuMeter:
    """Cumulative CPU seconds per role, robust to processes appearing and exiting between samples."""

    def __init__(self) -> None:
        #: Per (role, pid): a pid may count in two roles (PostgreSQL's and its owner's share of it).
        self.last: dict[tuple[str, int], float] = {}
        self.totals: dict[str, float] = {}

    def sample(self, roles: dict[str, list[int]]) -> dict[str, float]:
        for role, pids in roles.items():
            for pid in pids:
                now = _cpu_seconds(pid)
                # First sight of a pid: count from here (sampled every second, so little is missed).
                delta = now - self.last.get((role, pid), now)
                self.last[role, pid] = now
                self.totals[role] = self.totals.get(role, 0.0) + max(0.0, delta)
            self.totals.setdefault(role, 0.0)
        return dict(self.totals)


# ----------------------------------------------------------------------------- records


def make_trials(probe_id: str, origin_id: str, campaign_id: int, count: int, rng: random.Random) -> list[dict[str, Any]]:
    now = dt.datetime.now(dt.UTC)
    trials = []
    for index in range(count):
        iw = rng.choice((3, 10))
        size = rng.choice((1_000, 10_000, 100_000))
        trials.append(
            {
                "trial_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                "probe_id": probe_id,
                "campaign_id": campaign_id,
                "origin_id": origin_id,
                "round": index // 6,
                "arm_iw": iw,
                "object_size": size,
                "url": f"http://10.0.0.1:{8000 + iw}/obj/{size}",
                "started_at": wire.utc_timestamp(now - dt.timedelta(seconds=rng.randint(1, 3600))),
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


def make_observations(trials: list[dict[str, Any]], origin_id: str, rng: random.Random) -> list[dict[str, Any]]:
    return [
        {
            "trial_id": t["trial_id"],
            "origin_id": origin_id,
            "arm_iw": t["arm_iw"],
            "port": 8000 + t["arm_iw"],
            "client_addr": "10.0.0.2",
            "object_size": t["object_size"],
            "request_at": t["started_at"],
            "first_byte_us": 50,
            "response_latency_us": rng.randint(10_000, 2_000_000),
            "snd_cwnd_at_accept": t["arm_iw"],
            "cwnd_mismatch": False,
            "rwnd_limited": False,
            "peer_rwnd": 65_535,
            "http_status": 200,
            "error_kind": None,
            "tcp_info": {"total_retrans": 0, "bytes_retrans": 0, "bytes_sent": t["object_size"] + 200, "snd_cwnd": 20},
        }
        for t in trials
    ]


# ------------------------------------------------------------------------------ driver


@dataclass
class Stats:
    upload_latencies: list[float] = field(default_factory=list)
    trials_stored: int = 0
    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    #: Every HTTP status answered, with its count (200, 204, 304, 503, ...).
    statuses: dict[int, int] = field(default_factory=dict)
    #: How late the driver's own 50 ms timer fired (s): latency the driver adds to every request.
    driver_lags: list[float] = field(default_factory=list)

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


#: The pause of ``iwprobe origin``'s uploader between drains (``Uploader.run_forever`` idle_s).
ORIGIN_IDLE_S = 2.0


@dataclass
class SimulatedOrigin:
    """One enrolled origin and the observations its spool holds, not yet uploaded."""

    enrolled: dict[str, str]
    pending: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Fleet:
    base_url: str
    probes: list[dict[str, str]]
    origins: list[SimulatedOrigin]
    campaign_id: int
    think_s: float
    batch_min: int
    batch_max: int
    #: Skip the schedule poll after an upload whose answer named the cached ETag, as iwprobe does
    #: (``--poll-every-cycle``: poll every cycle, as probes before 2026-11-28 did).
    schedule_from_uploads: bool = True
    stats: Stats = field(default_factory=Stats)


#: A probe drops an idle connection after this long, before uvicorn does (5 s): a request sent
#: on a connection the server is closing at that moment fails with a read error.
KEEPALIVE_S = 4.0
#: The probe's own collector timeout (iwprobe Credentials.client).
REQUEST_TIMEOUT_S = 30.0
#: Seconds between two reads of the API's upload limit during a stage: a read of ``/metrics`` cost
#: the API 2.1-2.75 ms of CPU when idle (3 x 200 reads, 2026-12-02), 1 % of its CPU at the fleet's shape
#: if read every second, which the stage's API CPU per trial would then count.
UPLOAD_LIMIT_EVERY_S = 5
#: The longest wait between upload retries of ``iwprobe run`` (``--backoff-cap``) and ``iwprobe origin``.
AGENT_BACKOFF_CAP_S = 60.0


@dataclass
class Answer:
    status_code: int
    headers: dict[str, str]
    content: bytes


class ProbeConnection:
    """A simulated probe's one kept-alive HTTP/1.1 connection, on bare asyncio streams.

    Not httpx: one client shared by the fleet spent 0.6 cores and seconds per request in
    httpcore's pool (it scans every connection for every queued request on every request start
    and end), and one httpx client per probe still left the driver's event loop 0.8 s late
    (p50) at 1,000 probes on 2 cores -- latency the first runs reported as the collector's.
    The collector answers with ``Content-Length`` bodies, which is all this reads."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.idle_since = 0.0

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None

    async def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Answer:
        """One exchange; a kept-alive connection the server closed meanwhile (no answer byte
        came back) is replaced and the request sent once more, as HTTP clients do."""
        reused = self.writer is not None
        try:
            return await self._exchange(method, path, body, headers)
        except (ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError) as error:
            if not reused or (isinstance(error, asyncio.IncompleteReadError) and error.partial):
                raise
            return await self._exchange(method, path, body, headers)

    async def _exchange(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Answer:
        if self.writer is not None and time.monotonic() - self.idle_since > KEEPALIVE_S:
            await self.close()
        if self.writer is None:
            self.reader, self.writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), REQUEST_TIMEOUT_S)
        assert self.reader is not None
        head = [
            f"{method} {path} HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            f"Content-Length: {len(body or b'')}",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        try:
            self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + (body or b""))
            answer = await asyncio.wait_for(self._read_answer(self.reader), REQUEST_TIMEOUT_S)
        except BaseException:
            await self.close()
            raise
        if answer.headers.get("connection", "").lower() == "close":
            await self.close()
        self.idle_since = time.monotonic()
        return answer

    @staticmethod
    async def _read_answer(reader: asyncio.StreamReader) -> Answer:
        lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        return Answer(status, headers, await reader.readexactly(length) if length else b"")


#: What a failed request raises (counted by class name, as the probe would log it).
REQUEST_ERRORS = (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError)


async def _request(
    connection: ProbeConnection,
    fleet: Fleet,
    method: str,
    path: str,
    credential: str,
    body: bytes | None = None,
    what: str = "",
    extra_headers: dict[str, str] | None = None,
    retry_after: list[float] | None = None,
) -> Answer | None:
    """One request; ``None`` (and an error counted by kind) unless it was answered 2xx/304.
    A 503's ``Retry-After`` (seconds) is appended to ``retry_after`` when given.  Counted in
    ``fleet.stats`` as it is when the request ends: the stage it ends in."""
    headers = {"Authorization": f"Bearer {credential}", "Content-Type": "application/json", **(extra_headers or {})}
    try:
        response = await connection.request(method, path, body, headers)
    except REQUEST_ERRORS as error:
        stats = fleet.stats
        stats.requests += 1
        stats.error(f"{what}:{type(error).__name__}")
        return None
    stats = fleet.stats
    stats.requests += 1  # counted when it ends, in the stage it ends in
    stats.statuses[response.status_code] = stats.statuses.get(response.status_code, 0) + 1
    if response.status_code == 503 and retry_after is not None:
        retry_after.append(float(response.headers.get("retry-after", "1")))
    if response.status_code >= 300 and response.status_code != 304:
        stats.error(f"{what}:{response.status_code}")
        return None
    return response


async def simulated_probe(fleet: Fleet, index: int, stop: asyncio.Event) -> None:
    """One probe's cycle as ``iwprobe run`` does it: the schedule with ``If-None-Match`` (304
    while unchanged), an upload (carrying its heartbeat once per HEARTBEAT_S),
    then its origin's observations, then a pause of ``think_s`` +-50 %."""
    url = urlsplit(fleet.base_url)
    connection = ProbeConnection(url.hostname or "127.0.0.1", url.port or 80)
    try:
        await _probe_cycles(fleet, index, connection, stop)
    finally:
        await connection.close()


async def _probe_cycles(fleet: Fleet, index: int, client: ProbeConnection, stop: asyncio.Event) -> None:
    probe = fleet.probes[index]
    origin = fleet.origins[index % len(fleet.origins)]
    rng = random.Random(index)
    etag: str | None = None
    confirmed = False  # the last upload's answer named this ETag (iwprobe then skips its poll)
    beat_at = -HEARTBEAT_S  # when this probe's last heartbeat went out
    await asyncio.sleep(rng.uniform(0, fleet.think_s / 2))  # spread the first requests (a round follows)
    while not stop.is_set():
        schedule_path = wire.PROBE_SCHEDULE_PATH.format(probe_id=probe["id"]) + f"?wire_version={wire.WIRE_VERSION}"
        if not (confirmed and fleet.schedule_from_uploads):
            conditional = {"If-None-Match": etag} if etag else None
            answer = await _request(client, fleet, "GET", schedule_path, probe["credential"], None, "schedule", conditional)
            if answer is not None:
                etag = answer.headers.get("etag", etag)
        trials = make_trials(
            probe["id"], origin.enrolled["id"], fleet.campaign_id, rng.randint(fleet.batch_min, fleet.batch_max), rng
        )
        # The round: its fetches reach the origin now (its uploader sends them within ORIGIN_IDLE_S),
        # the probe uploads after the round, as iwprobe's agent does -- so an observation usually
        # arrives before its trial.
        origin.pending.extend(make_observations(trials, origin.enrolled["id"], rng))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=fleet.think_s * rng.uniform(0.5, 1.5))
        if stop.is_set():
            break
        batch: dict[str, Any] = {
            "wire_version": wire.WIRE_VERSION,
            "batch_id": wire.new_id(),
            "probe_id": probe["id"],
            "sent_at": wire.utc_timestamp(),
            "trials": trials,
            "path_samples": [],
        }
        beat_due = time.monotonic() - beat_at >= HEARTBEAT_S  # one per interval, as iwprobe's uploader does
        if beat_due:
            batch["heartbeat"] = {
                "version": "load",
                "spool_backlog": len(trials),
                "spool_bytes": 0,
                "uptime_s": 1.0,
                "trials_measured": len(trials),
            }
        body = orjson.dumps(batch)
        answer, latency_s = await _send_until_accepted(
            client, fleet, wire.TRIALS_BATCH_PATH, probe["credential"], body, "upload", stop, rng
        )
        confirmed = False
        if answer is not None:
            # The stage the upload ended in, read now: a cycle (a round of think_s, then the
            # upload) often starts in one stage and ends in the next, and counted into the stage
            # it started in, a stage of 60 s rounds lost most of its uploads to the one before.
            stats = fleet.stats
            stats.upload_latencies.append(latency_s)
            stats.trials_stored += len(trials)
            beat_at = time.monotonic() if beat_due else beat_at
            confirmed = etag is not None and orjson.loads(answer.content).get("schedule_etag") == etag


async def simulated_origin(fleet: Fleet, origin: SimulatedOrigin, stop: asyncio.Event) -> None:
    """``iwprobe origin``'s uploader: drain the spool in batches of at most
    ``wire.MAX_BATCH_RECORDS`` (a refused batch is sent again after ``Retry-After``), pause
    :data:`ORIGIN_IDLE_S`, again."""
    url = urlsplit(fleet.base_url)
    client = ProbeConnection(url.hostname or "127.0.0.1", url.port or 80)
    rng = random.Random(origin.enrolled["id"])
    try:
        while not stop.is_set():
            while origin.pending and not stop.is_set():
                records = origin.pending[: wire.MAX_BATCH_RECORDS]
                body = orjson.dumps(
                    {
                        "wire_version": wire.WIRE_VERSION,
                        "batch_id": wire.new_id(),
                        "origin_id": origin.enrolled["id"],
                        "sent_at": wire.utc_timestamp(),
                        "observations": records,
                    }
                )
                answer, _ = await _send_until_accepted(
                    client,
                    fleet,
                    wire.OBSERVATIONS_BATCH_PATH,
                    origin.enrolled["credential"],
                    body,
                    "observations",
                    stop,
                    rng,
                )
                if answer is None:
                    break  # not refused but failed (or stopping): the spool keeps it for the next drain
                del origin.pending[: len(records)]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=ORIGIN_IDLE_S)
    finally:
        await client.close()


async def _send_until_accepted(
    client: ProbeConnection,
    fleet: Fleet,
    path: str,
    credential: str,
    body: bytes,
    what: str,
    stop: asyncio.Event,
    rng: random.Random,
) -> tuple[Answer | None, float]:
    """POST ``body``, sending it again after each 503 when iwprobe's uploader would
    (:func:`iwprobe._upload.retry_delay`: its Retry-After x 1-1.5, or exponential backoff with
    full jitter after repeated refusals, whichever is longer; the agents' 60 s cap); the last
    answer and the last attempt's latency (the accepted request's, when accepted).

    Until 2026-12-02 the driver waited the Retry-After alone, every time: at 4x the saturating
    probe count its probes came back every 2-3 s however often they had been refused, as no
    iwprobe does."""
    attempt = 0
    while True:
        refused: list[float] = []
        sent = time.perf_counter()
        answer = await _request(client, fleet, "POST", path, credential, body, what, retry_after=refused)
        if answer is not None or not refused or stop.is_set():
            return answer, time.perf_counter() - sent
        error = CollectorError(f"{what}: HTTP 503", 503, None, refused[0])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=retry_delay(error, attempt, 1.0, AGENT_BACKOFF_CAP_S, rng))
        attempt += 1


async def enroll_fleet(base_url: str, enroll_token: str, count: int, in_flight: int = 32) -> list[dict[str, str]]:
    """Enroll ``count`` probes through the API, ``in_flight`` at a time over kept-alive
    connections (a 503 is retried after its Retry-After, as probes do; a request on a kept-alive
    connection the server closed at that moment is sent again: at worst a probe is enrolled
    twice, one unused row)."""
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    probes: list[dict[str, str] | None] = [None] * count
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(count):
        queue.put_nowait(index)

    async def enroller(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            index = queue.get_nowait()
            for attempt in range(100):
                try:
                    answer = await client.post(
                        wire.PROBE_ENROLL_PATH,
                        json={"name": f"load-{index}", "region": "load"},
                        headers={"Authorization": f"Bearer {enroll_token}"},
                    )
                except httpx.TransportError:
                    if attempt >= 3:
                        raise
                    continue
                if answer.status_code != 503:
                    break
                await asyncio.sleep(float(answer.headers.get("retry-after", "1")))
            answer.raise_for_status()
            probes[index] = answer.json()

    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:
        await asyncio.gather(*(enroller(client) for _ in range(in_flight)))
    return [probe for probe in probes if probe is not None]


def raise_open_files_limit() -> int:
    """Raise this process's (and its children's) open-file limit to the hard limit: a fleet of
    10,000 probes keeps that many sockets open in the driver and in the API."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@dataclass
class ServerCounts:
    """What the API's ``/metrics`` says (summed over its processes) at one moment."""

    #: Cumulative counts per bucket bound of the upload latency histogram.
    upload_buckets: dict[float, float] = field(default_factory=dict)
    #: Requests refused at the front door, by ``kind:reason`` (``probe:in_progress``, ``probe:loop_lag``, ...).
    refused: dict[str, float] = field(default_factory=dict)
    #: Uploads the API's processes take at once (``iwscope_admission_upload_limit``, summed).
    upload_limit: float | None = None


async def _server_counts(base_url: str) -> ServerCounts:
    """The API's counters now (empty if unreachable)."""
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=10.0) as metrics_client:
            text = (await metrics_client.get("/metrics")).text
    except httpx.HTTPError:
        return ServerCounts()
    counts = ServerCounts()
    for line in text.splitlines():
        if (
            line.startswith("iwscope_http_request_duration_seconds_bucket{")
            and 'route="/api/v1/trials/batch"' in line
            and 'method="POST"' in line
        ):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            counts.upload_buckets[float(bound)] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("iwscope_admission_upload_limit "):
            counts.upload_limit = float(line.rsplit(" ", 1)[1])
        elif line.startswith("iwscope_admission_rejected_total{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            counts.refused[f"{kind}:{reason}"] = float(line.rsplit(" ", 1)[1])
    return counts


def _bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """Upper bucket bound below which a share ``q`` of this stage's uploads fell (server side)."""
    bounds = sorted(after)
    counts = [after[bound] - before.get(bound, 0.0) for bound in bounds]
    if not counts or counts[-1] <= 0:
        return None
    for bound, count in zip(bounds, counts, strict=True):
        if count >= q * counts[-1]:
            return bound
    return None


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _watch_driver_lag(fleet: Fleet, stop: asyncio.Event) -> None:
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(0.05)
        fleet.stats.driver_lags.append(max(0.0, time.perf_counter() - before - 0.05))


async def run_stages(fleet: Fleet, stages: list[int], stage_s: float, sampler: Any) -> list[dict[str, Any]]:
    # The driver's own garbage collector: a full collection over the state of 10,000 simulated
    # probes (their pending observations, tasks, connections) paused its event loop for 1.0-1.2 s
    # every ~18 s, and the uploads due meanwhile then went out at once -- 100-200 arriving in
    # 100 ms at one API process, which its front door turned away (2-3 % of the steady stage's
    # requests): an artefact of one process playing 10,000 machines.  So the state built so far
    # is frozen out of the collector and automatic collections are off while the stages run
    # (what the probes drop is freed by reference counting; one collection after the stages).
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        return await _run_stages(fleet, stages, stage_s, sampler)
    finally:
        gc.enable()
        gc.unfreeze()
        gc.collect()


async def _run_stages(fleet: Fleet, stages: list[int], stage_s: float, sampler: Any) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    stop = asyncio.Event()
    helpers: list[asyncio.Task[None]] = [
        asyncio.create_task(_watch_driver_lag(fleet, stop)),
        *(asyncio.create_task(simulated_origin(fleet, origin, stop)) for origin in fleet.origins),
    ]
    tasks: list[asyncio.Task[None]] = []
    for active in stages:
        while len(tasks) < active:
            tasks.append(asyncio.create_task(simulated_probe(fleet, len(tasks), stop)))
        fleet.stats = Stats()
        server_before = await _server_counts(fleet.base_url)
        cpu_before = sampler.cpu()
        started = time.monotonic()
        samples: list[dict[str, Any]] = []
        while time.monotonic() - started < stage_s:
            await asyncio.sleep(1.0)
            sampler.cpu()
            samples.append(
                {
                    "t": round(time.monotonic() - started, 1),
                    "backlog": sampler.backlog(),
                    "join_pending_trials": sampler.join_pending_trials(),
                    "origin_spools": sum(len(origin.pending) for origin in fleet.origins),
                    "trials_stored": fleet.stats.trials_stored,
                    # Every UPLOAD_LIMIT_EVERY_S seconds only: each read of /metrics is API CPU.
                    "upload_limit": (await _server_counts(fleet.base_url)).upload_limit
                    if len(samples) % UPLOAD_LIMIT_EVERY_S == 0
                    else None,
                }
            )
        elapsed = time.monotonic() - started
        cpu_after = sampler.cpu()
        server_after = await _server_counts(fleet.base_url)
        stats = fleet.stats
        cpu_share = {role: round((cpu_after.get(role, 0) - cpu_before.get(role, 0)) / elapsed, 3) for role in cpu_after}
        row = {
            "active_probes": active,
            "seconds": round(elapsed, 1),
            "trials_per_s": round(stats.trials_stored / elapsed, 1),
            # What the active probes would upload at their mean round (think_s) and batch size,
            # were every upload answered at once: the stage's stored rate approaches it once the
            # probes' rounds are spread (not in a stage of first contact).
            "offered_trials_per_s": round(active * (fleet.batch_min + fleet.batch_max) / 2 / fleet.think_s, 1),
            "uploads": len(stats.upload_latencies),
            "requests": stats.requests,
            "upload_p50_ms": _ms(statistics.median(stats.upload_latencies) if stats.upload_latencies else None),
            "upload_p99_ms": _ms(_percentile(stats.upload_latencies, 0.99)),
            "error_share": round(sum(stats.errors.values()) / max(1, stats.requests), 4),
            "errors": stats.errors,
            "statuses": {str(code): count for code, count in sorted(stats.statuses.items())},
            "backlog_start": samples[0]["backlog"],
            "backlog_max": max(s["backlog"] for s in samples),
            "backlog_end": samples[-1]["backlog"],
            # Trials whose join is asked for and not yet done (the API sends the ids of 50 ms of
            # uploads as one entry, so entries alone undercount): flat when the worker keeps up.
            "join_pending_trials_start": samples[0]["join_pending_trials"],
            "join_pending_trials_max": max(s["join_pending_trials"] for s in samples),
            "join_pending_trials_end": samples[-1]["join_pending_trials"],
            "join_pending_trials_series": [s["join_pending_trials"] for s in samples],
            # Least-squares trend over the stage (trials/s): a worker falling behind shows as a
            # clearly positive slope; drains in bursts make start and end alone noisy.
            "join_pending_trials_slope_per_s": _slope([s["t"] for s in samples], [s["join_pending_trials"] for s in samples]),
            "cpu_cores": cpu_share,
            # CPU per stored trial (us) of each role: the "API CPU per trial", per stage.
            "cpu_us_per_trial": {
                role: round(1e6 * cores / (stats.trials_stored / elapsed), 1) if stats.trials_stored else None
                for role, cores in cpu_share.items()
            },
            "backlog_series": [s["backlog"] for s in samples],
            # The API's upload limit every UPLOAD_LIMIT_EVERY_S seconds (admission.UploadLimit; the
            # door's own limit while uploads are fast).
            "upload_limit_series": [s["upload_limit"] for s in samples if s["upload_limit"] is not None],
            # Observations the simulated origins hold, not yet accepted (their spools' backlog).
            "origin_spool_max": max(s["origin_spools"] for s in samples),
            "origin_spool_end": samples[-1]["origin_spools"],
            # In the API, from request received to answer (bucket bounds of its histogram;
            # +Inf = over 10 s): the rest of the client's latency is queueing before the API
            # (its event loop, the kernel's accept queue) or in the driver itself.
            "server_upload_p50_s": _bucket_quantile(server_before.upload_buckets, server_after.upload_buckets, 0.5),
            "server_upload_p99_s": _bucket_quantile(server_before.upload_buckets, server_after.upload_buckets, 0.99),
            # Why the front door refused (the rest of the 503s: no database connection in time).
            "refused_by_admission": {
                key: int(value - server_before.refused.get(key, 0.0)) for key, value in sorted(server_after.refused.items())
            },
            # The driver's own event-loop lag: a share of the client latency that is the driver's.
            "driver_lag_p50_ms": _ms(_percentile(stats.driver_lags, 0.5)),
            "driver_lag_p99_ms": _ms(_percentile(stats.driver_lags, 0.99)),
            "driver_lag_max_ms": _ms(max(stats.driver_lags) if stats.driver_lags else None),
        }
        results.append(row)
        print(
            f"{active:5d} probes: {row['trials_per_s']:8.0f} trials/s (offered {row['offered_trials_per_s']:.0f})  "
            f"upload p50 {row['upload_p50_ms']} ms "
            f"p99 {row['upload_p99_ms']} ms  errors {100 * row['error_share']:.1f} %  backlog start "
            f"{row['backlog_start']} max {row['backlog_max']} end {row['backlog_end']} (trials waiting for their "
            f"join {row['join_pending_trials_start']} -> {row['join_pending_trials_end']})  origin spools max "
            f"{row['origin_spool_max']} end {row['origin_spool_end']}  cpu {cpu_share}  us/trial "
            f"{row['cpu_us_per_trial']}  server-side upload "
            f"p50 <= {row['server_upload_p50_s']} s p99 <= {row['server_upload_p99_s']} s  driver lag p50 "
            f"{row['driver_lag_p50_ms']} ms p99 {row['driver_lag_p99_ms']} ms max {row['driver_lag_max_ms']} ms  "
            "refused at the door "
            f"{row['refused_by_admission']}",
            flush=True,
        )
    stop.set()
    for task in [*tasks, *helpers]:  # requests still waiting on a saturated API are abandoned, not awaited
        task.cancel()
    await asyncio.gather(*tasks, *helpers, return_exceptions=True)
    return results


def _slope(times: list[float], values: list[int]) -> float | None:
    """Least-squares slope of ``values`` over ``times`` (per second)."""
    if len(times) < 2:
        return None
    return round(statistics.linear_regression(times, values).slope, 1)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 1)


class Sampler:
    def __init__(self, api_pid: int, worker_pgid: int, libpq_url: str, database: str, redis_url: str, queue: str) -> None:
        self.api_pid = api_pid
        self.worker_pgid = worker_pgid
        self.meter = CpuMeter()
        self.database = database
        self.pg = psycopg.connect(libpq_url, autocommit=True)
        self.redis = redis.Redis.from_url(redis_url)
        self.queue = queue

    def cpu(self) -> dict[str, float]:
        backends = self.pg.execute(
            "SELECT pid, application_name FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (self.database,),
        ).fetchall()
        # The API's process group: its uvicorn supervisor and every worker process.
        api, worker = _group_pids(self.api_pid), _group_pids(self.worker_pgid)
        # Whose backend: iwscope names each connection after its process (``iwscope[<pid>]``,
        # ``iwscope-upload-lane[<pid>]``), so PostgreSQL's CPU splits into the ingest's (the
        # API's) and the joins' (the worker's).
        owners = {pid: int(match.group(1)) if (match := _OWNER_PID.search(name or "")) else None for pid, name in backends}
        return self.meter.sample(
            {
                "api": api,
                "worker": worker,
                "postgres": [pid for pid, _ in backends],
                "postgres_for_api": [pid for pid, owner in owners.items() if owner in api],
                "postgres_for_worker": [pid for pid, owner in owners.items() if owner in worker],
                "driver": [os.getpid()],
            }
        )

    def backlog(self) -> int:
        """Tasks in the Celery queue plus upload batches waiting for a join drain (one drain
        message stands for up to 1,000 of them)."""
        pending = f"iwscope:{self.queue}:{worker_client.JOIN_PENDING}"
        return int(self.redis.llen(self.queue)) + int(self.redis.llen(pending))

    def join_pending_trials(self) -> int:
        """Trial ids in the entries waiting for a join drain."""
        pending = f"iwscope:{self.queue}:{worker_client.JOIN_PENDING}"
        return sum(len(orjson.loads(entry).get("t", [])) for entry in self.redis.lrange(pending, 0, -1))

    def close(self) -> None:
        self.pg.close()
        self.redis.close()


def copy_baseline(
    libpq_url: str, probe_id: str, origin_id: str, campaign_id: int, batch_min: int, batch_max: int
) -> dict[str, Any]:
    """The raw COPY of this run's trial rows, on this run's database and box, right before the
    stages: rows of the fleet's shape (``make_trials``, the columns of ``bench_ingest``) in
    transactions of the fleet's batch sizes, by plain psycopg.  CPU per row of the PostgreSQL
    backend and of the client (this process's thread): what storing a trial costs without the
    API.  The rows are deleted afterwards."""
    rng = random.Random(20261127)
    batches: list[list[dict[str, Any]]] = []
    while sum(len(batch) for batch in batches) < COPY_BASELINE_ROWS:
        batches.append(make_trials(probe_id, origin_id, campaign_id, rng.randint(batch_min, batch_max), rng))
    rows = [copy_rows(batch) for batch in batches]
    count = sum(len(batch) for batch in rows)
    with psycopg.connect(libpq_url) as connection:
        backend = int(connection.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        connection.commit()
        backend_before, client_before, started = _cpu_seconds(backend), time.thread_time(), time.perf_counter()
        for batch in rows:
            with connection.cursor() as cursor, cursor.copy(f"COPY trials ({', '.join(COPY_COLUMNS)}) FROM STDIN") as copy:
                for row in batch:
                    copy.write_row(row)
            connection.commit()
        elapsed = time.perf_counter() - started
        backend_s, client_s = _cpu_seconds(backend) - backend_before, time.thread_time() - client_before
        connection.execute("DELETE FROM trials WHERE trial_id = ANY(%s::uuid[])", ([t["trial_id"] for b in batches for t in b],))
        connection.commit()
    result = {
        "rows": count,
        "transactions": len(rows),
        "rows_per_s": round(count / elapsed, 1),
        "postgres_us_per_trial": round(1e6 * backend_s / count, 1),
        "client_us_per_trial": round(1e6 * client_s / count, 1),
        "us_per_trial": round(1e6 * (backend_s + client_s) / count, 1),
    }
    print(
        f"raw COPY baseline: {count} trials in {len(rows)} transactions, {result['rows_per_s']:,.0f}/s, "
        f"{result['us_per_trial']} us of CPU per trial (PostgreSQL {result['postgres_us_per_trial']}, "
        f"client {result['client_us_per_trial']})",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--probes", type=int, default=1000)
    parser.add_argument("--stages", default="100,250,500,1000", help="active probes per stage")
    parser.add_argument("--stage-s", type=float, default=30.0)
    parser.add_argument("--think-s", type=float, default=10.0, help="mean pause of a probe between uploads")
    parser.add_argument("--batch-min", type=int, default=50)
    parser.add_argument("--batch-max", type=int, default=200)
    parser.add_argument(
        "--poll-every-cycle",
        action="store_true",
        help="every probe polls its schedule each cycle, even when its last upload's answer named the current ETag",
    )
    parser.add_argument(
        "--origins", type=int, default=10, help="simulated origins the probes' observations come from (round robin)"
    )
    parser.add_argument("--drain-timeout-s", type=float, default=300.0)
    parser.add_argument("--output", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--api-workers", type=int, default=1, help="API processes (iwscope api --workers N)")
    parser.add_argument(
        "--keep-database",
        action="store_true",
        help="leave the run's database in place (its name is printed) to inspect plans afterwards",
    )
    parser.add_argument(
        "--api-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment of the API process, e.g. IWSCOPE_DB_POOL_SIZE=20 (repeatable)",
    )
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment of the worker, e.g. IWSCOPE_LOG_LEVEL=INFO to log each task's duration (repeatable)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the whole benchmark N times (fresh database, API and worker each time): OUTPUT-runK.json "
        "per run and, in OUTPUT, each run's last stage and the medians",
    )
    args = parser.parse_args()
    stages = [int(value) for value in args.stages.split(",")]
    if max(stages) > args.probes:
        parser.error("a stage cannot have more active probes than --probes")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.repeat == 1:
        run_once(args, stages, args.output)
        return
    outputs = [
        args.output.with_name(f"{args.output.stem}-run{number}{args.output.suffix}") for number in range(1, args.repeat + 1)
    ]
    results = []
    for number, output in enumerate(outputs, start=1):
        print(f"== run {number} of {args.repeat}", flush=True)
        results.append(run_once(args, stages, output))
    summary = summarize(results, outputs)
    args.output.write_text(json.dumps(summary, indent=2) + "\n")
    for name, values in summary["last_stage"].items():
        print(f"{name}: median {values['median']}  runs {values['runs']}")
    print(f"wrote {args.output}")


#: What :func:`summarize` reports of each run's last stage (the steady one of a fleet run).
SUMMARY_FIELDS = (
    "trials_per_s",
    "error_share",
    "upload_p99_ms",
    "backlog_start",
    "backlog_end",
    "join_pending_trials_start",
    "join_pending_trials_end",
    "join_pending_trials_slope_per_s",
)


def summarize(results: list[dict[str, Any]], outputs: list[pathlib.Path]) -> dict[str, Any]:
    """The repeated runs side by side: each run's last stage, the CPU per stored trial of each
    role and the raw COPY baseline, every value and the median."""
    columns: dict[str, list[Any]] = {}
    for result in results:
        last = result["stages"][-1]
        for name in SUMMARY_FIELDS:
            columns.setdefault(name, []).append(last[name])
        for role, value in last["cpu_us_per_trial"].items():
            columns.setdefault(f"{role}_us_per_trial", []).append(value)
        columns.setdefault("copy_baseline_us_per_trial", []).append(result["copy_baseline"]["us_per_trial"])
        columns.setdefault("load_average_at_start", []).append(result["load_average_at_start"][0])
    return {
        "generated_at": wire.utc_timestamp(),
        "runs": [str(output) for output in outputs],
        "last_stage": {
            name: {
                "runs": values,
                "median": round(statistics.median(values), 3) if all(value is not None for value in values) else None,
            }
            for name, values in columns.items()
        },
    }


def run_once(args: argparse.Namespace, stages: list[int], output: pathlib.Path) -> dict[str, Any]:
    """One run of the benchmark (its own database, API and worker); writes ``output``, returns its result."""
    api_env = dict(item.split("=", 1) for item in args.api_env)
    worker_env = dict(item.split("=", 1) for item in args.worker_env)
    load_at_start = os.getloadavg()
    server = testenv.server_database_url()
    redis_url = testenv.server_redis_url().rsplit("/", 1)[0] + "/13"
    name = f"iwscope_load_{secrets.token_hex(4)}"
    database_url = testenv.named_database_url(name, server)
    libpq_url = database_url.replace("postgresql+psycopg://", "postgresql://", 1)
    queue = f"iwscope-load-{secrets.token_hex(4)}"
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
    children: list[subprocess.Popen[bytes]] = []
    sampler: Sampler | None = None
    api_log = pathlib.Path(f"/tmp/{name}-api.log")
    worker_log = pathlib.Path(f"/tmp/{name}-worker.log")
    try:
        iwscope = [sys.executable, "-m", "iwscope.cli"]
        subprocess.run([*iwscope, "db", "upgrade"], env=env, check=True, capture_output=True)
        tokens = {
            kind: subprocess.run(
                [*iwscope, "token", "create", "--kind", kind], env=env, check=True, capture_output=True, text=True
            ).stdout.strip()
            for kind in ("enroll", "origin", "admin")
        }
        port = free_port()
        open_files = raise_open_files_limit()
        # Each child keeps its own copy of its log's descriptor; ours closes with the block.
        with open(api_log, "wb") as api_log_file:
            api = subprocess.Popen(
                [*iwscope, "api", "--host", "127.0.0.1", "--port", str(port), "--workers", str(args.api_workers)],
                env={**env, **api_env},
                start_new_session=True,
                stdout=api_log_file,
                stderr=subprocess.STDOUT,
            )
        with open(worker_log, "wb") as worker_log_file:
            worker = subprocess.Popen(
                [*iwscope, "worker", "--concurrency", "1"],
                env={**env, **worker_env},
                start_new_session=True,
                stdout=worker_log_file,
                stderr=subprocess.STDOUT,
            )
        children += [api, worker]
        base_url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(f"{base_url}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        started = time.monotonic()
        probes = asyncio.run(enroll_fleet(base_url, tokens["enroll"], args.probes))
        enroll_s = time.monotonic() - started
        with httpx.Client(base_url=base_url, timeout=60) as client:
            origins = [
                client.post(
                    wire.ORIGIN_ENROLL_PATH,
                    json={
                        "name": f"load-{number}",
                        "region": "load",
                        "host": f"10.0.{number // 250}.{1 + number % 250}",
                        "arms": [{"iw": 3, "port": 8003}, {"iw": 10, "port": 8010}],
                    },
                    headers={"Authorization": f"Bearer {tokens['origin']}"},
                ).json()
                for number in range(args.origins)
            ]
            campaign = client.post(
                "/api/v1/campaigns",
                json={
                    "name": "load",
                    "origin_ids": [origin["id"] for origin in origins],
                    "arms": [3, 10],
                    "sizes": [1000, 10000, 100000],
                    "starts_at": wire.utc_timestamp(),
                },
                headers={"Authorization": f"Bearer {tokens['admin']}"},
            ).json()
        print(f"enrolled {len(probes)} probes in {enroll_s:.1f} s ({len(probes) / enroll_s:.0f}/s)", flush=True)
        baseline = copy_baseline(
            libpq_url, probes[0]["id"], origins[0]["id"], int(campaign["id"]), args.batch_min, args.batch_max
        )
        sampler = Sampler(api.pid, worker.pid, libpq_url, name, redis_url, queue)
        fleet = Fleet(
            base_url,
            probes,
            [SimulatedOrigin(origin) for origin in origins],
            int(campaign["id"]),
            args.think_s,
            args.batch_min,
            args.batch_max,
            schedule_from_uploads=not args.poll_every_cycle,
        )
        stage_rows = asyncio.run(run_stages(fleet, stages, args.stage_s, sampler))
        # After the load: how long the single worker needs to empty its backlog.
        drain_started = time.monotonic()
        drain_series = []
        while sampler.backlog() > 0 and time.monotonic() - drain_started < args.drain_timeout_s:
            drain_series.append(sampler.backlog())
            time.sleep(1.0)
        drain_s = time.monotonic() - drain_started
        # An empty queue is not a finished worker: the last drain may still be joining.  The
        # counts are final once they stop changing (3 s) with nothing queued.
        counts: tuple[int, int] | None = None
        with psycopg.connect(libpq_url, autocommit=True) as connection:
            for _ in range(120):
                now_counts = connection.execute("SELECT count(*), count(joined_at) FROM trials").fetchone()  # type: ignore[misc]
                if now_counts == counts and sampler.backlog() == 0:
                    break
                counts = now_counts
                time.sleep(3.0)
        stored, joined = counts or (0, 0)
    finally:
        if sampler is not None:
            sampler.close()
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        if args.keep_database:
            print(f"kept database {name}", flush=True)
        else:
            testenv.drop_database(name, server_url=server)
        client_redis = redis.Redis.from_url(redis_url)
        client_redis.delete(queue)
        client_redis.close()
    api_text = api_log.read_text(errors="replace") if api_log.exists() else ""
    api_pool_timeouts = api_text.count("QueuePool limit")
    busy_503 = sum(count for row in stage_rows for what, count in row["errors"].items() if what.endswith(":503"))
    api_errors = api_text.count("Exception in ASGI application")
    peak = max(stage_rows, key=lambda row: row["trials_per_s"])
    result = {
        "generated_at": wire.utc_timestamp(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "copy_baseline": baseline,
        "probes_enrolled": args.probes,
        "enroll_per_s": round(args.probes / enroll_s, 1),
        "stage_s": args.stage_s,
        "think_s": args.think_s,
        "batch_trials": [args.batch_min, args.batch_max],
        "origins": args.origins,
        "api_processes": args.api_workers,
        "worker_concurrency": 1,
        "open_files_limit": open_files,
        "stages": stage_rows,
        "peak_trials_per_s": peak["trials_per_s"],
        "peak_at_probes": peak["active_probes"],
        "backlog_drain_s": round(drain_s, 1),
        "backlog_drain_series": drain_series,
        "trials_stored_total": stored,
        "trials_joined_total": joined,
        "api_log": str(api_log),
        "worker_log": str(worker_log),
        "api_pool_timeouts": api_pool_timeouts,
        "api_5xx_logged": api_errors,
        "api_env": api_env,
        "worker_env": worker_env,
        "answers_503": busy_503,
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"drained the worker backlog in {drain_s:.1f} s; stored {stored} trials, {joined} joined")
    print(f"wrote {output}")
    return result


if __name__ == "__main__":
    main()
