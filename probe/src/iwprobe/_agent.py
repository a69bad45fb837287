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
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from . import __version__, sizes, wire
from ._collector import CollectorClient, CollectorError, from_dict
from ._fetch import FetchResult, fetch, object_url
from ._spool import Spool, SpoolFull
from ._upload import Uploader, backoff_delay

log = logging.getLogger("iwprobe.agent")

DEFAULT_STATE_DIR = "/var/lib/iwprobe"
PROBE_CREDENTIALS = "probe.json"
ORIGIN_CREDENTIALS = "origin.json"
#: Bytes fetched to calibrate a path (min RTT and bottleneck bandwidth).
DEFAULT_CALIBRATION_BYTES = 1_000_000
#: Most trials of an offered-load round in flight at once (arrivals beyond it wait).
MAX_CONCURRENT_TRIALS = 256
#: Timeout of a background (long-lived) flow, seconds.
BACKGROUND_TIMEOUT_S = 600.0


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
        raise SystemExit(f"not enrolled: {path} does not exist; run 'iwprobe {'origin ' if filename == ORIGIN_CREDENTIALS else ''}enroll' first") from None
    mode = os.stat(path).st_mode & 0o777
    if mode & 0o077:
        log.warning("credentials file %s has mode %o; it should be 0600", path, mode)
    return Credentials(**data)


def enroll_probe(collector: str, token: str, request: wire.EnrollRequest, directory: str,
                 ca_file: Optional[str] = None) -> Tuple[Credentials, str]:
    client = CollectorClient(collector, None, ca_file)
    _, answer = client.post_json(wire.PROBE_ENROLL_PATH, wire.dumps(request), token=token)
    response = from_dict(wire.EnrollResponse, answer)
    credentials = Credentials("probe", response.id, response.credential, collector, ca_file, request.name, request.region)
    return credentials, save_credentials(directory, PROBE_CREDENTIALS, credentials)


def enroll_origin(collector: str, token: str, request: wire.OriginEnrollRequest, directory: str,
                  ca_file: Optional[str] = None) -> Tuple[Credentials, str]:
    client = CollectorClient(collector, None, ca_file)
    _, answer = client.post_json(wire.ORIGIN_ENROLL_PATH, wire.dumps(request), token=token)
    response = from_dict(wire.EnrollResponse, answer)
    credentials = Credentials("origin", response.id, response.credential, collector, ca_file, request.name, request.region)
    return credentials, save_credentials(directory, ORIGIN_CREDENTIALS, credentials)


# ------------------------------------------------------------------------ calibration
def estimate_bottleneck_bps(progress: Sequence[Tuple[int, ...]], window_us: int) -> Optional[int]:
    """Highest rate over any span of at least ``window_us`` (two-pointer scan).

    ``progress`` holds ``(microseconds, cumulative bytes, ...)`` samples; with more than one
    byte count per sample, a span's rate is the lowest of their rates (see :func:`arrivals`).
    """
    best: Optional[float] = None
    start = 0
    for end in range(len(progress)):
        while start + 1 < end and progress[end][0] - progress[start + 1][0] >= window_us:
            start += 1
        span = progress[end][0] - progress[start][0]
        if span >= window_us and span > 0:
            moved = min(after - before for after, before in zip(progress[end][1:], progress[start][1:]))
            rate = moved * 8 * 1_000_000 / span
            best = rate if best is None or rate > best else best
    return int(best) if best is not None else None


def arrivals(result: FetchResult) -> List[Tuple[int, ...]]:
    """``(microseconds, bytes read, payload bytes arrived)`` of a progress-recording fetch.

    Each count overshoots the link in its own way, so a span's rate is the lower of the two.
    Bytes the application read jump after a loss, when the retransmission releases the
    out-of-order queue in one read, and when a reader that fell behind reads a backlog (a
    1 Mbit/s, 1.5 %-loss path read at +54 %, an unloaded 100 Mbit/s, 5 ms one at +21 %).
    Segments the kernel received (``tcpi_data_segs_in`` times the receive MSS) follow the
    arrivals but count duplicates: behind a deep buffer the sender's RTO fires spuriously and
    resends what is still queued (+7 % on a 56 kbit/s modem with a 4.6 s buffer).
    """
    mss = result.tcp_info.get("rcv_mss") or 0
    if not mss:
        return [(t_us, read) for t_us, read, _ in result.progress]
    return [(t_us, read, segments * mss) for t_us, read, segments in result.progress]


#: Shortest span a calibration rate is taken over, whatever the RTT: over a few
#: milliseconds, scheduling (the reader's, a loaded emulator's) bunches arrivals.  A
#: transfer too fast to last four of them (16 MiB over a veth: ~7 ms) uses a quarter of its
#: duration instead.
MIN_RATE_SPAN_US = 50_000


#: A calibration transfer is long enough once it carries this many estimated BDPs.
CALIBRATION_BDPS = 4


def calibrate(probe_id: str, target: wire.ScheduleTarget, calibration_bytes: int,
              timeout_s: float = 120.0, max_bytes: int = wire.MAX_OBJECT_BYTES) -> Optional[wire.PathSample]:
    """Measure min RTT and bottleneck bandwidth to ``target`` with a larger transfer.

    ``tcpi_delivery_rate`` is a sender-side estimate (the rate the *sender's* data is
    delivered); on the probe, which only receives, it is meaningless, so the bottleneck is
    the highest rate of arriving data (:func:`arrivals`) over any span of at least two minimum
    RTTs and :data:`MIN_RATE_SPAN_US` (or a quarter of a shorter transfer).  That equals the
    bottleneck rate only once the transfer left slow start (window above the BDP).  While
    still in slow start that estimate B is about 3/4 of the last window per RTT and the
    transfer about two last windows, so ``size < CALIBRATION_BDPS * B * min_rtt``: the
    transfer is then repeated 4x larger (up to ``max_bytes``, the origin's object bound,
    and ``timeout_s`` overall).  A transfer covering 4 estimated BDPs gives the plateau
    rate.  If a larger transfer fails, the previous one is used.  The origin's own
    ``tcpi_delivery_rate`` of the same connections is in its observations.
    """
    if not target.arms:
        return None
    arm = max(target.arms, key=lambda a: a.iw)
    deadline = time.monotonic() + timeout_s
    size = min(calibration_bytes, max_bytes)
    best_rtt: Optional[int] = None
    good: Optional[FetchResult] = None
    while True:
        remaining = deadline - time.monotonic()
        result = fetch(object_url(target.host, arm.port, size), timeout_s=max(1.0, remaining), record_progress=True)
        if result.connect_us is None and good is None:
            log.warning("calibration of %s failed: %s %s", target.host, result.error_kind, result.error_detail)
            return None
        if result.error_kind is not None and good is not None:
            log.warning("calibration transfer of %d bytes from %s failed (%s); keeping the previous one",
                        size, target.host, result.error_kind)
            result = good
            break
        rtts = [value for value in (result.connect_us, result.tcp_info.get("min_rtt") or None, best_rtt) if value]
        if not rtts:
            log.warning("calibration of %s failed: %s %s", target.host, result.error_kind, result.error_detail)
            return None
        best_rtt = int(min(rtts))
        duration_us = result.progress[-1][0] - result.progress[0][0] if result.progress else 0
        window_us = max(2 * best_rtt, min(MIN_RATE_SPAN_US, duration_us // 4))
        bottleneck = estimate_bottleneck_bps(arrivals(result), window_us) if result.error_kind is None else None
        long_enough = bottleneck is not None and size >= CALIBRATION_BDPS * bottleneck / 8 * best_rtt / 1e6
        elapsed_s = (result.total_us or 0) / 1e6
        good = result if result.error_kind is None else good
        if (result.error_kind is not None or long_enough or size >= max_bytes
                or time.monotonic() + 5 * max(elapsed_s, 0.1) > deadline):
            break
        size = min(size * 4, max_bytes)
    if best_rtt is None:
        return None
    if bottleneck is not None and not long_enough:
        log.warning("calibration of %s stopped at %d bytes, fewer than %d BDPs: the bandwidth is a lower bound",
                    target.host, size, CALIBRATION_BDPS)
    return wire.PathSample(sample_id=wire.new_id(), probe_id=probe_id, origin_id=target.origin_id,
                           measured_at=result.started_at, min_rtt_us=best_rtt, bottleneck_bps=bottleneck,
                           transfer_bytes=result.body_bytes if result.error_kind is None else 0,
                           method="arrival_rate_max")


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

    def __init__(self, directory: str, credentials: Credentials, spool_max_bytes: int = 512 * 1024 * 1024,
                 heartbeat_s: float = 60.0, calibration_bytes: int = DEFAULT_CALIBRATION_BYTES,
                 trial_timeout_s: float = 60.0, trial_gap_s: float = 0.05, backoff_cap_s: float = 60.0,
                 rng: Optional[random.Random] = None, campaign_ids: Optional[Sequence[int]] = None) -> None:
        self.directory = directory
        self.credentials = credentials
        self.client = credentials.client()
        self.spool = Spool(os.path.join(directory, "probe-spool.sqlite"), spool_max_bytes)
        self.uploader = Uploader(self.spool, self.client, "probe", credentials.id, backoff_cap_s=backoff_cap_s)
        self.heartbeat_s = heartbeat_s
        self.calibration_bytes = calibration_bytes
        self.trial_timeout_s = trial_timeout_s
        self.trial_gap_s = trial_gap_s
        self.backoff_cap_s = backoff_cap_s
        #: Only these campaigns are run (``None``: every campaign the schedule names).
        self.campaign_ids = set(campaign_ids) if campaign_ids else None
        self.rng = rng or random.Random()
        self.started = time.monotonic()
        self.trials_measured = 0
        self._last_heartbeat = 0.0
        self._schedule_path = os.path.join(directory, "schedule.json")

    # -- collector conversations
    def heartbeat(self) -> None:
        beat = wire.Heartbeat(version=__version__, spool_backlog=self.uploader.backlog(),
                              spool_bytes=self.spool.disk_bytes(), uptime_s=round(time.monotonic() - self.started, 3),
                              trials_measured=self.trials_measured)
        try:
            self.client.post_json(wire.PROBE_HEARTBEAT_PATH.format(probe_id=self.credentials.id), wire.dumps(beat))
            self._last_heartbeat = time.monotonic()
        except CollectorError as error:
            log.warning("heartbeat failed: %s", error)

    def schedule(self) -> Optional[wire.Schedule]:
        """The current schedule from the collector, or the cached one when it is unreachable."""
        try:
            _, answer = self.client.get_json(wire.PROBE_SCHEDULE_PATH.format(probe_id=self.credentials.id))
            schedule = from_dict(wire.Schedule, answer)
            descriptor, temporary = tempfile.mkstemp(dir=self.directory)
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                json.dump(answer, handle)
            os.replace(temporary, self._schedule_path)
            return schedule
        except CollectorError as error:
            log.warning("schedule pull failed (%s); using the cached schedule", error)
        try:
            with open(self._schedule_path, encoding="utf-8") as handle:
                return from_dict(wire.Schedule, json.load(handle))
        except FileNotFoundError:
            return None

    # -- rounds
    def _plan(self, campaign: wire.CampaignSchedule) -> List[List[Any]]:
        if campaign.sizes:
            round_sizes = list(campaign.sizes)
        elif campaign.size_dist:
            round_sizes = sizes.sample(campaign.size_dist, campaign.sizes_per_round, self.rng)
        else:
            raise ValueError(f"campaign {campaign.campaign_id} has neither sizes nor size_dist")
        plan: List[List[Any]] = []
        for target in campaign.targets:
            # Plain arms only (a paced or learned listener of the same IW is another arm).
            ports = {arm.iw: arm.port for arm in target.arms if wire.is_plain_arm(arm.arm, arm.iw)}
            for iw in campaign.arms:
                if iw not in ports:
                    log.warning("origin %s has no arm IW %d; skipped", target.origin_id, iw)
                    continue
                for size in round_sizes:
                    plan.append([target.origin_id, target.host, iw, ports[iw], size])
        self.rng.shuffle(plan)
        return plan

    def _next_round(self, campaign: wire.CampaignSchedule, now: float) -> Tuple[str, Optional[int], float]:
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
            if campaign.calibrate:
                self._calibrate(campaign)
            self.spool.start_round(campaign.campaign_id, number, self._plan(campaign))
            state = self.spool.round_state(campaign.campaign_id)
        plan, next_index, _, _ = state[number]
        if campaign.arrival_rate_per_s:
            self._run_offered_round(campaign, number, plan, stop)
            return
        if next_index:
            log.info("resuming campaign %d round %d at trial %d of %d", campaign.campaign_id, number, next_index, len(plan))
        for index in range(next_index, len(plan)):
            if stop.is_set():
                return
            origin_id, host, iw, port, size = plan[index]
            trial_id = wire.new_id()
            result = fetch(object_url(host, port, size), trial_id, self.credentials.id,
                           connect_timeout_s=min(10.0, self.trial_timeout_s), timeout_s=self.trial_timeout_s)
            record = result.to_trial(trial_id, self.credentials.id, campaign.campaign_id, origin_id, number, iw, size)
            self._store(record, (campaign.campaign_id, number, index + 1), stop)
            self.trials_measured += 1
            if self.trial_gap_s:
                stop.wait(self.trial_gap_s)
        self.spool.finish_round(campaign.campaign_id, number)
        log.info("campaign %d round %d done (%d trials)", campaign.campaign_id, number, len(plan))

    # -- offered load
    def _background_target(self, campaign: wire.CampaignSchedule) -> Optional[Tuple[wire.ScheduleTarget, int, int]]:
        """(target, IW, port) of the background flow, or ``None`` when the campaign has none."""
        if not campaign.background_bytes:
            return None
        iw = campaign.background_iw or max(campaign.arms)
        for target in campaign.targets:
            for arm in target.arms:
                if arm.iw == iw and wire.is_plain_arm(arm.arm, arm.iw):
                    return target, iw, arm.port
        log.warning("campaign %d: no target serves the background arm IW %d; no background flow",
                    campaign.campaign_id, iw)
        return None

    def _measure(self, campaign: wire.CampaignSchedule, number: int, origin_id: str, url: str, iw: int,
                 size: int, timeout_s: float) -> wire.TrialRecord:
        trial_id = wire.new_id()
        result = fetch(url, trial_id, self.credentials.id, connect_timeout_s=min(10.0, timeout_s), timeout_s=timeout_s)
        return result.to_trial(trial_id, self.credentials.id, campaign.campaign_id, origin_id, number, iw, size)

    def _run_offered_round(self, campaign: wire.CampaignSchedule, number: int, plan: List[List[Any]],
                           stop: threading.Event) -> None:
        """Start the plan's trials at Poisson arrivals (exponential gaps, mean ``1 / rate``)."""
        rate = float(campaign.arrival_rate_per_s or 0)
        finished: "queue.Queue[wire.TrialRecord]" = queue.Queue()
        slots = threading.Semaphore(MAX_CONCURRENT_TRIALS)
        background = self._background_target(campaign)
        background_thread: Optional[threading.Thread] = None
        if background is not None:
            target, iw, port = background
            url = object_url(target.host, port, int(campaign.background_bytes or 0))
            alone = self._measure(campaign, number, target.origin_id, url + wire.FLOW_FRAGMENT_BACKGROUND_ALONE, iw,
                                  int(campaign.background_bytes or 0), BACKGROUND_TIMEOUT_S)
            self._store(alone, None, stop)
            self.trials_measured += 1
            background_thread = threading.Thread(
                target=lambda: finished.put(self._measure(campaign, number, target.origin_id,
                                                          url + wire.FLOW_FRAGMENT_BACKGROUND, iw,
                                                          int(campaign.background_bytes or 0), BACKGROUND_TIMEOUT_S)),
                name="iwprobe-background", daemon=True)
            background_thread.start()
            # Let the long-lived flow leave slow start so the short flows meet a loaded
            # bottleneck (a standing queue), as in the IETF 78 testbed.
            stop.wait(background_warmup_s(alone))

        def one(entry: List[Any]) -> None:
            origin_id, host, iw, port, size = entry
            try:
                finished.put(self._measure(campaign, number, origin_id, object_url(host, port, size), iw, size,
                                           self.trial_timeout_s))
            finally:
                slots.release()

        workers: List[threading.Thread] = []
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
        for worker in workers + ([background_thread] if background_thread else []):
            while worker.is_alive():
                self._store_finished(finished, stop)
                worker.join(0.05)
        self._store_finished(finished, stop)
        if stop.is_set():
            return
        self.spool.finish_round(campaign.campaign_id, number)
        log.info("campaign %d round %d done (%d trials at %.2f/s%s)", campaign.campaign_id, number, len(plan), rate,
                 ", with a background flow" if background else "")

    def _store_finished(self, finished: "queue.Queue[wire.TrialRecord]", stop: threading.Event) -> None:
        """Spool the trials worker threads finished (the spool is used from this thread only)."""
        while True:
            try:
                record = finished.get_nowait()
            except queue.Empty:
                return
            self._store(record, None, stop)
            self.trials_measured += 1

    def _store(self, record: wire.TrialRecord, round_key: Optional[Tuple[int, int, int]], stop: threading.Event) -> None:
        """Spool a trial; while the spool is full, upload and wait instead of dropping it."""
        attempt = 0
        while True:
            try:
                self.spool.add("trial", record.trial_id, wire.to_dict(record), round_key)
                return
            except SpoolFull:
                self.uploader.drain(deadline=time.monotonic() + 60, stop=stop)
                if stop.wait(backoff_delay(attempt, 1.0, self.backoff_cap_s)):
                    # Shutting down with a full spool: the trial is lost, say so.
                    log.error("shutting down with a full spool: trial %s not stored", record.trial_id)
                    return
                attempt += 1

    def _calibrate(self, campaign: wire.CampaignSchedule) -> None:
        for target in campaign.targets:
            if self.spool.calibrated(campaign.campaign_id, target.origin_id):
                continue
            sample = calibrate(self.credentials.id, target, self.calibration_bytes)
            if sample is not None:
                self.spool.add_calibration(campaign.campaign_id, target.origin_id, sample.sample_id, wire.to_dict(sample))
                log.info("path %s: min RTT %.3f ms, bottleneck %s bit/s", target.host, sample.min_rtt_us / 1000,
                         sample.bottleneck_bps)

    # -- main loop
    def run(self, once: bool = False, stop: Optional[threading.Event] = None,
            upload_timeout_s: Optional[float] = None) -> int:
        """Run until ``stop`` (or, with ``once``, until the schedule is done and uploaded)."""
        stop = stop or threading.Event()
        poll_after = 60.0
        attempt = 0
        while not stop.is_set():
            if time.monotonic() - self._last_heartbeat >= self.heartbeat_s:
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
