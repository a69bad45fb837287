"""The probe daemon (``iwprobe run``), enrollment and credential storage.

Loop: heartbeat, pull the schedule (cached on disk so a restart works while the collector
is down), run every due round of every active campaign, upload, sleep.  A round's plan
(every target x arm x size, shuffled) is written to the spool before its first trial, and
each trial advances the round's progress in the same transaction that stores it, so a
restart after SIGKILL continues where it stopped instead of measuring again.

Offered-load campaigns (``arrival_rate_per_s`` set) start a round's trials at Poisson
arrivals instead, each on its own thread and connection, so flows overlap as they do at a
busy bottleneck; with ``background_bytes`` a long-lived flow is fetched once alone (the
uncontended baseline) and once in parallel with the round, whose arrivals start after a
warm-up of the background flow (:func:`background_warmup_s`).  Such a round is all-or-nothing:
its progress is not advanced per trial (completions are out of order), so a round
interrupted by a crash is measured again from its start; trials already spooled stay.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from . import __version__, sizes, wire
from ._calibrate import DEFAULT_CALIBRATION_BYTES, calibrate
from ._capture import capture_status
from ._census import census, quic_to_record, to_record
from ._collector import CollectorClient, CollectorError, from_dict
from ._echo import EchoFlow
from ._fetch import client_context, fetch, object_url
from ._plan import PlanEntry, campaign_arms, page_parts, round_plan, target_host
from ._quic_records import quic_trial
from ._spool import Spool, SpoolFull
from ._trace import trace_of, traced_round
from ._upload import Uploader, backoff_delay

log = logging.getLogger("iwprobe.agent")

__all__ = [
    "Credentials",
    "ProbeAgent",
    "PROBE_CREDENTIALS",
    "ORIGIN_CREDENTIALS",
    "state_dir",
    "save_credentials",
    "load_credentials",
    "enroll_probe",
    "enroll_origin",
    "background_warmup_s",
    "BACKGROUND_WARMUP_RTTS",
]

DEFAULT_STATE_DIR = "/var/lib/iwprobe"
PROBE_CREDENTIALS = "probe.json"
ORIGIN_CREDENTIALS = "origin.json"
#: Most trials of an offered-load round in flight at once (arrivals beyond it wait).
MAX_CONCURRENT_TRIALS = 256
#: Timeout of a background (long-lived) flow, seconds.
BACKGROUND_TIMEOUT_S = 600.0
#: ``arm_iw`` of an interactive-flow trial (UDP: no congestion window; the wire needs an IW).
INTERACTIVE_ARM_IW = 1


# ------------------------------------------------------------------------ credentials
@dataclass
class Credentials:
    role: str
    id: str
    credential: str
    collector: str
    ca_file: Optional[str] = None
    name: str = ""
    region: str = ""

    def client(self, timeout_s: float = 30.0) -> CollectorClient:
        return CollectorClient(self.collector, self.credential, self.ca_file, timeout_s)


def state_dir(explicit: Optional[str]) -> str:
    return explicit or os.environ.get("IWPROBE_STATE_DIR") or DEFAULT_STATE_DIR


def save_credentials(directory: str, filename: str, credentials: Credentials) -> str:
    """Write credentials atomically with mode 0600 (the secret never exists world-readable)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=".cred-", dir=directory)
    try:
        os.fchmod(descriptor, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(credentials.__dict__, handle, indent=2)
            handle.flush()
            os.fsync(handle.fileno())
        path = os.path.join(directory, filename)
        os.replace(temporary, path)
        return path
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def load_credentials(directory: str, filename: str) -> Credentials:
    path = os.path.join(directory, filename)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise SystemExit(
            f"not enrolled: {path} does not exist; "
            f"run 'iwprobe {'origin ' if filename == ORIGIN_CREDENTIALS else ''}enroll' first"
        ) from None
    mode = os.stat(path).st_mode & 0o777
    if mode & 0o077:
        log.warning("credentials file %s has mode %o; it should be 0600", path, mode)
    return Credentials(**data)


def enroll_probe(
    collector: str, token: str, request: wire.EnrollRequest, directory: str, ca_file: Optional[str] = None
) -> tuple[Credentials, str]:
    client = CollectorClient(collector, None, ca_file)
    _, answer = client.post_json(wire.PROBE_ENROLL_PATH, wire.dumps(request), token=token)
    response = from_dict(wire.EnrollResponse, answer)
    credentials = Credentials("probe", response.id, response.credential, collector, ca_file, request.name, request.region)
    return credentials, save_credentials(directory, PROBE_CREDENTIALS, credentials)


def enroll_origin(
    collector: str, token: str, request: wire.OriginEnrollRequest, directory: str, ca_file: Optional[str] = None
) -> tuple[Credentials, str]:
    client = CollectorClient(collector, None, ca_file)
    _, answer = client.post_json(wire.ORIGIN_ENROLL_PATH, wire.dumps(request), token=token)
    response = from_dict(wire.EnrollResponse, answer)
    credentials = Credentials("origin", response.id, response.credential, collector, ca_file, request.name, request.region)
    return credentials, save_credentials(directory, ORIGIN_CREDENTIALS, credentials)


# ----------------------------------------------------------------------- offered load
#: Round trips a background flow runs before the short flows start (slow start doubles the
#: window per round trip: 2^10 x IW covers any lab BDP).
BACKGROUND_WARMUP_RTTS = 10


def background_warmup_s(alone: wire.TrialRecord) -> float:
    """How long the background flow runs alone before the first short-flow arrival.

    ``BACKGROUND_WARMUP_RTTS`` minimum RTTs of the uncontended run, at most half of its
    duration (so most of the background flow overlaps the short flows); 0 when it failed.
    """
    rtt_us = alone.tcp_info.get("min_rtt") or alone.connect_us
    if alone.error_kind is not None or not rtt_us or not alone.total_us:
        return 0.0
    return min(BACKGROUND_WARMUP_RTTS * rtt_us, alone.total_us / 2) / 1e6


# ------------------------------------------------------------------------------ agent
class ProbeAgent:
    """``iwprobe run``: the measuring daemon."""

    def __init__(
        self,
        directory: str,
        credentials: Credentials,
        spool_max_bytes: int = 512 * 1024 * 1024,
        heartbeat_s: float = 60.0,
        calibration_bytes: int = DEFAULT_CALIBRATION_BYTES,
        trial_timeout_s: float = 60.0,
        trial_gap_s: float = 0.05,
        backoff_cap_s: float = 60.0,
        rng: Optional[random.Random] = None,
        campaign_ids: Optional[Sequence[int]] = None,
        tls_ca_file: Optional[str] = None,
        infer_iw: bool = True,
    ) -> None:
        self.directory = directory
        self.credentials = credentials
        self.client = credentials.client()
        self.spool = Spool(os.path.join(directory, "probe-spool.sqlite"), spool_max_bytes)
        # Traces (wire v7) go on their own path, after every waiting trial.
        traces = Uploader(self.spool, self.client, "trace", credentials.id, backoff_cap_s=backoff_cap_s)
        self.uploader = Uploader(
            self.spool,
            self.client,
            "probe",
            credentials.id,
            backoff_cap_s=backoff_cap_s,
            heartbeat=self._due_heartbeat,
            traces=traces,
        )
        self.heartbeat_s = heartbeat_s
        self.calibration_bytes = calibration_bytes
        self.trial_timeout_s = trial_timeout_s
        self.trial_gap_s = trial_gap_s
        self.backoff_cap_s = backoff_cap_s
        #: Only these campaigns are run (``None``: every campaign the schedule names).
        self.campaign_ids = set(campaign_ids) if campaign_ids else None
        self.rng = rng or random.Random()
        #: HTTPS targets are verified against the system's CAs or ``tls_ca_file`` (a lab root).
        self.tls_context = client_context(tls_ca_file)
        self.tls_ca_file = tls_ca_file
        #: Whether QUIC arms (wire v9) can be fetched here (the ``iwprobe[quic]`` extra), found out
        #: the first time a campaign asks (:meth:`_can_quic`): aioquic is not loaded before.
        self._quic: Optional[bool] = None
        #: Whether trials infer the server's IW from a capture (wire v5 ``client_iw``): asked
        #: for and possible here (root); the heartbeat says which and why.
        self.iw_capture = capture_status() if infer_iw else "off: --no-iw-inference"
        self.infer_iw = self.iw_capture == "on"
        if infer_iw and not self.infer_iw:
            log.warning("no client-side IW inference: %s", self.iw_capture)
        self.started = time.monotonic()
        self.trials_measured = 0
        #: Traces of finished trials (``trace_share``) until :meth:`_store` spools them after
        #: their trial: worker threads fill it, the spool is written from one thread only.
        self._traces: dict[str, dict[str, Any]] = {}
        self._traces_lock = threading.Lock()
        self._last_heartbeat = 0.0
        self._schedule_path = os.path.join(directory, "schedule.json")

    # -- collector conversations
    def _heartbeat_record(self) -> wire.Heartbeat:
        return wire.Heartbeat(
            version=__version__,
            spool_backlog=self.uploader.backlog(),
            spool_bytes=self.spool.disk_bytes(),
            uptime_s=round(time.monotonic() - self.started, 3),
            trials_measured=self.trials_measured,
            iw_capture=self.iw_capture,
        )

    def _due_heartbeat(self) -> Optional[wire.Heartbeat]:
        """The heartbeat an upload carries: one per ``heartbeat_s``, like the posted ones."""
        return self._heartbeat_record() if self.heartbeat_due() else None

    def heartbeat_due(self) -> bool:
        """No heartbeat reached the collector for ``heartbeat_s`` (alone or with an upload)."""
        return time.monotonic() - max(self._last_heartbeat, self.uploader.heartbeat_sent_at) >= self.heartbeat_s

    def heartbeat(self) -> None:
        try:
            self.client.post_json(
                wire.PROBE_HEARTBEAT_PATH.format(probe_id=self.credentials.id), wire.dumps(self._heartbeat_record())
            )
            self._last_heartbeat = time.monotonic()
        except CollectorError as error:
            log.warning("heartbeat failed: %s", error)

    def schedule(self) -> Optional[wire.Schedule]:
        """The current schedule from the collector (304: the one on disk is still current), or
        the one on disk when the collector is unreachable."""
        cached = self._cached_schedule()
        if cached is not None and self._schedule_confirmed(cached):
            confirmed: wire.Schedule = from_dict(wire.Schedule, cached[0])
            return confirmed
        try:
            # The version tells the collector which campaigns this probe can run (wire v3: arms by
            # label, shares, the interactive flow, page loads).
            status, answer, etag = self.client.get_json_if_changed(
                wire.PROBE_SCHEDULE_PATH.format(probe_id=self.credentials.id) + f"?wire_version={wire.WIRE_VERSION}",
                cached[1] if cached is not None else None,
            )
            if status == 304:
                return from_dict(wire.Schedule, cached[0]) if cached is not None else None
            schedule: wire.Schedule = from_dict(wire.Schedule, answer)
            descriptor, temporary = tempfile.mkstemp(dir=self.directory)
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                json.dump({"etag": etag, "schedule": answer}, handle)
            os.replace(temporary, self._schedule_path)
            return schedule
        except CollectorError as error:
            log.warning("schedule pull failed (%s); using the cached schedule", error)
        return from_dict(wire.Schedule, cached[0]) if cached is not None else None

    def _schedule_confirmed(self, cached: tuple[dict[str, Any], Optional[str]]) -> bool:
        """Whether the last trial upload's answer (within the schedule's ``poll_after_s``) named
        the cached schedule's ETag: then it is current and the poll is skipped (one request
        less per cycle for the collector)."""
        etag, poll_after_s = cached[1], cached[0].get("poll_after_s")
        if not etag or etag != self.uploader.schedule_etag or not isinstance(poll_after_s, (int, float)):
            return False
        return time.monotonic() - self.uploader.schedule_etag_at < poll_after_s

    def _cached_schedule(self) -> Optional[tuple[dict[str, Any], Optional[str]]]:
        """The schedule on disk and its ETag (a file of an earlier version: no ETag)."""
        try:
            with open(self._schedule_path, encoding="utf-8") as handle:
                stored = json.load(handle)
        except (FileNotFoundError, ValueError):
            return None
        if isinstance(stored, dict) and "schedule" in stored:
            return stored["schedule"], stored.get("etag")
        return stored, None

    # -- rounds
    def _can_quic(self) -> bool:
        """Whether QUIC arms can be fetched here; imports aioquic once, when first asked."""
        if self._quic is None:
            from ._quic import quic_available

            self._quic, why = quic_available()
            if not self._quic:
                log.info("no HTTP/3: QUIC arms and QUIC census answers are skipped (%s)", why)
        return self._quic

    def _plan(self, campaign: wire.CampaignSchedule) -> list[list[Any]]:
        if campaign.census_urls:
            order = list(campaign.census_urls)
            self.rng.shuffle(order)
            return [[url] for url in order]
        if campaign.sizes:
            round_sizes = list(campaign.sizes)
        elif campaign.size_dist:
            round_sizes = sizes.sample(campaign.size_dist, campaign.sizes_per_round, self.rng)
        else:
            raise ValueError(f"campaign {campaign.campaign_id} has neither sizes nor size_dist")
        wants_quic = any(wire.arm_label_protocol(label) == "quic" for label in campaign_arms(campaign))
        return round_plan(campaign, round_sizes, self.rng, quic=not wants_quic or self._can_quic())

    def _next_round(self, campaign: wire.CampaignSchedule, now: float) -> tuple[str, Optional[int], float]:
        """("done" | "wait" | "run", round number, seconds to wait)."""
        if campaign.ends_at and wire.parse_timestamp(campaign.ends_at).timestamp() <= now:
            return "done", None, 0.0
        starts = wire.parse_timestamp(campaign.starts_at).timestamp()
        if starts > now:
            return "wait", None, starts - now
        state = self.spool.round_state(campaign.campaign_id)
        for number in sorted(state):
            if state[number][2] is None:
                return "run", number, 0.0  # an interrupted round: resume it
        done = sorted(state)
        if len(done) >= campaign.repetitions:
            return "done", None, 0.0
        if not done:
            return "run", 0, 0.0
        due = state[done[-1]][2] + campaign.interval_s  # type: ignore[operator]
        if due > now:
            return "wait", done[-1] + 1, due - now
        return "run", done[-1] + 1, 0.0

    def run_round(self, campaign: wire.CampaignSchedule, number: int, stop: threading.Event) -> None:
        state = self.spool.round_state(campaign.campaign_id)
        if number not in state:
            if campaign.calibrate and not campaign.census_urls:
                self._calibrate(campaign)
            self.spool.start_round(campaign.campaign_id, number, self._plan(campaign))
            state = self.spool.round_state(campaign.campaign_id)
        plan, next_index, _, _ = state[number]
        if campaign.census_urls:
            self._run_census_round(campaign, number, plan, next_index, stop)
            return
        if campaign.arrival_rate_per_s:
            self._run_offered_round(campaign, number, plan, stop)
            return
        if next_index:
            log.info("resuming campaign %d round %d at trial %d of %d", campaign.campaign_id, number, next_index, len(plan))
        echo = self._start_interactive(campaign)
        for index in range(next_index, len(plan)):
            if stop.is_set():
                break
            records = self._measure(campaign, number, PlanEntry.from_json(plan[index]), self.trial_timeout_s)
            for position, record in enumerate(records, 1):
                self._store(record, (campaign.campaign_id, number, index + 1) if position == len(records) else None, stop)
            self.trials_measured += len(records)
            if self.trial_gap_s:
                stop.wait(self.trial_gap_s)
        self._finish_interactive(echo, campaign, number, stop)
        if stop.is_set():
            return
        self.spool.finish_round(campaign.campaign_id, number)
        log.info("campaign %d round %d done (%d trials)", campaign.campaign_id, number, len(plan))

    def _run_census_round(
        self, campaign: wire.CampaignSchedule, number: int, plan: list[list[Any]], next_index: int, stop: threading.Event
    ) -> None:
        """One census of every target of a census campaign (``iwprobe census`` each), in the
        round's shuffled order; each record advances the round's progress as a trial does."""
        if not self.infer_iw:
            log.warning(
                "campaign %d is a census and this probe cannot capture (%s): skipped", campaign.campaign_id, self.iw_capture
            )
            self.spool.finish_round(campaign.campaign_id, number)
            return
        for index in range(next_index, len(plan)):
            if stop.is_set():
                return
            answer = census(
                str(plan[index][0]),
                tls_context=self.tls_context,
                family=campaign.family,
                timeout_s=self.trial_timeout_s,
                # HTTP/3 too where the server offers it (wire v9: a record of its own)
                quic="auto" if self._can_quic() else "no",
                ca_file=self.tls_ca_file,
            )
            records = [to_record(answer, self.credentials.id, campaign.campaign_id, number)]
            quic_record = quic_to_record(answer, self.credentials.id, campaign.campaign_id, number)
            records += [quic_record] if quic_record is not None else []
            for position, record in enumerate(records, 1):
                done = (campaign.campaign_id, number, index + 1) if position == len(records) else None
                self._spool("census", record.census_id, wire.to_dict(record), done, stop)
                log.info("census %s (%s): %s %s", record.url, record.protocol or "tcp", record.status, record.iw_segments)
        self.spool.finish_round(campaign.campaign_id, number)
        log.info("campaign %d census round %d done (%d targets)", campaign.campaign_id, number, len(plan))

    # -- interactive flow
    def _start_interactive(self, campaign: wire.CampaignSchedule) -> Optional[tuple[EchoFlow, wire.ScheduleTarget]]:
        """Start the campaign's interactive flow to the first target with an echo port."""
        if not campaign.interactive_interval_us:
            return None
        for target in campaign.targets:
            if target.echo_port:
                try:
                    flow = EchoFlow(
                        target.host, target.echo_port, campaign.interactive_interval_us, campaign.interactive_packet_bytes
                    )
                except (OSError, ValueError) as error:
                    log.warning("campaign %d: no interactive flow to %s: %s", campaign.campaign_id, target.host, error)
                    return None
                flow.start()
                return flow, target
        log.warning("campaign %d asks for an interactive flow but no target has an echo port", campaign.campaign_id)
        return None

    def _finish_interactive(
        self,
        started: Optional[tuple[EchoFlow, wire.ScheduleTarget]],
        campaign: wire.CampaignSchedule,
        number: int,
        stop: threading.Event,
    ) -> None:
        if started is None:
            return
        flow, target = started
        stats, duration_us = flow.finish()
        silent = stats.sent > 0 and stats.received == 0
        record = wire.TrialRecord(
            trial_id=wire.new_id(),
            probe_id=self.credentials.id,
            campaign_id=campaign.campaign_id,
            origin_id=target.origin_id,
            round=number,
            arm_iw=INTERACTIVE_ARM_IW,
            object_size=stats.sent * stats.packet_bytes,
            url=f"udp://{target.host}:{target.echo_port}",
            started_at=flow.started_at,
            dns_us=None,
            connect_us=None,
            ttfb_us=None,
            total_us=duration_us,
            bytes_received=stats.received * stats.packet_bytes,
            http_status=None,
            error_kind="timeout" if silent else None,
            error_detail="no packet was echoed" if silent else None,
            syn_retrans=0,
            role="interactive",
            echo=stats,
        )
        self._store(record, None, stop)
        self.trials_measured += 1

    # -- offered load
    def _background_target(self, campaign: wire.CampaignSchedule) -> Optional[tuple[wire.ScheduleTarget, int, int]]:
        """(target, IW, port) of the background flow, or ``None`` when the campaign has none."""
        if not campaign.background_bytes:
            return None
        iw = campaign.background_iw or max(campaign.arms)
        for target in campaign.targets:
            for arm in target.arms:
                if arm.iw == iw and wire.is_plain_arm(arm.arm, arm.iw):
                    return target, iw, arm.port
        log.warning("campaign %d: no target serves the background arm IW %d; no background flow", campaign.campaign_id, iw)
        return None

    def _fetch(
        self,
        campaign: wire.CampaignSchedule,
        number: int,
        origin_id: str,
        url: str,
        iw: int,
        size: int,
        timeout_s: float,
        arm: str = "",
        role: str = "",
        page_id: Optional[str] = None,
    ) -> wire.TrialRecord:
        trial_id = wire.new_id()
        if wire.arm_label_protocol(arm) == "quic":
            return self._fetch_quic(campaign, number, origin_id, url, iw, size, timeout_s, trial_id, arm, role, page_id)
        traced = traced_round(self.credentials.id, campaign.campaign_id, number, campaign.trace_share)
        result = fetch(
            url,
            trial_id,
            self.credentials.id,
            connect_timeout_s=min(10.0, timeout_s),
            timeout_s=timeout_s,
            tls_context=self.tls_context,
            family=campaign.family,
            infer_iw=self.infer_iw,
            trace=traced,
        )
        record = result.to_trial(trial_id, self.credentials.id, campaign.campaign_id, origin_id, number, iw, size)
        record.arm, record.role, record.page_id = arm or str(iw), role, page_id
        if traced and self.infer_iw and result.packets:
            trace = wire.TraceRecord(trial_id, "receiver", record.started_at, trace_of(result).to_dict())
            with self._traces_lock:
                self._traces[trial_id] = wire.to_dict(trace)
        return record

    def _fetch_quic(
        self,
        campaign: wire.CampaignSchedule,
        number: int,
        origin_id: str,
        url: str,
        iw: int,
        size: int,
        timeout_s: float,
        trial_id: str,
        arm: str,
        role: str,
        page_id: Optional[str],
    ) -> wire.TrialRecord:
        """A QUIC arm's trial (wire v9): one HTTP/3 fetch over a new connection, the server's
        first flight from the client's own datagram log (no capture, no trace)."""
        from ._quic import fetch_h3

        https = url.replace("http://", "https://", 1)  # HTTP/3 is always encrypted
        fetched = fetch_h3(https, ca_file=self.tls_ca_file, trial_id=trial_id, timeout_s=timeout_s)
        record = quic_trial(
            fetched,
            trial_id=trial_id,
            probe_id=self.credentials.id,
            campaign_id=campaign.campaign_id,
            origin_id=origin_id,
            round_number=number,
            arm_iw=iw,
            arm=arm,
            object_size=size,
            host=urllib.parse.urlsplit(url).hostname or "",
        )
        record.role, record.page_id = role, page_id
        return record

    def _measure(
        self, campaign: wire.CampaignSchedule, number: int, entry: PlanEntry, timeout_s: float
    ) -> list[wire.TrialRecord]:
        """One short flow of the plan: one fetch, or with ``page_connections`` a page load (the
        size split over that many connections opened at once, like a browser's)."""
        if not campaign.page_connections:
            return [
                self._fetch(
                    campaign,
                    number,
                    entry.origin_id,
                    object_url(entry.host, entry.port, entry.size, entry.tls),
                    entry.iw,
                    entry.size,
                    timeout_s,
                    arm=entry.arm,
                )
            ]
        page_id = wire.new_id()
        parts = page_parts(entry.size, campaign.page_connections)
        records: list[Optional[wire.TrialRecord]] = [None] * len(parts)

        def connection(index: int, size: int) -> None:
            records[index] = self._fetch(
                campaign,
                number,
                entry.origin_id,
                object_url(entry.host, entry.port, size, entry.tls),
                entry.iw,
                size,
                timeout_s,
                arm=entry.arm,
                role="page-load",
                page_id=page_id,
            )

        threads = [
            threading.Thread(target=connection, args=(index, size), name="iwprobe-page", daemon=True)
            for index, size in enumerate(parts)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return [record for record in records if record is not None]

    def _run_offered_round(
        self, campaign: wire.CampaignSchedule, number: int, plan: list[list[Any]], stop: threading.Event
    ) -> None:
        """Start the plan's trials at Poisson arrivals (exponential gaps, mean ``1 / rate``)."""
        rate = float(campaign.arrival_rate_per_s or 0)
        finished: queue.Queue[wire.TrialRecord] = queue.Queue()
        slots = threading.Semaphore(MAX_CONCURRENT_TRIALS)
        background = self._background_target(campaign)
        background_thread: Optional[threading.Thread] = None
        if background is not None:
            target, iw, port = background
            url = object_url(target_host(target, campaign.family), port, int(campaign.background_bytes or 0), target.tls)
            alone = self._fetch(
                campaign,
                number,
                target.origin_id,
                url,
                iw,
                int(campaign.background_bytes or 0),
                BACKGROUND_TIMEOUT_S,
                role="background-alone",
            )
            self._store(alone, None, stop)
            self.trials_measured += 1
            background_thread = threading.Thread(
                target=lambda: finished.put(
                    self._fetch(
                        campaign,
                        number,
                        target.origin_id,
                        url,
                        iw,
                        int(campaign.background_bytes or 0),
                        BACKGROUND_TIMEOUT_S,
                        role="background",
                    )
                ),
                name="iwprobe-background",
                daemon=True,
            )
            background_thread.start()
            # Let the long-lived flow leave slow start so the short flows meet a loaded
            # bottleneck (a standing queue), as in the IETF 78 testbed.
            stop.wait(background_warmup_s(alone))

        def one(entry: list[Any]) -> None:
            try:
                for record in self._measure(campaign, number, PlanEntry.from_json(entry), self.trial_timeout_s):
                    finished.put(record)
            finally:
                slots.release()

        echo = self._start_interactive(campaign)

        workers: list[threading.Thread] = []
        next_arrival = time.monotonic()
        for entry in plan:
            next_arrival += self.rng.expovariate(rate)
            while not stop.is_set():
                self._store_finished(finished, stop)
                remaining = next_arrival - time.monotonic()
                if remaining <= 0:
                    break
                stop.wait(min(remaining, 0.05))
            if stop.is_set():
                break
            slots.acquire()
            worker = threading.Thread(target=one, args=(entry,), name="iwprobe-trial", daemon=True)
            worker.start()
            workers.append(worker)
        for worker in workers:
            while worker.is_alive():
                self._store_finished(finished, stop)
                worker.join(0.05)
        # The interactive flow measures while short flows arrive and run, not the bulk flow's tail.
        self._finish_interactive(echo, campaign, number, stop)
        while background_thread is not None and background_thread.is_alive():
            self._store_finished(finished, stop)
            background_thread.join(0.05)
        self._store_finished(finished, stop)
        if stop.is_set():
            return
        self.spool.finish_round(campaign.campaign_id, number)
        log.info(
            "campaign %d round %d done (%d trials at %.2f/s%s)",
            campaign.campaign_id,
            number,
            len(plan),
            rate,
            ", with a background flow" if background else "",
        )

    def _store_finished(self, finished: queue.Queue[wire.TrialRecord], stop: threading.Event) -> None:
        """Spool the trials worker threads finished (the spool is used from this thread only)."""
        while True:
            try:
                record = finished.get_nowait()
            except queue.Empty:
                return
            self._store(record, None, stop)
            self.trials_measured += 1

    def _store(self, record: wire.TrialRecord, round_key: Optional[tuple[int, int, int]], stop: threading.Event) -> None:
        """Spool a trial (see :meth:`_spool`), then its trace if the round is traced."""
        self._spool("trial", record.trial_id, wire.to_dict(record), round_key, stop)
        with self._traces_lock:
            trace = self._traces.pop(record.trial_id, None)
        if trace is not None:
            self._spool("trace", f"{record.trial_id}:receiver", trace, None, stop)

    def _spool(
        self, kind: str, record_id: str, body: dict[str, Any], round_key: Optional[tuple[int, int, int]], stop: threading.Event
    ) -> None:
        """Spool a record; while the spool is full, upload and wait instead of dropping it."""
        attempt = 0
        while True:
            try:
                self.spool.add(kind, record_id, body, round_key)
                return
            except SpoolFull:
                self.uploader.drain(deadline=time.monotonic() + 60, stop=stop)
                if stop.wait(backoff_delay(attempt, 1.0, self.backoff_cap_s)):
                    # Shutting down with a full spool: the trial is lost, say so.
                    log.error("shutting down with a full spool: %s %s not stored", kind, record_id)
                    return
                attempt += 1

    def _calibrate(self, campaign: wire.CampaignSchedule) -> None:
        for target in campaign.targets:
            if self.spool.calibrated(campaign.campaign_id, target.origin_id):
                continue
            sample = calibrate(self.credentials.id, target, self.calibration_bytes)
            if sample is not None:
                self.spool.add_calibration(campaign.campaign_id, target.origin_id, sample.sample_id, wire.to_dict(sample))
                log.info(
                    "path %s: min RTT %.3f ms, bottleneck %s bit/s", target.host, sample.min_rtt_us / 1000, sample.bottleneck_bps
                )

    # -- main loop
    def run(self, once: bool = False, stop: Optional[threading.Event] = None, upload_timeout_s: Optional[float] = None) -> int:
        """Run until ``stop`` (or, with ``once``, until the schedule is done and uploaded)."""
        stop = stop or threading.Event()
        poll_after = 60.0
        attempt = 0
        while not stop.is_set():
            if self.heartbeat_due():
                self.heartbeat()
            schedule = self.schedule()
            if schedule is None:
                delay = backoff_delay(attempt, 1.0, self.backoff_cap_s)
                attempt += 1
                log.warning("no schedule yet; retrying in %.1f s", delay)
                stop.wait(delay)
                continue
            attempt = 0
            poll_after = max(1.0, schedule.poll_after_s)
            wait_s = poll_after
            pending = False
            for campaign in schedule.campaigns:
                if self.campaign_ids is not None and campaign.campaign_id not in self.campaign_ids:
                    continue
                status, number, delay = self._next_round(campaign, time.time())
                if status == "run" and number is not None:
                    self.run_round(campaign, number, stop)
                    status, number, delay = self._next_round(campaign, time.time())
                if status != "done":
                    pending = True
                    wait_s = min(wait_s, delay)
            if once and not pending:
                break
            # Upload between rounds (never during one, so uploads do not compete with trials).
            self.uploader.drain(deadline=time.monotonic() + max(1.0, min(wait_s, 30.0)), stop=stop)
            if wait_s > 0:
                stop.wait(min(wait_s, poll_after))
        if once:
            deadline = time.monotonic() + upload_timeout_s if upload_timeout_s else None
            if not self.uploader.drain(deadline=deadline, stop=stop):
                log.error("exiting with %d records not uploaded (they stay in the spool)", self.uploader.backlog())
                return 1
            self.heartbeat()
        return 0
