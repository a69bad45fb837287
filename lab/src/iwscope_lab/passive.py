"""Real users in the lab, end to end through the product: the IETF 78 design on an unmodified nginx.

On a topology with a ``server`` host and hosts of ``users`` (scenario ``passive``):

1. Debian's nginx serves a web-search-sized site on the server host (webserver.py);
2. ``iwprobe tap`` on the server host enrolls through the API with a token of kind ``server``;
   a *passive campaign* (its arms and their shares of client prefixes, a time box) is created
   through the API with an admin token; the agent polls its configuration, installs the arms
   (one BPF program or nftables + policy routes, nothing in nginx), and measures every connection passively;
3. the user population (users.py: browser-like curl page loads from hundreds of addresses in
   their own /24s behind the regional links) loads pages for the study's duration;
4. the agent is stopped (it removes the arms, flushes and uploads), and the runner waits until
   the collector holds the aggregates of every connection the agent saw.

The region of a client comes from the operator's prefix map, here the user hosts' /24s.  The
runner only *reads* the database (to know when everything arrived); records reach it through
the agent's uploads.  A share sweep (``PassivePlan.sweep``) changes the arms' shares during the
run through the campaign API (``PATCH``: the phase increases), which the agent picks up at its
next configuration poll.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from sqlalchemy import text

from iwscope_lab.stack import Stack, StackError
from iwscope_lab.topology import PlacedHost, Topology
from iwscope_lab.users import PopulationConfig, UserPopulation
from iwscope_lab.webserver import NginxOptions, WebServer, start_nginx

#: Arms of a plain A/B study: half the client prefixes at IW 3, half at IW 10.
AB_ARMS: tuple[tuple[str, int], ...] = (("3", 5000), ("10", 5000))


class PassiveError(RuntimeError):
    """The passive study could not be run or did not complete."""


@dataclass(frozen=True)
class PassivePlan:
    """One passive study on one topology."""

    name: str
    #: (arm, share in basis points): ``default`` or an IW.
    arms: tuple[tuple[str, int], ...] = AB_ARMS
    duration_s: float = 120.0
    #: Share of connections uploaded as raw records (the lab keeps them all).
    sample_share: float = 1.0
    flush_interval_s: int = 10
    lease_s: float = 10.0
    #: The capture's packet budget (packets/s): the lab's users stay under it, so every connection
    #: is followed.
    capture_pps: int = 50_000
    population: PopulationConfig = field(default_factory=PopulationConfig)
    #: Later arm shares, each for an equal part of the duration after the first (a share sweep).
    sweep: tuple[tuple[tuple[str, int], ...], ...] = ()

    def campaign_arms(self, arms: tuple[tuple[str, int], ...] | None = None) -> list[dict[str, Any]]:
        return [{"arm": arm, "share_bp": share} for arm, share in (arms or self.arms)]


@dataclass
class PassiveResult:
    campaign_id: int
    server_id: str
    seconds: float
    population: dict[str, Any]
    #: What the agent counted (its last status) and what the collector stored.
    agent: dict[str, Any]
    stored_connections: int
    stored_aggregates: int
    stored_records: int
    phases: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class LabPassive:
    """One passive study on one topology and one stack."""

    def __init__(
        self,
        topology: Topology,
        stack: Stack,
        plan: PassivePlan,
        *,
        console: Console | None = None,
        state_root: pathlib.Path | None = None,
    ) -> None:
        self.topology = topology
        self.stack = stack
        self.plan = plan
        self.console = console or Console(stderr=True)
        self.state_root = state_root or (stack.run_dir / "lab" / topology.run_id)
        self.web: WebServer | None = None
        self.population: UserPopulation | None = None
        self.tap: subprocess.Popen[bytes] | None = None
        self.campaign_id: int | None = None
        self.server_id = ""
        self._tokens: dict[str, str] = {}
        self._started = time.monotonic()

    @property
    def server(self) -> PlacedHost:
        servers = self.topology.hosts_by_role("server")
        if not servers:
            raise PassiveError("a passive study needs a host of role 'server'")
        return servers[0]

    @property
    def state_dir(self) -> pathlib.Path:
        path = self.state_root / self.server.name
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o700)
        return path

    # ----- the run -----

    def run(self, *, timeout_s: float = 900.0) -> PassiveResult:
        try:
            self.start()
            return self.finish(timeout_s=timeout_s)
        finally:
            self.close()

    def start(self) -> None:
        """nginx, the agent's enrollment, the campaign, the agent, the users."""
        self._started = time.monotonic()
        if not self.topology.hosts_by_role("users"):
            raise PassiveError("a passive study needs hosts of role 'users'")
        self.web = start_nginx(self.topology, self.server.name, options=NginxOptions(access_log=False))
        self._create_tokens()
        self.server_id = self._enroll()
        self.campaign_id = self._create_campaign()
        self._start_tap()
        self._wait_for_arms()
        self.population = UserPopulation(
            self.topology,
            self.web,
            dataclasses.replace(self.plan.population, duration_s=self.plan.duration_s),
            out_dir=self.state_root / "users",
        )
        self.population.start()

    def finish(self, *, timeout_s: float = 900.0) -> PassiveResult:
        """Run the sweep's phases, wait for the users, stop the agent, wait for its records."""
        if self.population is None or self.campaign_id is None:
            raise PassiveError("finish() before start()")
        phases = 1 + len(self.plan.sweep)
        for index, arms in enumerate(self.plan.sweep, start=1):
            self._sleep_until(self._started + self.plan.duration_s * index / phases)
            self.stack.api(
                "PATCH",
                f"/api/v1/campaigns/{self.campaign_id}",
                {"passive_arms": self.plan.campaign_arms(arms)},
                token=self._tokens["admin"],
            )
        population = self.population.wait(timeout_s=max(30.0, self._started + timeout_s - time.monotonic()))
        agent = self._stop_tap()
        expected = int(agent.get("connections_seen", 0)) - int(agent.get("ambiguous", 0))
        stored = self._wait_for_records(expected, deadline=time.monotonic() + 120)
        return PassiveResult(
            self.campaign_id, self.server_id, time.monotonic() - self._started, population.summary(), agent, *stored, phases
        )

    def close(self) -> None:
        """End the campaign's window, stop the users, the agent and nginx."""
        if self.population is not None and self.population.running():
            self.population.stop()
        if self.tap is not None and self.tap.poll() is None:
            self._stop_tap()
        if self.campaign_id is not None and self._tokens.get("admin"):
            with contextlib.suppress(StackError):  # the window may have closed already
                self.stack.api(
                    "PATCH", f"/api/v1/campaigns/{self.campaign_id}", {"ends_at": _utc_now()}, token=self._tokens["admin"]
                )
        if self.web is not None:
            self.web.stop()

    # ----- steps -----

    def _iwprobe(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "iwprobe", "--log-level", "INFO", "tap", *args, "--state-dir", str(self.state_dir)]

    def _create_tokens(self) -> None:
        from iwscope.auth.services import create_api_token

        with self.stack.session() as session:
            for kind in ("server", "admin"):
                self._tokens[kind] = create_api_token(session, kind, f"lab {self.topology.run_id}")

    def _enroll(self) -> str:
        assert self.web is not None
        collector = self.stack.api_url_for(self.topology.collector_address)
        done = self.topology.run(
            self.server.name,
            self._iwprobe(
                "enroll",
                "--collector",
                collector,
                "--token",
                self._tokens["server"],
                "--force",
                "--name",
                f"{self.server.name}.{self.topology.run_id}",
                "--region",
                self.server.region or "lab",
                "--port",
                str(self.web.http_port),
                "--port",
                str(self.web.https_port),
            ),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise PassiveError(f"tap enroll failed: {done.stderr.strip() or done.stdout.strip()}")
        return str(json.loads((self.state_dir / "server.json").read_text())["id"])

    def _create_campaign(self) -> int:
        body = {
            "name": self.plan.name,
            "server_ids": [self.server_id],
            "passive_arms": self.plan.campaign_arms(),
            "starts_at": _utc_now(),
            "duration_s": self.plan.duration_s + 300,
            "sample_share": self.plan.sample_share,
            "flush_interval_s": self.plan.flush_interval_s,
        }
        return int(self.stack.api("POST", "/api/v1/campaigns", body, token=self._tokens["admin"])["id"])

    def region_map(self) -> pathlib.Path:
        """The operator's prefix map: every user /24 with its host's region."""
        path = self.state_dir / "regions.csv"
        lines = ["# prefix,region (the lab's user hosts)"]
        for host in self.topology.hosts_by_role("users"):
            lines += [f"{prefix},{host.region or host.name}" for prefix in host.user_prefixes]
        path.write_text("\n".join(lines) + "\n")
        return path

    def _start_tap(self) -> None:
        with open(self.state_dir / "tap.log", "ab") as log:
            self.tap = self.topology.popen(
                self.server.name,
                self._iwprobe(
                    "run",
                    "--region-map",
                    str(self.region_map()),
                    "--lease",
                    f"{self.plan.lease_s:g}",
                    # The lab's users open a few hundred connections a second: follow them all from the start,
                    # within budgets the lab's rates stay under (the defaults bound the agent's cost on a
                    # busy production server by sampling; the lab compares every connection with the model).
                    "--capture-start-share",
                    "1",
                    "--capture-pps",
                    str(self.plan.capture_pps),
                    "--capture-traffic-pps",
                    "0",
                    "--closes-per-s",
                    "0",
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def _wait_for_arms(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._arms_in_force():
            if self.tap is not None and self.tap.poll() is not None:
                raise PassiveError(f"iwprobe tap exited: {self._tap_log_tail()}")
            if time.monotonic() > deadline:
                raise PassiveError(f"the arms were not installed within {timeout_s:g} s: {self._tap_log_tail()}")
            time.sleep(0.2)

    def _arms_in_force(self) -> bool:
        """The agent's arms hold a lease (``iwprobe tap status``: nftables or BPF alike)."""
        shown = self.topology.run(self.server.name, self._iwprobe("status", "--json"), capture_output=True, text=True)
        return shown.returncode == 0 and bool(json.loads(shown.stdout).get("lease_remaining_s"))

    def _tap_log_tail(self) -> str:
        path = self.state_dir / "tap.log"
        return path.read_text(errors="replace")[-1500:] if path.exists() else "no log"

    def _stop_tap(self) -> dict[str, Any]:
        """SIGTERM: the agent removes its arms, flushes, uploads; its last status."""
        assert self.tap is not None
        if self.tap.poll() is None:
            self.tap.send_signal(signal.SIGTERM)
            try:
                self.tap.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.tap.kill()
                self.tap.wait()
        status_path = self.state_dir / "tap-status.json"
        return dict(json.loads(status_path.read_text())) if status_path.exists() else {}

    def stored(self) -> tuple[int, int, int]:
        with self.stack.session() as session:
            row = session.execute(
                text("SELECT coalesce(sum(connections), 0), count(*) FROM passive_aggregates WHERE campaign_id = :c"),
                {"c": self.campaign_id},
            ).one()
            records = session.execute(
                text("SELECT count(*) FROM passive_connections WHERE campaign_id = :c"), {"c": self.campaign_id}
            ).scalar_one()
        return int(row[0]), int(row[1]), int(records)

    def _wait_for_records(self, expected: int, deadline: float) -> tuple[int, int, int]:
        """Until the collector holds every connection the agent counted (its spool drains at
        the agent's next start if it could not upload before exiting)."""
        stored = self.stored()
        while stored[0] < expected and time.monotonic() < deadline:
            time.sleep(1.0)
            stored = self.stored()
        return stored

    @staticmethod
    def _sleep_until(moment: float) -> None:
        remaining = moment - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)


def _utc_now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).isoformat()
