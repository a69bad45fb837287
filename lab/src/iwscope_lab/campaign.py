"""Run a real measurement campaign in the lab, end to end through the product.

Every origin host runs a real ``iwprobe origin`` (routes with ``initcwnd`` per arm, one
listener per arm), every probe host a real ``iwprobe run --once``; both enroll through the
collector's API with the scenario's region labels, the campaign is created through the API
with an admin token, and the probes pull it as their schedule.  Trials and observations
reach PostgreSQL only through the API and the Celery worker.  The runner only *reads* the
database, to show progress and to know when everything has arrived.
"""

from __future__ import annotations

import datetime as dt
import json
import pathlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import func, select

from iwprobe import wire
from iwscope_lab.certs import ChainInfo, write_chain
from iwscope_lab.stack import Stack, StackError
from iwscope_lab.topology import PlacedHost, Topology

#: First port of an origin's arm listeners (the arm with IW n listens on BASE_PORT + n).
BASE_PORT = 8000


def calibration_bytes(rate_bps: float | None, rtt_ms: float) -> int:
    """A path-calibration transfer of ~8 bandwidth-delay products, within [30 KB, 4 MB].

    Long enough to leave slow start so ``tcpi_delivery_rate`` reaches the bottleneck rate;
    short enough that a 56 kbit/s path calibrates in seconds.
    """
    if not rate_bps:
        return 4_000_000
    bdp = rate_bps / 8 * max(rtt_ms, 20.0) / 1000
    return int(min(4_000_000, max(30_000, 8 * bdp)))


class CampaignError(RuntimeError):
    """The campaign could not be run or did not complete."""


@dataclass(frozen=True)
class CampaignPlan:
    """What every probe of the topology measures against every origin."""

    name: str
    arms: tuple[int, ...] = (3, 10)
    sizes: tuple[int, ...] | None = (9_000,)
    #: The arms by label when they are not all plain (``32p`` paced, ``learned``), in the order
    #: of ``arms`` (their IWs); empty: ``arms`` as plain arms.
    arm_labels: tuple[str, ...] = ()
    size_dist: str | None = None
    sizes_per_round: int = 1
    repetitions: int = 5
    interval_s: float = 0.0
    calibrate: bool = True
    #: Time box (seconds): probes run rounds until it ends (``repetitions`` is then a maximum).
    duration_s: float | None = None
    #: Adaptive: a probe stops early once its buckets' 95 % intervals are within +- this (ms).
    target_ci_ms: float | None = None
    #: The IP version to measure over (``ipv4``/``ipv6``; IPv6 needs a dual-stack topology);
    #: ``None``: the origins' IPv4 addresses.
    family: str | None = None
    #: Share of the rounds whose trials the probes keep as packet traces (wire v7
    #: ``trace_share``; the Trials page's inspector draws them).  0: none.
    trace_share: float = 0.0
    #: How the origins write responses (``iwprobe origin --send-path``: ``writev``, ``sendfile``,
    #: ``mss-writes``); ``None``: the origin's default (writev).
    send_path: str | None = None
    #: The origins' congestion control (``iwprobe origin --congestion-control``); ``None``: the
    #: namespace's default, which is the host's ``net.ipv4.tcp_congestion_control`` (CUBIC on a
    #: stock Debian, BBR on some lab machines) -- name it where a model is set beside the result.
    congestion_control: str | None = None
    #: HTTPS origins (a ``chain_kb`` label) also serve HTTP/3 (``iwprobe origin --quic``): the QUIC
    #: arm ``Nq`` of each of their arms.  The plan's own arms may then name QUIC arms too.
    quic: bool = False

    def __post_init__(self) -> None:
        if (self.sizes is None) == (self.size_dist is None):
            raise ValueError("a plan has either fixed sizes or a size distribution")
        if self.target_ci_ms is not None and self.duration_s is None:
            raise ValueError("an adaptive plan (target_ci_ms) needs a time box (duration_s)")
        if self.family not in (None, "ipv4", "ipv6"):
            raise ValueError(f"family must be ipv4 or ipv6, not {self.family!r}")
        if not 0.0 <= self.trace_share <= 1.0:
            raise ValueError(f"trace_share must be within [0, 1], not {self.trace_share!r}")

    def trials_per_round(self, n_origins: int) -> int:
        sizes_per_round = len(self.sizes) if self.sizes is not None else self.sizes_per_round
        return n_origins * len(self.arms) * sizes_per_round

    def trials_per_probe(self, n_origins: int) -> int | None:
        """Trials each probe stores; ``None`` for a time-boxed plan (as many rounds as fit)."""
        if self.duration_s is not None:
            return None
        return self.repetitions * self.trials_per_round(n_origins)


ResultT = TypeVar("ResultT", covariant=True)


class _Phases(Protocol[ResultT]):
    """The three phases :meth:`LabCampaign.run` chains: ``run`` returns what ``finish`` does, so a
    subclass whose ``finish`` has its own result (:class:`~iwscope_lab.census.LabCensus`) keeps it."""

    def start(self, *, timeout_s: float = ...) -> None: ...

    def finish(self, *, timeout_s: float = ..., show_progress: bool = ...) -> ResultT: ...

    def close(self) -> None: ...


@dataclass
class CampaignResult:
    """What a finished campaign left in the database."""

    campaign_id: int
    probe_ids: dict[str, str]
    origin_ids: dict[str, str]
    #: ``None`` for a time-boxed campaign (as many rounds as fit).
    expected_per_probe: int | None
    stored_per_probe: dict[str, int]
    unjoined: int
    seconds: float
    probe_exit_codes: dict[str, int | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


class LabCampaign:
    """One campaign on one topology and one stack."""

    def __init__(
        self,
        topology: Topology,
        stack: Stack,
        plan: CampaignPlan,
        *,
        console: Console | None = None,
        state_root: pathlib.Path | None = None,
        probe_args: tuple[str, ...] = (),
        client_initrwnd: int | None = 64,
    ) -> None:
        self.topology = topology
        self.stack = stack
        self.plan = plan
        self.console = console or Console(stderr=True)
        self.state_root = state_root or (stack.run_dir / "lab" / topology.run_id)
        self.probe_args = probe_args
        #: The probes' initial receive window (segments).  Linux clients advertise 10 MSS by
        #: default, which hides any IW above 10; 64 is like the replication's Windows clients
        #: (64 KB).  ``None`` keeps the kernel default (then rwnd-limited trials show it).
        self.client_initrwnd = client_initrwnd
        #: HTTPS: the test chain of every origin host labelled ``chain_kb`` (written at start).
        self.chains: dict[str, ChainInfo] = {}
        self._origins: dict[str, subprocess.Popen[bytes]] = {}
        self._probes: dict[str, subprocess.Popen[bytes]] = {}
        self._tokens: dict[str, str] = {}
        #: When a time-boxed campaign's window closes (``None``: not time-boxed).
        self._box_end: dt.datetime | None = None
        self.campaign_id: int | None = None
        self.probe_ids: dict[str, str] = {}
        self.origin_ids: dict[str, str] = {}
        self._started = time.monotonic()

    # ----- the run -----

    def run(self: _Phases[ResultT], *, timeout_s: float = 900.0, show_progress: bool = True) -> ResultT:
        """Enroll, start origins, create the campaign, run the probes, wait for every record."""
        try:
            self.start(timeout_s=timeout_s)
            return self.finish(timeout_s=timeout_s, show_progress=show_progress)
        finally:
            self.close()

    def start(self, *, timeout_s: float = 900.0) -> None:
        """Enroll every agent, start the origins, create the campaign and start the probes.

        The lower-level half of :meth:`run` for callers that act on the running campaign
        (the fault-injection suite kills and restarts agents in between); call
        :meth:`finish`, then :meth:`close`.
        """
        self._started = time.monotonic()
        origins = self.topology.hosts_by_role("origin")
        probes = self.topology.hosts_by_role("probe")
        if not origins or not probes:
            raise CampaignError("a campaign needs at least one origin and one probe host")
        if self.client_initrwnd is not None:
            for host in probes:
                self.topology.set_route(host.name, initrwnd=self.client_initrwnd)
        if self.plan.family == "ipv6" and not all(host.address6 for host in origins + probes):
            raise CampaignError("an IPv6 campaign needs a dual-stack topology (Topology(dual_stack=True))")
        self._write_chains(origins)
        self._create_tokens()
        self.origin_ids = {host.name: self._start_origin(host) for host in origins}
        self.probe_ids = {host.name: self._enroll_probe(host) for host in probes}
        self.campaign_id = self._create_campaign(list(self.origin_ids.values()), timeout_s)
        for host in probes:
            self._start_probe(host)

    def finish(self, *, timeout_s: float = 900.0, show_progress: bool = True, join_timeout_s: float = 120.0) -> CampaignResult:
        """Wait (up to ``timeout_s`` after :meth:`start`) until every trial is stored and joined."""
        if self.campaign_id is None:
            raise CampaignError("finish() before start()")
        expected = self.plan.trials_per_probe(len(self.origin_ids))
        self._wait_for_trials(self.probe_ids, expected, self._started + timeout_s, show_progress)
        exit_codes = {name: proc.poll() for name, proc in self._probes.items()}
        unjoined = self._wait_until_folded(deadline=time.monotonic() + join_timeout_s)
        stored = self._stored_per_probe(self.probe_ids)
        return CampaignResult(
            self.campaign_id,
            self.probe_ids,
            self.origin_ids,
            expected,
            stored,
            unjoined,
            time.monotonic() - self._started,
            exit_codes,
        )

    # ----- acting on a running campaign (fault injection) -----

    def state_dir(self, host_name: str) -> pathlib.Path:
        """Where the agent on ``host_name`` keeps its credentials, spool and log."""
        return self._host_state_dir(self.topology.host(host_name))

    def agent_process(self, host_name: str) -> subprocess.Popen[bytes]:
        """The running ``iwprobe run`` / ``iwprobe origin serve`` process on ``host_name``."""
        return self._probes.get(host_name) or self._origins[host_name]

    def kill_agent(self, host_name: str, signum: int = signal.SIGKILL) -> None:
        """Signal the agent on ``host_name`` and wait until it is gone."""
        proc = self.agent_process(host_name)
        if proc.poll() is None:
            proc.send_signal(signum)
        proc.wait(timeout=30)

    def restart_agent(self, host_name: str) -> None:
        """Start the agent on ``host_name`` again with the same state directory (after :meth:`kill_agent`)."""
        if self.agent_process(host_name).poll() is None:
            raise CampaignError(f"the agent on {host_name} is still running")
        host = self.topology.host(host_name)
        if host_name in self._probes:
            self._start_probe(host)
        else:
            self._serve_origin(host)

    def close(self) -> None:
        """End the campaign's window and stop every agent (origins drain their spools first)."""
        box_closed = self._box_end is not None and _utc_now() >= self._box_end
        if self.campaign_id is not None and not box_closed:  # a closed time box keeps its end
            self._close_window(self.campaign_id)
        for processes in (self._probes, self._origins):
            for proc in processes.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in processes.values():
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    # ----- steps -----

    def _create_tokens(self) -> None:
        from iwscope.auth.services import create_api_token

        label = f"lab {self.topology.run_id}"
        with self.stack.session() as session:
            for kind in ("enroll", "origin", "admin"):
                self._tokens[kind] = create_api_token(session, kind, label)

    def _host_state_dir(self, host: PlacedHost) -> pathlib.Path:
        path = self.state_root / host.name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _iwprobe(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "iwprobe", *args]

    def _collector_url(self) -> str:
        return self.stack.api_url_for(self.topology.collector_address)

    def _agent_name(self, host: PlacedHost) -> str:
        return f"{host.name}.{self.topology.run_id}"

    def _start_origin(self, host: PlacedHost) -> str:
        state_dir = str(self._host_state_dir(host))
        common = self._origin_args(host)
        self._check(host, self._iwprobe("origin", "setup-routes", *common), "origin route setup")
        self._check(
            host,
            self._iwprobe(
                "origin",
                "enroll",
                *common,
                "--collector",
                self._collector_url(),
                "--token",
                self._tokens["origin"],
                "--name",
                self._agent_name(host),
                "--region",
                host.region or "lab",
                "--host",
                host.address,
                *(["--host6", host.address6] if host.address6 else []),
            ),
            "origin enrollment",
        )
        self._serve_origin(host)
        return self._agent_id(state_dir, "origin")

    def _origin_args(self, host: PlacedHost) -> list[str]:
        chain = self.chains.get(host.name)
        tls = ["--tls-cert", str(chain.chain_path), "--tls-key", str(chain.key_path)] if chain else []
        tls += ["--quic"] if chain and self.plan.quic else []
        return [
            "--arms",
            ",".join(self._origin_arms()),
            "--base-port",
            str(BASE_PORT),
            *self._origin_options(),
            *tls,
            "--state-dir",
            str(self._host_state_dir(host)),
        ]

    def _write_chains(self, origins: list[PlacedHost]) -> None:
        """HTTPS origins (a ``chain_kb`` label: a scenario or sweep names the chain size): a test
        chain each (``iwscope_lab.certs``), and one bundle of their roots the probes trust."""
        certs = self.state_root / "certs"
        self.chains = {
            host.name: write_chain(
                certs / host.name, float(host.labels["chain_kb"]), ips=[host.address, *([host.address6] if host.address6 else [])]
            )
            for host in origins
            if host.labels.get("chain_kb")
        }
        if self.chains:
            roots = certs / "roots.pem"
            roots.write_bytes(b"".join(chain.root_path.read_bytes() for chain in self.chains.values()))
            self.probe_args = (*self.probe_args, "--tls-ca-file", str(roots))

    def _origin_arms(self) -> list[str]:
        """The arms (labels) the origins serve over TCP (a QUIC arm ``Nq`` is served by ``--quic``
        next to its TCP arm ``N``)."""
        labels = list(self.plan.arm_labels) or [str(iw) for iw in self.plan.arms]
        return list(dict.fromkeys(wire.tcp_arm_label(label) for label in labels))

    def _origin_options(self) -> list[str]:
        """Further ``iwprobe origin`` options of every origin (the plan's send path and congestion
        control, where it names them)."""
        send = ["--send-path", self.plan.send_path] if self.plan.send_path else []
        return send + (["--congestion-control", self.plan.congestion_control] if self.plan.congestion_control else [])

    def _serve_origin(self, host: PlacedHost) -> None:
        with open(self._host_state_dir(host) / "origin.log", "ab") as log:
            self._origins[host.name] = self.topology.popen(
                host.name,
                self._iwprobe(
                    "origin",
                    "serve",
                    *self._origin_args(host),
                    "--bind",
                    host.address,
                    *(["--bind", host.address6] if host.address6 else []),
                    "--collector",
                    self._collector_url(),
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def _enroll_probe(self, host: PlacedHost) -> str:
        state_dir = str(self._host_state_dir(host))
        argv = [
            "enroll",
            "--collector",
            self._collector_url(),
            "--token",
            self._tokens["enroll"],
            "--name",
            self._agent_name(host),
            "--region",
            host.region or "lab",
            "--state-dir",
            state_dir,
            "--label",
            f"lab_run={self.topology.run_id}",
            "--label",
            f"host={host.name}",
        ]
        if host.labels.get("country"):
            argv += ["--country", host.labels["country"]]
        for key, value in sorted(host.labels.items()):
            if key != "country":
                argv += ["--label", f"{key}={value}"]
        self._check(host, self._iwprobe(*argv), "probe enrollment")
        return self._agent_id(state_dir, "probe")

    def _start_probe(self, host: PlacedHost) -> None:
        state_dir = self._host_state_dir(host)
        # Only this campaign (and those :meth:`_probe_campaigns` adds): other campaigns may be
        # active on the same collector.
        args = [argument for campaign in self._probe_campaigns(host) for argument in ("--campaign", str(campaign))]
        args += self.probe_args
        if "--calibration-bytes" not in args:
            rate = host.link.down.rate_bps
            args += ["--calibration-bytes", str(calibration_bytes(rate, host.link.rtt_ms))]
        with open(state_dir / "probe.log", "ab") as log:
            self._probes[host.name] = self.topology.popen(
                host.name,
                self._iwprobe("run", "--once", "--state-dir", str(state_dir), *args),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def _probe_campaigns(self, host: PlacedHost) -> list[int]:
        """The campaigns the probe on ``host`` runs: this one (subclasses may add more)."""
        return [self.campaign_id] if self.campaign_id is not None else []

    def _create_campaign(self, origin_ids: list[str], timeout_s: float) -> int:
        answer = self._api("POST", "/api/v1/campaigns", self._campaign_body(origin_ids, timeout_s), token=self._tokens["admin"])
        return int(answer["id"])

    def _campaign_body(self, origin_ids: list[str], timeout_s: float) -> dict[str, Any]:
        """The ``POST /api/v1/campaigns`` body of the plan (subclasses add their fields)."""
        now = _utc_now()
        regions = sorted({host.region or "lab" for host in self.topology.hosts_by_role("probe")})
        body: dict[str, Any] = {
            "name": self.plan.name,
            "origin_ids": origin_ids,
            "probe_regions": regions,
            "arms": list(self.plan.arm_labels) or list(self.plan.arms),
            "sizes": list(self.plan.sizes) if self.plan.sizes is not None else None,
            "size_dist": self.plan.size_dist,
            "sizes_per_round": self.plan.sizes_per_round,
            "repetitions": self.plan.repetitions,
            "interval_s": self.plan.interval_s,
            "starts_at": (now - dt.timedelta(seconds=5)).isoformat(),
            "calibrate": self.plan.calibrate,
        }
        if self.plan.family is not None:
            body["family"] = self.plan.family
        if self.plan.trace_share > 0.0:
            body["trace_share"] = self.plan.trace_share
        if self.plan.duration_s is not None:
            body["duration_s"] = self.plan.duration_s + 5  # from starts_at, 5 s in the past
            self._box_end = now + dt.timedelta(seconds=self.plan.duration_s)
            body["target_ci_ms"] = self.plan.target_ci_ms
        else:  # a window that closes by itself even if this runner dies
            body["ends_at"] = (now + dt.timedelta(seconds=timeout_s + 300)).isoformat()
        return body

    def _wait_for_trials(self, probe_ids: dict[str, str], expected: int | None, deadline: float, show_progress: bool) -> None:
        """Until every probe stored ``expected`` trials, or (time-boxed: ``None``) every probe exited."""
        columns = (TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=self.console, disable=not show_progress, transient=False) as progress:
            tasks = {name: progress.add_task(f"{name} ({self.topology.host(name).region})", total=expected) for name in probe_ids}
            while True:
                stored = self._stored_per_probe(probe_ids)
                for name, count in stored.items():
                    progress.update(tasks[name], completed=count if expected is None else min(count, expected))
                if expected is not None and all(count >= expected for count in stored.values()):
                    return
                finished = {name: proc.poll() for name, proc in self._probes.items()}
                if all(code is not None for code in finished.values()):
                    # Every probe exited; give the last uploads a moment to land.
                    time.sleep(1.0)
                    stored = self._stored_per_probe(probe_ids)
                    if expected is None:
                        failed = {name: code for name, code in finished.items() if code != 0}
                        if failed or not all(stored.values()):
                            raise CampaignError(
                                f"time-boxed campaign: probes exited with {failed or finished}, "
                                f"stored {stored}; see {self.state_root}/<host>/probe.log"
                            )
                        return
                    if all(count >= expected for count in stored.values()):
                        return
                    missing = {n: (expected or 0) - c for n, c in stored.items() if c < (expected or 0)}
                    raise CampaignError(
                        f"probes exited with trials missing {missing} (exit codes {finished}); "
                        f"see {self.state_root}/<host>/probe.log"
                    )
                if time.monotonic() > deadline:
                    raise CampaignError(f"campaign timed out: stored {stored} of {expected} per probe")
                time.sleep(0.5)

    def _wait_until_folded(self, deadline: float, campaign_id: int | None = None) -> int:
        """Wait until every successful trial of ``campaign_id`` (default: this campaign) has its
        origin observation joined and the worker's refresh has folded the campaign into the
        roll-ups and path estimates; return how many trials lack an observation.  Interactive
        flows (UDP echoes) have no observation to join."""
        from iwscope.analysis.rollups import caught_up
        from iwscope.trials.models import Trial

        campaign = self.campaign_id if campaign_id is None else campaign_id
        query = (
            select(func.count())
            .select_from(Trial)
            .where(
                Trial.campaign_id == campaign,
                Trial.error_kind.is_(None),
                Trial.joined_at.is_(None),
                Trial.role != "interactive",
            )
        )
        latest = select(func.max(Trial.received_at), func.max(Trial.joined_at)).where(Trial.campaign_id == campaign)
        while True:
            with self.stack.session() as session:
                unjoined = int(session.execute(query).scalar_one())
                folded = caught_up(session, *session.execute(latest).one())
            if (unjoined == 0 and folded) or time.monotonic() > deadline:
                return unjoined
            time.sleep(0.5)

    def _close_window(self, campaign_id: int) -> None:
        """End the window of ``campaign_id`` now (best effort: it runs while shutting down)."""
        try:
            self._api(
                "PATCH", f"/api/v1/campaigns/{campaign_id}", {"ends_at": _utc_now().isoformat()}, token=self._tokens.get("admin")
            )
        except Exception as error:
            self.console.print(f"[yellow]could not close campaign {campaign_id}: {error}")

    def _stored_per_probe(self, probe_ids: dict[str, str]) -> dict[str, int]:
        from iwscope.trials.models import Trial

        query = select(Trial.probe_id, func.count()).where(Trial.campaign_id == self.campaign_id).group_by(Trial.probe_id)
        with self.stack.session() as session:
            counts = {str(probe_id): int(count) for probe_id, count in session.execute(query)}
        return {name: counts.get(probe_id, 0) for name, probe_id in probe_ids.items()}

    # ----- plumbing -----

    def _check(self, host: PlacedHost, argv: list[str], what: str) -> None:
        done = self.topology.run(host.name, argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise CampaignError(f"{what} failed on {host.name}: {done.stderr.strip() or done.stdout.strip()}")

    @staticmethod
    def _agent_id(state_dir: str, role: str) -> str:
        """The id an agent stored after enrolling (its credentials file holds ``<id>.<secret>``)."""
        for candidate in sorted(pathlib.Path(state_dir).glob("*.json")):
            try:
                data = json.loads(candidate.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and data.get("role", role) == role and data.get("id"):
                return str(data["id"])
            credential = data.get("credential") if isinstance(data, dict) else None
            if credential and "." in credential:
                return str(credential.split(".", 1)[0])
        raise CampaignError(f"no {role} credentials found in {state_dir}")

    def _api(self, method: str, path: str, body: dict[str, Any] | None, *, token: str | None) -> Any:
        try:
            return self.stack.api(method, path, body, token=token)
        except StackError as error:
            raise CampaignError(str(error)) from error


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
