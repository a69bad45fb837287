"""Emulated web users: a population of browser-like clients, each bound to one user address of a
lab host (``Host(..., users=N)``: one /24 per user, behind the host's emulated link), loading
pages from the lab's nginx (webserver.py) with curl.

One driver process per user host runs inside the host's namespace
(``python -m iwscope_lab.users _worker CONFIG``) and keeps ``concurrent_users`` users active:

* a *user* is one of the host's addresses with a browser of one kind: HTTP/1.1 over plain HTTP
  (``h1``), HTTP/2 over TLS (``h2``) or HTTP/1.1 over TLS (``h1-tls``), drawn once per address
  from ``mix``;
* a *session* is ``pages_per_session`` page loads of one user separated by think times
  (exponential, mean ``think_time_s``); sessions take the host's addresses in turn, so every
  address is used over a run, and a new session starts after a think time;
* a *page load* fetches the page (one ``curl`` process, a new connection), then all its objects
  in a second ``curl --parallel``: at most ``parallel_max`` (6) connections over HTTP/1.1,
  each kept alive for the next object; over HTTP/2 one connection carrying every object of
  the page at once (``--parallel-max`` = the page's object count, as a browser multiplexes).
  The page's connection is not reused for its objects (two processes), unlike a browser's.

Per request the driver keeps curl's own timings (``--write-out``: ``time_connect``,
``time_appconnect``, ``time_starttransfer``, ``time_total``, ``size_download``,
``http_version``, ``num_connects``, local and remote address and port, ``http_code``, curl's exit
code and message); a request fails when curl's exit code is not 0, the status is not 200 or the
size differs from the file's.  :class:`PopulationResult` collects every request, page load and
failure, and the CPU time of the drivers and their curl processes.

``python -m iwscope_lab.users run --scenario passive --duration 60`` builds a scenario, starts
nginx on its ``server`` host and runs the population (``--run-id`` uses a run that is up).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .topology import Topology
    from .webserver import WebServer

__all__ = [
    "PopulationConfig",
    "RequestRecord",
    "PageLoad",
    "PopulationResult",
    "UserPopulation",
    "run_population",
    "WRITE_OUT_FIELDS",
    "DEFAULT_MIX",
]

#: Shares of users per protocol (module docstring): mostly HTTP/2, as today's web.
DEFAULT_MIX: dict[str, float] = {"h2": 0.6, "h1-tls": 0.2, "h1": 0.2}
#: What curl reports per transfer (``--write-out``, tab separated, in this order; the message last).
WRITE_OUT_FIELDS = (
    "urlnum",
    "http_code",
    "http_version",
    "time_namelookup",
    "time_connect",
    "time_appconnect",
    "time_pretransfer",
    "time_starttransfer",
    "time_total",
    "size_download",
    "num_connects",
    "local_ip",
    "local_port",
    "remote_ip",
    "remote_port",
    "exitcode",
    "errormsg",
)
_WRITE_OUT = "\\t".join(f"%{{{name}}}" for name in WRITE_OUT_FIELDS) + "\\n"
_FLOATS = {"time_namelookup", "time_connect", "time_appconnect", "time_pretransfer", "time_starttransfer", "time_total"}
_INTS = {"urlnum", "http_code", "size_download", "num_connects", "local_port", "remote_port", "exitcode"}
#: HTTP/2: at most this many streams at once (curl's --parallel-max cap is 300).
MAX_H2_STREAMS = 100


@dataclass(frozen=True)
class PopulationConfig:
    """How the users behave (per user host)."""

    #: Share of users (addresses) per protocol: ``h1``, ``h2``, ``h1-tls``.
    mix: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    #: Users active at once on each host (at most its number of addresses).
    concurrent_users: int = 8
    #: Mean think time between page loads (exponential), seconds; 0: none.
    think_time_s: float = 5.0
    pages_per_session: int = 3
    #: How long new page loads start (page loads in flight at the end complete).
    duration_s: float = 60.0
    #: Stop each host after this many page loads (None: only the duration).
    max_page_loads: int | None = None
    #: HTTP/1.1 connections per page load for its objects (a browser's 6 per host).
    parallel_max: int = 6
    connect_timeout_s: float = 30.0
    #: Bound of one curl process (the page, or all objects of a page).
    max_time_s: float = 120.0
    #: Only users on these hosts (None: every host with users but the server's).
    hosts: tuple[str, ...] | None = None
    #: 4 or 6 (IPv6 needs a dual-stack run).
    family: int = 4
    seed: int = 1

    def __post_init__(self) -> None:
        unknown = set(self.mix) - {"h1", "h2", "h1-tls"}
        if unknown or not self.mix or any(share < 0 for share in self.mix.values()) or sum(self.mix.values()) <= 0:
            raise ValueError(f"mix {dict(self.mix)!r}: non-negative shares of h1, h2, h1-tls")
        if self.concurrent_users < 1 or self.pages_per_session < 1 or self.parallel_max < 1:
            raise ValueError("concurrent_users, pages_per_session and parallel_max must be >= 1")
        if self.think_time_s < 0 or self.duration_s <= 0:
            raise ValueError("think_time_s must be >= 0 and duration_s > 0")
        if self.family not in (4, 6):
            raise ValueError("family must be 4 or 6")


@dataclass
class RequestRecord:
    """One HTTP request as curl saw it (times in seconds from the transfer's start, curl's)."""

    host: str
    user: str
    page_load: int
    #: ``page`` or ``object``.
    phase: str
    protocol: str
    path: str
    expected_bytes: int
    http_code: int = 0
    http_version: str = ""
    time_namelookup: float = 0.0
    time_connect: float = 0.0
    time_appconnect: float = 0.0
    time_pretransfer: float = 0.0
    time_starttransfer: float = 0.0
    time_total: float = 0.0
    size_download: int = 0
    num_connects: int = 0
    local_ip: str = ""
    local_port: int = 0
    remote_ip: str = ""
    remote_port: int = 0
    exitcode: int = 0
    errormsg: str = ""
    #: When the curl process started, seconds from the population's start.
    started_s: float = 0.0
    #: None when the request succeeded, else why not.
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class PageLoad:
    """One page load: the page, then its objects."""

    host: str
    user: str
    id: int
    protocol: str
    page: str
    started_s: float
    #: Wall time of the page's curl process, of the objects' one, and of both (process start-up included).
    page_s: float
    objects_s: float
    total_s: float
    requests: int
    failed: int
    curl_exit: list[int]


@dataclass
class PopulationResult:
    """Everything a population run measured, and what it cost."""

    requests: list[RequestRecord]
    page_loads: list[PageLoad]
    #: Per host: the driver's summary (addresses, counts, CPU of the driver and of its curls).
    hosts: dict[str, dict[str, Any]]
    #: From the common start to the last driver's end.
    seconds: float
    #: Configured path RTT (ms) of each host's users to the server (both access links).
    path_rtt_ms: dict[str, float] = field(default_factory=dict)
    #: Driver problems (a driver that failed, lost output).
    errors: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[RequestRecord]:
        return [record for record in self.requests if not record.ok]

    @property
    def cpu_seconds(self) -> float:
        """CPU time of the drivers and of every curl they ran (user + system)."""
        return float(sum(host.get("cpu_self_s", 0.0) + host.get("cpu_children_s", 0.0) for host in self.hosts.values()))

    def addresses(self) -> set[str]:
        """User addresses that completed at least one request."""
        return {record.local_ip for record in self.requests if record.ok}

    def summary(self) -> dict[str, Any]:
        """Counts, rates, failures (by reason, with examples), CPU per 1,000 requests, and per host:
        users used, requests, the handshake time of new connections against the path's RTT."""
        requests = len(self.requests)
        failures = self.failures
        per_host: dict[str, dict[str, Any]] = {}
        for host, info in sorted(self.hosts.items()):
            records = [record for record in self.requests if record.host == host]
            connects = sorted(record.time_connect * 1000 for record in records if record.ok and record.num_connects > 0)
            loads = sorted(load.total_s for load in self.page_loads if load.host == host and not load.failed)
            per_host[host] = {
                "addresses": info.get("addresses", 0),
                "addresses_used": len({r.local_ip for r in records if r.ok}),
                "page_loads": sum(load.host == host for load in self.page_loads),
                "requests": len(records),
                "failures": sum(not record.ok for record in records),
                "path_rtt_ms": self.path_rtt_ms.get(host),
                "connect_ms_min": round(connects[0], 2) if connects else None,
                "connect_ms_median": round(statistics.median(connects), 2) if connects else None,
                "page_load_s_median": round(statistics.median(loads), 3) if loads else None,
            }
        return {
            "requests": requests,
            "page_loads": len(self.page_loads),
            "failures": len(failures),
            "failure_reasons": dict(Counter(_reason(record.error) for record in failures)),
            "failure_examples": [asdict(record) for record in failures[:10]],
            "errors": list(self.errors),
            "addresses": len(self.addresses()),
            "prefixes_24": len({address.rsplit(".", 1)[0] for address in self.addresses() if "." in address}),
            "protocols": dict(Counter(load.protocol for load in self.page_loads)),
            "http_versions": dict(Counter(record.http_version for record in self.requests if record.ok)),
            "new_connections": sum(record.num_connects for record in self.requests),
            "seconds": round(self.seconds, 2),
            "requests_per_s": round(requests / self.seconds, 2) if self.seconds > 0 else None,
            "driver_cpu_s": round(self.cpu_seconds, 3),
            "driver_cpu_s_per_1000_requests": round(1000 * self.cpu_seconds / requests, 3) if requests else None,
            "hosts": per_host,
        }


def _reason(error: str | None) -> str:
    return (error or "").split(":", 1)[0]


# ----- the driver inside a host's namespace -----


class _Driver:
    """The users of one host (module docstring), run by ``_worker`` inside the host's namespace."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.host: str = config["host"]
        self.addresses: list[str] = list(config["addresses"])
        self.pages: list[dict[str, Any]] = config["pages"]
        self.weights = [float(page["weight"]) for page in self.pages]
        self.sizes: dict[str, int] = {key: int(value) for key, value in config["sizes"].items()}
        mix = {protocol: share for protocol, share in config["mix"].items() if share > 0}
        self.protocol_of: dict[str, str] = {}
        for address in self.addresses:
            chooser = random.Random(f"{config['seed']}/{address}")
            self.protocol_of[address] = chooser.choices(list(mix), weights=list(mix.values()))[0]
        self.start = float(config["start_at"])
        self.end = self.start + float(config["duration_s"])
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.next_user = 0
        self.loads_started = 0
        random.Random(f"{config['seed']}/{self.host}").shuffle(self.addresses)  # users take turns in random order
        self.output = open(config["output"], "w", encoding="utf-8")  # noqa: SIM115 -- closed by run()

    def _emit(self, records: Sequence[dict[str, Any]]) -> None:
        text = "".join(json.dumps(record, separators=(",", ":")) + "\n" for record in records)
        with self.lock:
            self.output.write(text)
            self.output.flush()

    def _wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` (not past the end); False when the run is over."""
        limit = self.config.get("max_page_loads")
        if limit is not None and self.loads_started >= limit:
            return False
        seconds = min(seconds, self.end - time.monotonic())
        if seconds > 0:
            self.stopping.wait(seconds)
        return not self._over()

    def _over(self) -> bool:
        return self.stopping.is_set() or time.monotonic() >= self.end

    def _take_load(self, new_user: bool) -> tuple[str | None, int] | None:
        """The next page load's id (and, for a new session, the next user in turn, taken together
        so that users are used in order), or None when the run or the host's page loads are over."""
        with self.lock:
            limit = self.config.get("max_page_loads")
            if self._over() or (limit is not None and self.loads_started >= limit):
                return None
            self.loads_started += 1
            user = None
            if new_user:
                user = self.addresses[self.next_user % len(self.addresses)]
                self.next_user += 1
            return user, self.loads_started - 1

    def slot(self, index: int) -> None:
        """One concurrent user at a time: sessions of page loads separated by think times."""
        rng = random.Random(f"{self.config['seed']}/{self.host}/{index}")
        think = float(self.config["think_time_s"])
        if not self._wait(rng.uniform(0, think) if think else 0.0):
            return
        user = ""
        while True:
            for page_number in range(int(self.config["pages_per_session"])):
                taken = self._take_load(new_user=page_number == 0)
                if taken is None:
                    return
                user = taken[0] or user
                self.page_load(user, taken[1], rng)
                if not self._wait(rng.expovariate(1.0 / think) if think else 0.0):
                    return

    def _curl(self, user: str, protocol: str, extra: Sequence[str]) -> list[str]:
        command = [
            self.config["curl"],
            "-q",
            "-sS",
            "--no-progress-meter",
            "--noproxy",
            "*",
            "--interface",
            f"host!{user}",
            "--connect-timeout",
            str(self.config["connect_timeout_s"]),
            "--max-time",
            str(self.config["max_time_s"]),
            "-w",
            _WRITE_OUT,
        ]
        command += ["--http2"] if protocol == "h2" else ["--http1.1"]
        if protocol != "h1":
            command += ["--cacert", self.config["ca_file"]]
        return command + list(extra)

    def _transfer(
        self, user: str, protocol: str, load_id: int, phase: str, paths: Sequence[str], extra: Sequence[str]
    ) -> tuple[list[dict[str, Any]], int, float]:
        """Run one curl for ``paths``: (request records, curl's exit code, wall seconds)."""
        base = self.config["urls"][protocol]
        arguments = list(extra)
        for path in paths:
            arguments += ["-o", "/dev/null", base + path]
        started = time.monotonic()
        try:
            done = subprocess.run(
                self._curl(user, protocol, arguments),
                capture_output=True,
                text=True,
                timeout=float(self.config["max_time_s"]) + 30,
            )
            exit_code, stdout, stderr = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as expired:
            output = expired.stdout or ""
            exit_code, stderr = -1, "driver timeout"
            stdout = output.decode(errors="replace") if isinstance(output, bytes) else output
        seconds = time.monotonic() - started
        results: dict[int, dict[str, Any]] = {}
        for line in stdout.splitlines():
            values = line.split("\t", len(WRITE_OUT_FIELDS) - 1)
            if len(values) != len(WRITE_OUT_FIELDS):
                continue
            parsed: dict[str, Any] = {}
            for name, value in zip(WRITE_OUT_FIELDS, values, strict=True):
                if name in _FLOATS:
                    parsed[name] = float(value or 0)
                elif name in _INTS:
                    parsed[name] = int(value) if value.strip().lstrip("-").isdigit() else 0
                else:
                    parsed[name] = value
            results[int(parsed.pop("urlnum"))] = parsed
        records = []
        for number, path in enumerate(paths):
            record: dict[str, Any] = {
                "kind": "request",
                "host": self.host,
                "user": user,
                "page_load": load_id,
                "phase": phase,
                "protocol": protocol,
                "path": path,
                "expected_bytes": self.sizes.get(path, -1),
                "started_s": started - self.start,
            }
            result = results.get(number)
            if result is None:
                record["error"] = f"no result: curl exit {exit_code}: {stderr.strip()[-200:]}"
            else:
                record.update(result)
                if result["exitcode"] != 0:
                    record["error"] = f"curl exit {result['exitcode']}: {result['errormsg']}"
                elif result["http_code"] != 200:
                    record["error"] = f"http {result['http_code']}"
                elif result["size_download"] != record["expected_bytes"]:
                    record["error"] = f"size {result['size_download']} != {record['expected_bytes']}"
            records.append(record)
        return records, exit_code, seconds

    def page_load(self, user: str, load_id: int, rng: random.Random) -> None:
        protocol = self.protocol_of[user]
        page = rng.choices(self.pages, weights=self.weights)[0]
        started = time.monotonic()
        records, page_exit, page_s = self._transfer(user, protocol, load_id, "page", [page["path"]], [])
        exits = [page_exit]
        objects_s = 0.0
        if all("error" not in record for record in records) and page["objects"]:
            streams = min(MAX_H2_STREAMS, len(page["objects"])) if protocol == "h2" else int(self.config["parallel_max"])
            more, objects_exit, objects_s = self._transfer(
                user, protocol, load_id, "object", page["objects"], ["--parallel", "--parallel-max", str(streams)]
            )
            records += more
            exits.append(objects_exit)
        failed = sum("error" in record for record in records)
        load = {
            "kind": "page_load",
            "host": self.host,
            "user": user,
            "id": load_id,
            "protocol": protocol,
            "page": page["path"],
            "started_s": started - self.start,
            "page_s": page_s,
            "objects_s": objects_s,
            "total_s": time.monotonic() - started,
            "requests": len(records),
            "failed": failed,
            "curl_exit": exits,
        }
        self._emit([*records, load])

    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        signal.signal(signal.SIGINT, lambda *_: self.stopping.set())
        delay = self.start - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        concurrent = max(1, min(int(self.config["concurrent_users"]), len(self.addresses)))
        threads = [threading.Thread(target=self.slot, args=(index,), daemon=True) for index in range(concurrent)]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(0.5)
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        self._emit(
            [
                {
                    "kind": "summary",
                    "host": self.host,
                    "addresses": len(self.addresses),
                    "concurrent_users": concurrent,
                    "page_loads": self.loads_started,
                    "ended_s": time.monotonic() - self.start,
                    "cpu_self_s": own.ru_utime + own.ru_stime,
                    "cpu_children_s": children.ru_utime + children.ru_stime,
                }
            ]
        )
        self.output.close()


def _worker(config_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    _Driver(config).run()
    return 0


# ----- the orchestrator -----


class UserPopulation:
    """The users of a topology's hosts loading pages from ``server`` (module docstring).

    :meth:`start` launches one driver per user host and returns; :meth:`wait` collects the
    result when they are done, :meth:`stop` ends them early (page loads in flight finish)."""

    def __init__(
        self, topology: Topology, server: WebServer, config: PopulationConfig | None = None, *, out_dir: Path | str | None = None
    ) -> None:
        self.topology = topology
        self.server = server
        self.config = config or PopulationConfig()
        names = self.config.hosts
        if names is None:
            names = tuple(host.name for host in topology.hosts if host.users and host.name != server.host)
        for name in names:
            if not topology.host(name).user_addresses:
                raise ValueError(f"host {name} has no user addresses (Host(..., users=N))")
        if not names:
            raise ValueError("no host with users in this topology")
        if self.config.family == 6 and not server.address6:
            raise ValueError("family 6 needs a dual-stack run")
        self.host_names: tuple[str, ...] = names
        self.out_dir = Path(out_dir) if out_dir is not None else topology.state_dir / "users"
        self._drivers: dict[str, subprocess.Popen[bytes]] = {}
        self._start_at = 0.0

    def start(self, start_delay_s: float = 1.0) -> None:
        """Start the drivers; the users begin together ``start_delay_s`` from now."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        site = self.server.site
        pages = [{"path": page.path, "objects": list(page.objects), "weight": page.weight} for page in site.pages]
        sizes = {page.path: page.size for page in site.pages} | dict(site.objects)
        urls = {protocol: self.server.base_url(protocol, self.config.family) for protocol in ("h1", "h2", "h1-tls")}
        self._start_at = time.monotonic() + start_delay_s
        curl = _curl_binary()
        for name in self.host_names:
            host = self.topology.host(name)
            addresses = host.user_addresses6 if self.config.family == 6 else host.user_addresses
            config = {
                "host": name,
                "addresses": addresses,
                "urls": urls,
                "ca_file": str(self.server.ca_file),
                "pages": pages,
                "sizes": sizes,
                "mix": dict(self.config.mix),
                "curl": curl,
                "concurrent_users": self.config.concurrent_users,
                "think_time_s": self.config.think_time_s,
                "pages_per_session": self.config.pages_per_session,
                "duration_s": self.config.duration_s,
                "max_page_loads": self.config.max_page_loads,
                "parallel_max": self.config.parallel_max,
                "connect_timeout_s": self.config.connect_timeout_s,
                "max_time_s": self.config.max_time_s,
                "seed": self.config.seed,
                "start_at": self._start_at,
                "output": str(self.out_dir / f"{name}.jsonl"),
            }
            config_path = self.out_dir / f"{name}.json"
            config_path.write_text(json.dumps(config))
            with open(self.out_dir / f"{name}.log", "wb") as log:
                self._drivers[name] = self.topology.popen(
                    name,
                    [sys.executable, "-m", "iwscope_lab.users", "_worker", str(config_path)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )

    def running(self) -> bool:
        return any(driver.poll() is None for driver in self._drivers.values())

    def wait(self, timeout_s: float | None = None) -> PopulationResult:
        """Wait for every driver (``TimeoutError`` after ``timeout_s``), then the result."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for name, driver in self._drivers.items():
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                driver.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"the users of {name} are still running") from None
        return self.result()

    def stop(self, grace_s: float | None = None) -> PopulationResult:
        """No new page loads; those in flight finish (up to ``grace_s``, default curl's bound)."""
        for driver in self._drivers.values():
            if driver.poll() is None:
                driver.send_signal(signal.SIGTERM)
        grace = self.config.max_time_s * 2 + 10 if grace_s is None else grace_s
        from .topology import stop_processes

        deadline = time.monotonic() + grace
        for driver in self._drivers.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                driver.wait(timeout=max(0.0, deadline - time.monotonic()))
        stop_processes(self._drivers.values(), timeout_s=1.0)
        return self.result()

    def result(self) -> PopulationResult:
        """What the drivers wrote so far (complete once they exited)."""
        requests: list[RequestRecord] = []
        loads: list[PageLoad] = []
        hosts: dict[str, dict[str, Any]] = {}
        errors: list[str] = []
        names = {f.name for f in fields(RequestRecord)}
        load_names = {f.name for f in fields(PageLoad)}
        ended = 0.0
        for name in self.host_names:
            path = self.out_dir / f"{name}.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            for line in lines:
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    errors.append(f"{name}: unreadable line {line[:80]!r}")
                    continue
                kind = entry.pop("kind", None)
                if kind == "request":
                    requests.append(RequestRecord(**{key: value for key, value in entry.items() if key in names}))
                elif kind == "page_load":
                    loads.append(PageLoad(**{key: value for key, value in entry.items() if key in load_names}))
                elif kind == "summary":
                    hosts[name] = entry
                    ended = max(ended, float(entry["ended_s"]))
            driver = self._drivers.get(name)
            if driver is not None and driver.poll() is not None and name not in hosts:
                log = self.out_dir / f"{name}.log"
                errors.append(
                    f"{name}: driver exited {driver.returncode} without a summary: "
                    f"{log.read_text(errors='replace')[-500:] if log.exists() else ''}"
                )
        if not ended and self._start_at:
            ended = time.monotonic() - self._start_at
        server_rtt = self.topology.host(self.server.host).link.rtt_ms
        path_rtt = {name: self.topology.host(name).link.rtt_ms + server_rtt for name in self.host_names}
        return PopulationResult(
            requests=requests, page_loads=loads, hosts=hosts, seconds=ended, path_rtt_ms=path_rtt, errors=errors
        )

    def __enter__(self) -> UserPopulation:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.running():
            self.stop(grace_s=5.0)


def run_population(
    topology: Topology, server: WebServer, config: PopulationConfig | None = None, *, out_dir: Path | str | None = None
) -> PopulationResult:
    """Run the users for ``config.duration_s`` (or ``max_page_loads``) and return what they measured."""
    population = UserPopulation(topology, server, config, out_dir=out_dir)
    population.start()
    try:
        return population.wait(timeout_s=population.config.duration_s + 2 * population.config.max_time_s + 60)
    finally:
        if population.running():
            population.stop(grace_s=5.0)


def _curl_binary() -> str:
    import shutil

    binary = shutil.which("curl")
    if binary is None:
        raise FileNotFoundError("curl is not installed")
    return binary


def _parse_mix(text: str) -> dict[str, float]:
    mix = {}
    for part in text.split(","):
        name, _, share = part.partition("=")
        mix[name.strip()] = float(share)
    return mix


def _run_command(args: argparse.Namespace) -> int:
    from .topology import Topology
    from .webserver import NginxOptions, start_nginx

    config = PopulationConfig(
        mix=_parse_mix(args.mix),
        concurrent_users=args.concurrent_users,
        think_time_s=args.think_time,
        pages_per_session=args.pages_per_session,
        duration_s=args.duration,
        max_page_loads=args.max_page_loads,
        family=args.family,
        seed=args.seed,
    )
    topology = Topology.attach(args.run_id) if args.run_id else Topology.from_scenario(args.scenario)
    own = not args.run_id
    try:
        if own:
            topology.up()
        servers = topology.hosts_by_role("server")
        server_host = args.server or (servers[0].name if servers else None)
        if server_host is None:
            raise SystemExit("no host of role server: pass --server HOST")
        options = NginxOptions(keepalive_timeout_s=args.keepalive_timeout, keepalive_requests=args.keepalive_requests)
        with start_nginx(topology, server_host, options=options) as server:
            started = time.monotonic()
            cpu_before = server.cpu_seconds()
            result = run_population(topology, server, config, out_dir=args.out)
            summary = result.summary()
            summary["nginx_cpu_s"] = round(server.cpu_seconds() - cpu_before, 3)
            summary["wall_s"] = round(time.monotonic() - started, 2)
            summary["run_id"] = topology.run_id
    finally:
        if own:
            topology.down()
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(
            f"{summary['requests']} requests in {summary['page_loads']} page loads from {summary['addresses']} "
            f"addresses ({summary['prefixes_24']} /24s) in {summary['seconds']} s: {summary['requests_per_s']} req/s; "
            f"failures {summary['failures']} {summary['failure_reasons'] or ''}"
        )
        print(
            f"driver CPU {summary['driver_cpu_s']} s = {summary['driver_cpu_s_per_1000_requests']} s per 1,000 "
            f"requests; nginx CPU {summary['nginx_cpu_s']} s"
        )
        for host, info in summary["hosts"].items():
            print(
                f"  {host:12} rtt {info['path_rtt_ms']:>7} ms  connect min/median {info['connect_ms_min']}/"
                f"{info['connect_ms_median']} ms  users {info['addresses_used']}/{info['addresses']}  "
                f"requests {info['requests']}  failures {info['failures']}  page load median {info['page_load_s_median']} s"
            )
    return 0 if summary["failures"] == 0 and not summary["errors"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iwscope_lab.users", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("_worker", help=argparse.SUPPRESS)
    worker.add_argument("config")
    run = commands.add_parser("run", help="nginx on the server host and the users of every other host")
    where = run.add_mutually_exclusive_group()
    where.add_argument("--scenario", default="passive", help="build this scenario for the run (default: passive)")
    where.add_argument("--run-id", help="use this lab run (iwscope lab up ...) instead of building one")
    run.add_argument("--server", help="the server host (default: the first of role server)")
    run.add_argument("--duration", type=float, default=60.0)
    run.add_argument("--max-page-loads", type=int, default=None, help="per host")
    run.add_argument("--mix", default=",".join(f"{k}={v}" for k, v in DEFAULT_MIX.items()))
    run.add_argument("--concurrent-users", type=int, default=8, help="per host")
    run.add_argument("--think-time", type=float, default=5.0, help="mean, seconds (exponential)")
    run.add_argument("--pages-per-session", type=int, default=3)
    run.add_argument("--keepalive-timeout", type=float, default=65.0)
    run.add_argument("--keepalive-requests", type=int, default=1000)
    run.add_argument("--family", type=int, choices=(4, 6), default=4)
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--out", help="where the drivers write their records (default: the run's state directory)")
    run.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "_worker":
        return _worker(args.config)
    return _run_command(args)


if __name__ == "__main__":
    sys.exit(main())
