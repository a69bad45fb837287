"""A census campaign in the lab, through the whole stack: web servers nobody here wrote, each on
a host of its own with its own ``initcwnd``, measured by real ``iwprobe run`` agents.

Hosts of role ``web`` serve a 1 MB object: Python's ``http.server`` by default, lighttpd when
the host is labelled ``server=lighttpd``; the label ``iw`` sets the host's ``initcwnd`` (the
kernel applies it to the server's connections, as it would to any server's).  The campaign is
created through the API with those URLs (``census_urls``), the probes are enrolled and run
``--once``; :meth:`LabCensus.finish` waits for every probe's census records.  The IW each
server was configured with is the ground truth the records are judged against.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select

from .campaign import CampaignError, CampaignPlan, LabCampaign, _utc_now
from .hostspec import PlacedHost
from .topology import stop_processes

#: The census object each web host serves (bytes): it outlasts any window the census asks about.
OBJECT_BYTES = 1_000_000
WEB_PORT = 8080
#: The path of the object on every web host.
OBJECT_PATH = "/big.bin"


@dataclass
class CensusResult:
    """What a finished census campaign left in the database."""

    campaign_id: int
    probe_ids: dict[str, str]
    #: Per web host: its URL and the initcwnd it was configured with.
    targets: dict[str, tuple[str, int]]
    records_per_probe: dict[str, int]
    seconds: float
    probe_exit_codes: dict[str, int | None] = field(default_factory=dict)


class LabCensus(LabCampaign):
    """One census campaign on one topology and one stack (module docstring); ``plan`` gives its
    name, rounds (``repetitions``) and the pause between them (``interval_s``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.targets: dict[str, tuple[str, int]] = {}
        self._webs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, *, timeout_s: float = 900.0) -> None:
        self._started = time.monotonic()
        webs = self.topology.hosts_by_role("web")
        probes = self.topology.hosts_by_role("probe")
        if not webs or not probes:
            raise CampaignError("a census needs at least one web host and one probe host")
        if self.client_initrwnd is not None:
            for host in probes:
                self.topology.set_route(host.name, initrwnd=self.client_initrwnd)
        self.targets = {host.name: (self._serve(host), int(host.labels.get("iw", "10"))) for host in webs}
        self._wait_serving(webs)
        self._create_tokens()
        self.probe_ids = {host.name: self._enroll_probe(host) for host in probes}
        self.campaign_id = self._create_campaign([], timeout_s)
        for host in probes:
            self._start_probe(host)

    def finish(self, *, timeout_s: float = 900.0, show_progress: bool = False, join_timeout_s: float = 0.0) -> CensusResult:  # type: ignore[override]
        """Wait until every probe uploaded one record per target and round (or exited)."""
        if self.campaign_id is None:
            raise CampaignError("finish() before start()")
        expected = self.plan.repetitions * len(self.targets)
        deadline = self._started + timeout_s
        while True:
            stored = self._records_per_probe()
            if all(count >= expected for count in stored.values()):
                break
            exited = {name: proc.poll() for name, proc in self._probes.items()}
            if all(code is not None for code in exited.values()):
                time.sleep(1.0)
                stored = self._records_per_probe()
                if all(count >= expected for count in stored.values()):
                    break
                raise CampaignError(
                    f"probes exited ({exited}) with census records {stored} of {expected}; see {self.state_root}/<host>/probe.log"
                )
            if time.monotonic() > deadline:
                raise CampaignError(f"census timed out: {stored} of {expected} records per probe")
            time.sleep(0.5)
        for proc in self._probes.values():  # run --once: they exit after their last upload
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        return CensusResult(
            self.campaign_id,
            self.probe_ids,
            dict(self.targets),
            stored,
            time.monotonic() - self._started,
            {name: p.poll() for name, p in self._probes.items()},
        )

    def _campaign_body(self, origin_ids: list[str], timeout_s: float) -> dict[str, Any]:
        now = _utc_now()
        regions = sorted({host.region or "lab" for host in self.topology.hosts_by_role("probe")})
        return {
            "name": self.plan.name,
            "census_urls": [url for url, _ in self.targets.values()],
            "probe_regions": regions,
            "repetitions": self.plan.repetitions,
            "interval_s": self.plan.interval_s,
            "starts_at": (now - dt.timedelta(seconds=5)).isoformat(),
            "ends_at": (now + dt.timedelta(seconds=timeout_s + 300)).isoformat(),
        }

    def _serve(self, host: PlacedHost) -> str:
        """Start the host's web server at its initcwnd; its object's URL."""
        self.topology.set_route(host.name, initcwnd=int(host.labels.get("iw", "10")))
        work = self._host_state_dir(host)
        www = work / "www"
        www.mkdir(parents=True, exist_ok=True)
        (www / OBJECT_PATH.lstrip("/")).write_bytes(os.urandom(OBJECT_BYTES))
        for path in (work, www):
            path.chmod(0o755)  # lighttpd drops to its own user
        with open(work / "web.log", "ab") as log:
            self._webs[host.name] = self.topology.popen(
                host.name,
                web_server_command(host.labels.get("server", "http.server"), work, host.address, WEB_PORT, str(www)),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return f"http://{host.address}:{WEB_PORT}{OBJECT_PATH}"

    def _wait_serving(self, webs: list[PlacedHost], timeout_s: float = 60.0) -> None:
        for host in webs:
            try:
                self.topology.wait_listening(host.name, host.address, [WEB_PORT], timeout_s, self._webs[host.name])
            except TimeoutError:
                raise CampaignError(
                    f"the web server on {host.name} did not start; see {self._host_state_dir(host)}/web.log"
                ) from None

    def _records_per_probe(self) -> dict[str, int]:
        from iwscope.trials.models import CensusRecord

        query = (
            select(CensusRecord.probe_id, func.count())
            .where(CensusRecord.campaign_id == self.campaign_id)
            .group_by(CensusRecord.probe_id)
        )
        with self.stack.session() as session:
            counts = {str(probe_id): int(count) for probe_id, count in session.execute(query)}
        return {name: counts.get(probe_id, 0) for name, probe_id in self.probe_ids.items()}

    def close(self) -> None:
        super().close()
        stop_processes(self._webs.values())


def census_plan(name: str = "census", rounds: int = 2, interval_s: float = 0.0) -> CampaignPlan:
    """The plan of a lab census: its name, rounds and pause (the census has no arms or sizes)."""
    return CampaignPlan(name=name, repetitions=rounds, interval_s=interval_s, calibrate=False)


def web_server_command(kind: str, work: os.PathLike[str] | str, address: str, port: int, www: str) -> list[str]:
    """The command of a web server nobody here wrote: ``http.server`` (Python's) or ``lighttpd``
    (Debian's, with a configuration written into ``work``), serving ``www`` on ``address:port``."""
    if kind == "http.server":
        return [sys.executable, "-m", "http.server", "--bind", address, str(port), "--directory", www]
    if kind == "lighttpd":
        binary = shutil.which("lighttpd") or "/usr/sbin/lighttpd"
        conf = os.path.join(work, "lighttpd.conf")
        with open(conf, "w", encoding="utf-8") as handle:
            handle.write(
                f'server.document-root = "{www}"\nserver.bind = "{address}"\nserver.port = {port}\n'
                f'server.pid-file = "{work}/lighttpd.pid"\nserver.errorlog = "{work}/lighttpd-error.log"\n'
            )
        return [binary, "-D", "-f", conf]
    raise ValueError(f"unknown web server {kind!r} (http.server or lighttpd)")
