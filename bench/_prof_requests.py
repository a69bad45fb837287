#!/usr/bin/env python3
"""The API's CPU per request, by kind: what one probe cycle costs the collector, part by part.

``bench_load.py`` gives the CPU per stored trial of a whole fleet; this one says where it goes.
One API process (``iwscope api``, uvicorn, its own database ``iwscope_requests_<random>`` on the
server of ``$IWSCOPE_TEST_DATABASE_URL``) is sent ``--requests`` requests of each kind, one at
a time over one kept-alive connection (``http.client``, as the probe's uploader), and the API
process's user and system CPU (``/proc/<pid>/stat``) is divided by their number:

* a probe's schedule poll answered 304 (its ETag unchanged);
* a trial upload of 1 and of 20 trials (new UUIDs), and 20 trials again (all duplicates);
* an origin's observation upload of 20 and of 200 observations.

Also measured in the same run, as floors of this machine: the same sequential requests to a
minimal ASGI application under the same uvicorn (``--floor``: a request's cost in uvicorn and
the kernel alone), and a PostgreSQL round trip from psycopg (``SELECT 1``: the client's CPU).
Sequential requests are groups of one for the API's group commit, so an upload's figure here is
the most it costs; under load more uploads share a group.  Writes ``bench/results/requests.json``.

``--baseline DIR`` compares two versions in the same run: DIR is another checkout (a ``git
worktree`` of an older commit; the two must share the database schema), whose API runs beside
this one's on the same database and serves every other block of 20 requests of each kind, so
both meet the same moments of a noisy machine; each kind reports the ratio of this version's CPU
to the baseline's.  ``--profile DIR`` writes py-spy's collapsed stacks of the API per kind (its
sampling inflates the system time: the CPU figures of such a run do not count).

    .venv/bin/python bench/bench_requests.py [--requests 400] [--repeat 3] [--baseline DIR] [--output FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import pathlib
import random
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import psycopg

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
import testenv
from bench_ingest import free_port
from bench_load import enroll_fleet, make_observations, make_trials

from iwprobe import wire

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "requests.json"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: py-spy (``--profile``): the one on PATH, else ``$PY_SPY``.
PY_SPY = os.environ.get("PY_SPY") or shutil.which("py-spy") or "py-spy"
Request = tuple[str, str, bytes | None, dict[str, str]]

MINIMAL_APP = textwrap.dedent(
    """
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})
    """
)


def _cpu_ticks(pid: int) -> tuple[int, int]:
    """User and system CPU of ``pid`` so far, in clock ticks."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def _wait_ready(url: str) -> None:
    for _ in range(600):
        try:
            if httpx.get(url).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} never answered 200")


#: Requests sent to one server before the next one's turn (``--baseline``: the two alternate).
BLOCK = 20


def measure(servers: list[tuple[int, int]], requests: list[Request], profile: pathlib.Path | None = None) -> list[dict[str, Any]]:
    """Send ``requests`` one at a time, in blocks of :data:`BLOCK` taking turns between
    ``servers`` (pid, port); per server its CPU per request (us) and the statuses.  With
    ``profile``, py-spy samples the first server meanwhile and writes its collapsed stacks there."""
    connections = [http.client.HTTPConnection("127.0.0.1", port, timeout=60) for _, port in servers]
    sampler = None
    if profile is not None:
        sampler = subprocess.Popen(
            [PY_SPY, "record", "--pid", str(servers[0][0]), "--rate", "1000", "--format", "raw", "--output", str(profile)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    time.sleep(0.5)  # the servers' own start-up and earlier work settle
    ticks = [[0, 0] for _ in servers]
    walls = [0.0 for _ in servers]
    counts = [0 for _ in servers]
    statuses: list[dict[str, int]] = [{} for _ in servers]
    for block, start in enumerate(range(0, len(requests), BLOCK)):
        turn = block % len(servers)
        pid, connection = servers[turn][0], connections[turn]
        before, started = _cpu_ticks(pid), time.perf_counter()
        for method, path, body, headers in requests[start : start + BLOCK]:
            connection.request(method, path, body=body, headers=headers)
            answer = connection.getresponse()
            answer.read()
            statuses[turn][str(answer.status)] = statuses[turn].get(str(answer.status), 0) + 1
            counts[turn] += 1
        after = _cpu_ticks(pid)
        walls[turn] += time.perf_counter() - started
        ticks[turn][0] += after[0] - before[0]
        ticks[turn][1] += after[1] - before[1]
    for connection in connections:
        connection.close()
    if sampler is not None:
        sampler.send_signal(signal.SIGINT)
        sampler.wait(60)
    results = []
    for turn in range(len(servers)):
        per_request = 1e6 / CLOCK_TICKS / counts[turn]
        user, system = ticks[turn][0] * per_request, ticks[turn][1] * per_request
        results.append(
            {
                "user_us": round(user),
                "system_us": round(system),
                "cpu_us": round(user + system),
                "wall_us": round(walls[turn] * 1e6 / counts[turn]),
                "statuses": statuses[turn],
            }
        )
    return results


def round_trip_us(libpq_url: str, count: int = 2000) -> float:
    """psycopg's CPU (this process) per ``SELECT 1`` round trip."""
    with psycopg.connect(libpq_url) as connection:
        started = time.process_time()
        for _ in range(count):
            connection.execute("SELECT 1").fetchone()
        return (time.process_time() - started) * 1e6 / count


def floor_us(count: int) -> dict[str, Any]:
    """A request's cost in uvicorn and the kernel: the minimal ASGI app under ``uvicorn``."""
    directory = pathlib.Path(f"/tmp/iwscope-bench-requests-{secrets.token_hex(4)}")
    directory.mkdir()
    (directory / "minimal_asgi.py").write_text(MINIMAL_APP)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "minimal_asgi:app", "--port", str(port), "--log-level", "warning", "--no-access-log"],
        cwd=directory,
        start_new_session=True,
    )
    try:
        _wait_ready(f"http://127.0.0.1:{port}/")
        return measure([(server.pid, port)], [("GET", "/", None, {})] * count)[0]
    finally:
        server.terminate()
        server.wait(30)
        for path in directory.iterdir():
            path.unlink()
        directory.rmdir()


def run_once(
    count: int, only: list[str] | None = None, profile: pathlib.Path | None = None, baseline: pathlib.Path | None = None
) -> dict[str, Any]:
    server = testenv.server_database_url()
    name = f"iwscope_requests_{secrets.token_hex(4)}"
    database_url = testenv.named_database_url(name, server)
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": testenv.server_redis_url().rsplit("/", 1)[0] + "/13",
        "IWSCOPE_CELERY_QUEUE": f"iwscope-requests-{secrets.token_hex(4)}",
        "IWSCOPE_LOG_LEVEL": "WARNING",
        "IWSCOPE_DRAIN_SECONDS": "0",
        "IWSCOPE_ENV": "development",
    }
    testenv.create_database(name, server_url=server)
    iwscope = [sys.executable, "-m", "iwscope.cli"]
    api: subprocess.Popen[bytes] | None = None
    other: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run([*iwscope, "db", "upgrade"], env=env, check=True, capture_output=True)
        tokens = {
            kind: subprocess.run(
                [*iwscope, "token", "create", "--kind", kind], env=env, check=True, capture_output=True, text=True
            ).stdout.strip()
            for kind in ("enroll", "origin", "admin")
        }
        port = free_port()
        # With a baseline both APIs share the last CPU and this process keeps to the first: where
        # the scheduler put each (beside the client or not) made 15-40 % of difference between
        # two copies of the same code.
        pin = ["taskset", "-c", str(os.cpu_count() - 1)] if baseline is not None and (os.cpu_count() or 1) > 1 else []
        if pin:
            os.sched_setaffinity(0, {0})
        api = subprocess.Popen(
            [*pin, *iwscope, "api", "--host", "127.0.0.1", "--port", str(port)], env=env, start_new_session=True
        )
        base = f"http://127.0.0.1:{port}"
        servers = [(api.pid, port)]
        if baseline is not None:  # the other checkout's API on the same database
            sources = f"{baseline / 'collector' / 'src'}:{baseline / 'probe' / 'src'}"
            other_port = free_port()
            other = subprocess.Popen(
                [*pin, *iwscope, "api", "--host", "127.0.0.1", "--port", str(other_port)],
                env={**env, "PYTHONPATH": sources},
                start_new_session=True,
            )
            _wait_ready(f"http://127.0.0.1:{other_port}/readyz")
            servers.append((other.pid, other_port))
            count *= 2  # each server gets ``count`` of each kind
        _wait_ready(f"{base}/readyz")
        probes = asyncio.run(enroll_fleet(base, tokens["enroll"], 50))
        with httpx.Client(base_url=base, timeout=60) as client:
            origin = client.post(
                wire.ORIGIN_ENROLL_PATH,
                json={"name": "bench", "region": "bench", "host": "10.0.0.1", "arms": [{"iw": 3, "port": 8003}]},
                headers={"Authorization": f"Bearer {tokens['origin']}"},
            ).json()
            campaign = client.post(
                "/api/v1/campaigns",
                json={
                    "name": "bench",
                    "origin_ids": [origin["id"]],
                    "arms": [3, 10],
                    "sizes": [1000, 10000, 100000],
                    "starts_at": wire.utc_timestamp(),
                },
                headers={"Authorization": f"Bearer {tokens['admin']}"},
            ).json()
            probe = probes[0]
            schedule_path = wire.PROBE_SCHEDULE_PATH.format(probe_id=probe["id"])
            etag = client.get(schedule_path, headers={"Authorization": f"Bearer {probe['credential']}"}).headers["etag"]
        rng = random.Random(1)

        def trial_uploads(size: int, number: int = count) -> list[Request]:
            uploads = []
            for index in range(number):
                sender = probes[index % len(probes)]
                trials = make_trials(sender["id"], origin["id"], int(campaign["id"]), size, rng)
                body = {
                    "wire_version": wire.WIRE_VERSION,
                    "batch_id": wire.new_id(),
                    "probe_id": sender["id"],
                    "sent_at": wire.utc_timestamp(),
                    "trials": trials,
                    "path_samples": [],
                }
                headers = {"Authorization": f"Bearer {sender['credential']}", "Content-Type": "application/json"}
                uploads.append(("POST", wire.TRIALS_BATCH_PATH, orjson.dumps(body), headers))
            return uploads

        def observation_uploads(size: int, number: int = count) -> list[Request]:
            headers = {"Authorization": f"Bearer {origin['credential']}", "Content-Type": "application/json"}
            uploads = []
            for _ in range(number):
                trials = make_trials(probes[0]["id"], origin["id"], int(campaign["id"]), size, rng)
                body = {
                    "wire_version": 1,
                    "batch_id": wire.new_id(),
                    "origin_id": origin["id"],
                    "sent_at": wire.utc_timestamp(),
                    "observations": make_observations(trials, origin["id"], rng),
                }
                uploads.append(("POST", wire.OBSERVATIONS_BATCH_PATH, orjson.dumps(body), headers))
            return uploads

        poll = ("GET", schedule_path, None, {"Authorization": f"Bearer {probe['credential']}", "If-None-Match": etag})
        twenty = trial_uploads(20)
        kinds: dict[str, Callable[[], list[Request]]] = {
            "schedule_304": lambda: [poll] * count,
            "trials_1": lambda: trial_uploads(1),
            "trials_20": lambda: twenty,
            "trials_20_duplicates": lambda: twenty,
            "observations_20": lambda: observation_uploads(20),
            "observations_200": lambda: observation_uploads(200),
        }
        # Every server first answers a few of each kind, not counted: a process's first requests of
        # a kind pay one-time costs (lazy imports, first snapshot, cached credentials) that made
        # two copies of the same code differ by up to 40 % over 400 requests.
        each = BLOCK * len(servers)  # one block of each kind for each server, in turn
        for warm_up in ([poll] * each, trial_uploads(1, each), trial_uploads(20, each), observation_uploads(20, each)):
            measure(servers, warm_up)
        result: dict[str, Any] = {}
        for kind, make in kinds.items():
            if only and kind not in only:
                continue
            stacks = None if profile is None else profile / f"{kind}.txt"
            if os.environ.get("IWSCOPE_YAPPI"):
                os.kill(api.pid, signal.SIGUSR2)
                time.sleep(3)
            measured = measure(servers, make(), stacks)
            if os.environ.get("IWSCOPE_YAPPI"):
                os.kill(api.pid, signal.SIGUSR2)
                time.sleep(15)
            result[kind] = measured[0]
            if baseline is not None:
                result[kind]["baseline"] = measured[1]
                result[kind]["ratio_to_baseline"] = round(measured[0]["cpu_us"] / max(1, measured[1]["cpu_us"]), 3)
            print(f"  {kind:22s} {result[kind]}", flush=True)
        result["psycopg_round_trip_client_us"] = round(round_trip_us(testenv.libpq_url(database_url)))
        result["minimal_asgi_request"] = floor_us(count // len(servers))
        print(f"  round trip {result['psycopg_round_trip_client_us']} us, minimal ASGI {result['minimal_asgi_request']}")
        return result
    finally:
        for process in (api, other):
            if process is not None:
                process.terminate()
                process.wait(30)
        testenv.drop_database(name, server_url=server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="requests of each kind per run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--output", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--only", action="append", help="measure only this kind (repeatable)")
    parser.add_argument(
        "--profile", type=pathlib.Path, help="directory: py-spy's collapsed stacks of the API per kind (py-spy, or $PY_SPY)"
    )
    parser.add_argument(
        "--baseline",
        type=pathlib.Path,
        help="another checkout (e.g. a git worktree of an older commit, same database schema): its API "
        "serves every other block of requests beside this one's, and each kind reports the ratio",
    )
    args = parser.parse_args()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    runs = []
    for number in range(1, args.repeat + 1):
        print(f"== run {number} of {args.repeat} (load average {os.getloadavg()[0]:.2f})", flush=True)
        runs.append({"load_average_at_start": os.getloadavg(), **run_once(args.requests, args.only, args.profile, args.baseline)})
    medians = {
        kind: statistics.median(run[kind]["cpu_us"] for run in runs)
        for kind in runs[0]
        if isinstance(runs[0][kind], dict) and "cpu_us" in runs[0][kind]
    }
    medians["psycopg_round_trip_client_us"] = statistics.median(run["psycopg_round_trip_client_us"] for run in runs)
    if args.baseline is not None:
        for kind in list(medians):
            if isinstance(runs[0].get(kind), dict) and "ratio_to_baseline" in runs[0][kind]:
                medians[f"{kind}_ratio_to_baseline"] = statistics.median(run[kind]["ratio_to_baseline"] for run in runs)
    print("median CPU per request (us):", json.dumps(medians))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps({"requests_per_kind": args.requests, "median_cpu_us": medians, "runs": runs}, indent=2) + "\n"
    )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
