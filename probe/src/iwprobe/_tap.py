"""``iwprobe tap``: per-client IW arms and passive measurement on an operator's own web server.

The agent runs beside an unmodified server (nginx, Caddy, HAProxy, ...), as root (it needs
``CAP_NET_ADMIN`` for the arms and the destroy notifications, ``CAP_NET_RAW`` for the capture).
Two threads:

* the **control** thread polls the collector for the server's configuration (or reads a study
  from a file, standalone), installs the study's arms when its time box opens and removes
  them when it closes, on ``disable`` or on exit (:mod:`iwprobe._tap_rules`), renews their
  lease, flushes the edge aggregates into the spool and writes ``tap-status.json``;
* the **measuring** thread reads the destroy notifications (every connection's final
  ``TCP_INFO``, :mod:`iwprobe._sockdiag`) and the capture (the first response of a share of
  connections, :mod:`iwprobe._passive_capture`), joins them, finds each connection's arm and
  client key (:mod:`iwprobe._tap_edge`) and adds it to the aggregates; both stay within budgets
  of what they cost the server (:mod:`iwprobe._tap_budget`);

and the uploader (:class:`iwprobe._upload.Uploader`, role ``server``) drains the spool.

Assignment changes (a share sweep) are exact for captured connections (their SYN's time is
known) and for the others only once every connection opened before the change is gone: a
connection whose prefix changed arm and that closed within :data:`AMBIGUOUS_AFTER_CHANGE_S`
of the change is counted (``ambiguous``) and left out.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from . import __version__, wire
from ._collector import CollectorClient, CollectorError, from_dict
from ._passive_capture import DEFAULT_CAPTURE_PPS, PassiveCapture
from ._routes import run_ip
from ._sockdiag import ClosedConnection, DestroyListener
from ._spool import Spool, SpoolFull
from ._tap_arms import make_arms, remove
from ._tap_budget import (
    DEFAULT_CAPTURE_TRAFFIC_PPS,
    DEFAULT_CLOSES_PER_S,
    CaptureWindows,
    DutyCycle,
)
from ._tap_edge import Assignment, EdgeAggregator, Measured, PrefixKeyer, RegionMap, client_bytes
from ._tap_rules import DEFAULT_LEASE_S, STATE_FILE, ArmsError, TapPlan
from ._tcpinfo import FieldReader
from ._upload import Uploader

log = logging.getLogger("iwprobe.tap")

SERVER_CREDENTIALS = "server.json"
DISABLED_FILE = "tap-disabled"
STATUS_FILE = "tap-status.json"
CONFIG_CACHE_FILE = "tap-config.json"
SPOOL_FILE = "tap-spool.sqlite"
#: How long a connection may live: one that closes later than this after a share change was
#: surely assigned under the new shares (nginx keeps an idle connection 65 s by default).
AMBIGUOUS_AFTER_CHANGE_S = 300.0
#: A destroy notification waits this long for the capture to have read its last packets.
JOIN_GRACE_NS = 300_000_000
#: How often the measuring thread reads what the kernel queued (its buffers hold seconds of it).
READ_INTERVAL_S = 0.02
#: The capture starts with 1/16 of the connections (``--capture-start-share``) and widens while the
#: packet rate allows: starting with all of them, the kernel copied every packet of a busy server
#: into the capture's queue for its first second.
INITIAL_SAMPLING_BITS = 4
#: The capture follows twice as many connections again only after its packet rate stayed under a
#: quarter of its budget this long.
WIDEN_AFTER_S = 30.0
#: How long a stopping agent keeps uploading (what is left stays spooled for its next start; the
#: unit's TimeoutStopSec is 30 s).
SHUTDOWN_UPLOAD_S = 20.0
_RETRANS = FieldReader(("total_retrans",))
#: Client prefixes whose key and region are remembered (then the memory starts over).
MAX_CACHED_PREFIXES = 1_000_000
#: A followed connection without a packet for this long is forgotten (its close was not seen).
FLOW_EXPIRY_NS = 600 * 1_000_000_000


def default_iw() -> Optional[int]:
    """The IW of connections no arm touches: the main default route's ``initcwnd``, else the
    kernel's (10, RFC 6928)."""
    outcome = run_ip(["ip", "route", "show", "default"])
    words = outcome.stdout.split()
    if "initcwnd" in words:
        try:
            return int(words[words.index("initcwnd") + 1])
        except (IndexError, ValueError):
            return None
    return 10


@dataclass
class TapCounters:
    seen: int = 0
    captured: int = 0
    ambiguous: int = 0
    #: Captured connections whose first flight exceeded their arm's IW (the arm was not applied).
    arm_exceeded: int = 0
    lost: int = 0
    packets_dropped: int = 0
    #: Closes not measured because the agent was over its budget (:mod:`iwprobe._tap_budget`).
    unmeasured: int = 0
    started: float = field(default_factory=time.monotonic)


def _traffic_packets() -> int:
    """Packets received and sent on every interface of the agent's network namespace."""
    total = 0
    try:
        with open("/proc/net/dev", encoding="ascii") as handle:
            for line in handle.readlines()[2:]:
                fields = line.split(":", 1)[1].split()
                total += int(fields[1]) + int(fields[9])
    except (OSError, IndexError, ValueError):
        return 0
    return total


class Measurer:
    """The measuring thread of one study (ports): joins closes with captures, aggregates."""

    def __init__(
        self,
        ports: list[int],
        keyer: PrefixKeyer,
        regions: RegionMap,
        aggregator: EdgeAggregator,
        counters: TapCounters,
        capture_pps: int = DEFAULT_CAPTURE_PPS,
        capture: bool = True,
        capture_start_bits: int = INITIAL_SAMPLING_BITS,
        closes_per_s: float = DEFAULT_CLOSES_PER_S,
        capture_traffic_pps: float = DEFAULT_CAPTURE_TRAFFIC_PPS,
    ) -> None:
        self.ports = ports
        self.keyer = keyer
        self.regions = regions
        self.aggregator = aggregator
        self.counters = counters
        self.capture_pps = capture_pps
        self.listener = DestroyListener(ports)
        self.capture_enabled = capture
        self.capture: Optional[PassiveCapture] = None
        #: The capture's port-bit sampling, kept while it is closed between windows.
        self.sampling_bits = capture_start_bits
        self.windows = CaptureWindows(capture_traffic_pps, time.monotonic())
        self._traffic = _traffic_packets() if capture and self.windows.limited else 0
        self.duty = DutyCycle(closes_per_s, time.monotonic())
        self._unmeasured_counted = 0
        self.assignment: Optional[Assignment] = None
        #: (assignment, changed at: ``time.time_ns()``) of the previous phase, for the ambiguity check.
        self.previous: Optional[tuple[Assignment, int]] = None
        self._pending: deque[tuple[int, ClosedConnection]] = deque()
        self._quiet_since = time.monotonic()
        self._window_whole = False
        #: Per client prefix: (keyed hash, cluster, region, country) -- computed once per user.
        self._clients: dict[bytes, tuple[str, int, str, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tap-measure", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.listener.close()
        if self.capture is not None:
            self.capture.close()

    def set_keyer(self, keyer: PrefixKeyer) -> None:
        if (keyer.prefix_v4, keyer.prefix_v6) != (self.keyer.prefix_v4, self.keyer.prefix_v6):
            self._clients = {}
        self.keyer = keyer

    def set_assignment(self, assignment: Optional[Assignment]) -> None:
        if (
            self.assignment is not None
            and assignment is not None
            and (self.assignment.study.campaign_id, self.assignment.study.phase)
            != (assignment.study.campaign_id, assignment.study.phase)
        ):
            self.previous = (self.assignment, time.time_ns())
        self.assignment = assignment

    @property
    def closes_share(self) -> float:
        """Share of each second the agent listens for closes (1 below its budget)."""
        return self.duty.share

    @property
    def capture_share(self) -> float:
        """Share of new connections the capture follows in the long run: its port sampling times
        the share of time it admits new ones (:class:`CaptureWindows`); 0 while the server's rate
        is not known yet."""
        if not self.capture_enabled:
            return 0.0
        return self.windows.admitting_share / (1 << self.sampling_bits)

    def _set_sampling(self, bits: int) -> None:
        assert self.capture is not None
        self.capture.set_sampling(bits)
        self.sampling_bits = self.capture.sampling_bits  # kept for the next window

    def _window(self, now: float) -> None:
        """Open or close the capture as :class:`CaptureWindows` says (closed, it costs nothing)."""
        if not self.capture_enabled:
            return
        state = self.windows.state(now)
        if state == "closed" and self.capture is not None:
            self.counters.packets_dropped += self.capture.kernel_drops()
            self.capture.close()
            self.capture = None
        elif state != "closed" and self.capture is None:
            self.capture = PassiveCapture(self.ports, self.sampling_bits)
            self._window_whole = False
        if self.capture is not None:
            self.capture.table.admitting = state == "admit"

    def _sleep_s(self, duty: DutyCycle, window_start: float) -> float:
        """How long the measuring thread may sleep: :data:`READ_INTERVAL_S` while it listens or the
        capture is open; otherwise nothing is queued for it, so until the next thing due -- the
        listening window's edge, a pending close's join, the once-a-second accounting (a wake-up
        every 20 ms of a mostly idle agent was a share of its CPU)."""
        now = time.monotonic()
        due = duty.next_change_s(now)
        if self.capture is not None or duty.listening(now):
            return min(READ_INTERVAL_S, due)
        due = min(due, max(0.001, window_start + 1.0 - now))
        if self._pending:
            due = min(due, max(0.001, (self._pending[0][0] - time.time_ns()) / 1e9))
        return due

    def _run(self) -> None:
        window_start = next_expiry = time.monotonic()
        window_packets = 0
        duty = self.duty
        self._window(window_start)
        while not self._stop.is_set():
            # Woken by the clock, not by each message: the kernel queues notifications and packets
            # with their times (``SO_TIMESTAMPNS``), so reading them in batches loses nothing and
            # saves a wake-up per message (at 1,000 closes/s most of the agent's CPU).
            self._stop.wait(self._sleep_s(duty, window_start))
            if self.capture is not None:
                window_packets += self.capture.read()
            now_ns = time.time_ns()
            closes = self.listener.read(0)
            for closed in closes:
                self._pending.append((now_ns + JOIN_GRACE_NS, closed))
            while self._pending and self._pending[0][0] <= now_ns:
                self._finish(self._pending.popleft()[1])
            now = time.monotonic()
            listening = duty.listening(now)
            duty.account(now, listening, len(closes))
            self.listener.listen(listening)
            if now - window_start >= 1.0:
                if self.capture_enabled and self.windows.limited:
                    traffic = _traffic_packets()
                    self.windows.observe(now, (traffic - self._traffic) / (now - window_start))
                    self._traffic = traffic
                if self._window_whole:  # a second with the capture open throughout
                    self._adapt(window_packets / (now - window_start))
                self._window_whole = self.capture is not None
                duty.adapt(now)
                self.counters.unmeasured += int(duty.unmeasured) - self._unmeasured_counted
                self._unmeasured_counted = int(duty.unmeasured)
                window_start, window_packets = now, 0
            self._window(now)
            if now >= next_expiry and self.capture is not None:
                self.capture.expire(now_ns - FLOW_EXPIRY_NS)
                next_expiry = now + 30.0
        while self._pending:
            self._finish(self._pending.popleft()[1])

    def _adapt(self, packets_per_s: float) -> None:
        """Keep the capture within its packet budget: above it, follow ``2**-k`` as many
        connections at once (``k`` the bits the rate exceeds it by), below a quarter of it twice as
        many; count what the kernel dropped."""
        self.counters.lost = self.listener.overruns
        if self.capture is None:
            return
        self.counters.packets_dropped += self.capture.kernel_drops()
        bits = self.capture.sampling_bits
        now = time.monotonic()
        if packets_per_s > self.capture_pps:
            self._set_sampling(bits + max(1, math.ceil(math.log2(packets_per_s / self.capture_pps))))
            self._quiet_since = now
        elif packets_per_s >= self.capture_pps / 4:
            self._quiet_since = now
        elif bits > 0 and now - self._quiet_since >= WIDEN_AFTER_S:
            # Widen only after a quiet spell: widening at once brought long keep-alive
            # connections back into the capture every other second (each one costs its packets
            # without giving a first response: it was not followed from its SYN).
            self._set_sampling(bits - 1)
            self._quiet_since = now

    def _finish(self, closed: ClosedConnection) -> None:
        assignment = self.assignment
        if assignment is None:
            return
        try:
            packed = client_bytes(closed.family, closed.remote_addr)
        except OSError:
            return
        first = self.capture.pop(packed, closed.remote_port, closed.local_port) if self.capture is not None else None
        self.counters.seen += 1
        prefix = self.keyer.prefix(packed)
        arm = assignment.arm_of(prefix)
        if self.previous is not None:
            before, changed_ns = self.previous
            if closed.closed_ns - changed_ns >= AMBIGUOUS_AFTER_CHANGE_S * 1e9:
                self.previous = None
            elif first is not None and first.syn_ns < changed_ns:
                assignment, arm = before, before.arm_of(prefix)  # its SYN came before the change
            elif first is None and before.arm_of(prefix).arm != arm.arm:
                self.counters.ambiguous += 1
                return
        if first is not None:
            self.counters.captured += 1
        arm_iw = arm.iw if arm.iw is not None else assignment.default_iw
        if (
            first is not None
            and arm_iw is not None
            and first.first_flight_segments is not None
            and first.first_flight_segments > arm_iw
            and not first.syn_retrans
            and not _RETRANS.read(closed.info_raw)[0]
        ):
            # (With a loss, limited transmit sends new data on duplicate ACKs: not the arm's doing.)
            self.counters.arm_exceeded += 1
        client = self._clients.get(prefix)
        if client is None:
            if len(self._clients) >= MAX_CACHED_PREFIXES:
                self._clients.clear()
            client = self._clients[prefix] = (*self.keyer.hash(prefix), *self.regions.lookup(prefix, packed))
        client_prefix, cluster, region, country = client
        measured = Measured(
            closed, first, arm, arm_iw, region, country, client_prefix, cluster, "ipv4" if len(packed) == 4 else "ipv6"
        )
        self.aggregator.add(measured, assignment.study, assignment.treated_share_bp)


class TapAgent:
    """The ``iwprobe tap run`` daemon (see the module docstring)."""

    def __init__(
        self,
        directory: str,
        *,
        credentials: Any = None,
        study_file: Optional[str] = None,
        output: Optional[str] = None,
        regions: Optional[RegionMap] = None,
        lease_s: float = DEFAULT_LEASE_S,
        capture_pps: int = DEFAULT_CAPTURE_PPS,
        capture: bool = True,
        capture_start_bits: int = INITIAL_SAMPLING_BITS,
        closes_per_s: float = DEFAULT_CLOSES_PER_S,
        capture_traffic_pps: float = DEFAULT_CAPTURE_TRAFFIC_PPS,
        plan_options: Optional[dict[str, int]] = None,
        spool_max_bytes: int = 512 * 1024 * 1024,
        arms: str = "auto",
        cgroup: Optional[str] = None,
    ) -> None:
        if credentials is None and study_file is None:
            raise ValueError("either enrolled credentials or a study file")
        self.directory = directory
        self.credentials = credentials
        self.study_file = study_file
        self.output = output
        self.regions = regions or RegionMap()
        self.lease_s = lease_s
        self.capture_pps = capture_pps
        self.capture_enabled = capture
        self.capture_start_bits = capture_start_bits
        self.closes_per_s = closes_per_s
        self.capture_traffic_pps = capture_traffic_pps
        self.plan_options = plan_options or {}
        self.arms = make_arms(arms, cgroup)
        self.server_id = credentials.id if credentials is not None else "00000000-0000-0000-0000-000000000000"
        self.aggregator = EdgeAggregator(self.server_id)
        self.counters = TapCounters()
        self.key = PrefixKeyer.load_key(directory)
        self.state_path = os.path.join(directory, STATE_FILE)
        self.plan: Optional[TapPlan] = None
        self.measurer: Optional[Measurer] = None
        #: (capture_share, closes_share) of the last measurer, for the status after it stopped.
        self._last_shares: tuple[float, float] = (0.0, 1.0)
        self.arms_state = "off"
        self._etag: Optional[str] = None
        self._config: Optional[wire.ServerConfig] = None
        self._next_poll = 0.0
        self.spool: Optional[Spool] = None
        self.uploader: Optional[Uploader] = None
        if credentials is not None:
            self.spool = Spool(os.path.join(directory, SPOOL_FILE), spool_max_bytes)
            self.uploader = Uploader(
                self.spool, credentials.client(), "server", credentials.id, backoff_cap_s=60.0, heartbeat=self._heartbeat
            )

    # ----------------------------------------------------------------- the study
    def _poll_config(self) -> Optional[wire.PassiveStudy]:
        """The study of the current configuration (polled when due; the last one known, cached
        on disk, while the collector is away)."""
        if self.study_file is not None:
            with open(self.study_file, encoding="utf-8") as handle:
                study: wire.PassiveStudy = from_dict(wire.PassiveStudy, json.load(handle))
            return study
        now = time.monotonic()
        if now >= self._next_poll:
            self._fetch_config()
        return self._config.study if self._config is not None else None

    def _fetch_config(self) -> None:
        client: CollectorClient = self.credentials.client(timeout_s=10.0)
        path = wire.SERVER_CONFIG_PATH.format(server_id=self.credentials.id)
        cache = os.path.join(self.directory, CONFIG_CACHE_FILE)
        try:
            status, answer, etag = client.get_json_if_changed(path, self._etag)
            if status == 200 and isinstance(answer, dict):
                self._config = from_dict(wire.ServerConfig, answer)
                self._etag = etag
                with open(cache + ".tmp", "w", encoding="utf-8") as handle:
                    json.dump(answer, handle)
                os.replace(cache + ".tmp", cache)
            poll_s = self._config.poll_after_s if self._config is not None else 60.0
            self._next_poll = time.monotonic() + max(1.0, poll_s)
        except CollectorError as error:
            log.warning("configuration poll failed (%s); keeping the last one known", error)
            if self._config is None and os.path.exists(cache):
                with open(cache, encoding="utf-8") as handle:
                    self._config = from_dict(wire.ServerConfig, json.load(handle))
            self._next_poll = time.monotonic() + 10.0

    def _in_force(self, study: Optional[wire.PassiveStudy]) -> Optional[wire.PassiveStudy]:
        if study is None or os.path.exists(os.path.join(self.directory, DISABLED_FILE)):
            return None
        now = wire.utc_timestamp()
        starts = wire.parse_timestamp(study.starts_at) if study.starts_at else None
        ends = wire.parse_timestamp(study.ends_at) if study.ends_at else None
        moment = wire.parse_timestamp(now)
        if (starts is not None and moment < starts) or (ends is not None and moment >= ends):
            return None
        return study

    def _apply(self, study: Optional[wire.PassiveStudy]) -> None:
        """Install, change or remove the arms (and start or stop measuring) to match ``study``."""
        plan = TapPlan.from_study(study, lease_s=self.lease_s, **self.plan_options) if study is not None else None
        if plan is not None and self.plan is not None and plan.key == self.plan.key and plan.ports == self.plan.ports:
            return
        if plan is None:
            if self.plan is not None or os.path.exists(self.state_path):
                self.arms.remove(self.state_path, self.plan)
            self.plan = None
            self.arms_state = "off"
            self._stop_measuring()
            return
        assert study is not None
        try:
            self.arms.install(plan, self.state_path)
        except ArmsError as error:
            self.arms_state = f"error: {error}"[:500]
            log.error("%s", error)
            self.plan = None
            return
        self.plan = plan
        self.arms_state = "on"
        assignment = Assignment(study, plan.arms, default_iw())
        if self.measurer is not None and self.measurer.ports != plan.ports:
            self._stop_measuring()
        if self.measurer is None:
            self.measurer = Measurer(
                plan.ports,
                PrefixKeyer(self.key, study.prefix_v4, study.prefix_v6),
                self.regions,
                self.aggregator,
                self.counters,
                self.capture_pps,
                self.capture_enabled,
                self.capture_start_bits,
                self.closes_per_s,
                self.capture_traffic_pps,
            )
            self.measurer.start()
        else:
            self.measurer.set_keyer(PrefixKeyer(self.key, study.prefix_v4, study.prefix_v6))
        self.measurer.set_assignment(assignment)

    def _stop_measuring(self) -> None:
        if self.measurer is not None:
            self.measurer.stop()
            # the status written at shutdown still says what the shares were while measuring
            self._last_shares = (self.measurer.capture_share, self.measurer.closes_share)
            self.measurer = None
            self.flush()

    # ----------------------------------------------------------------- output
    def flush(self) -> int:
        aggregates, connections = self.aggregator.flush()
        if self.output is not None:
            with open(self.output, "a", encoding="utf-8") as handle:
                for kind, records in (("aggregate", aggregates), ("connection", connections)):
                    for record in records:
                        handle.write(json.dumps({"kind": kind, **record}, separators=(",", ":")) + "\n")
        if self.spool is not None:
            for kind, records, id_field in (
                ("aggregate", aggregates, "aggregate_id"),
                ("passive_connection", connections, "record_id"),
            ):
                for record in records:
                    try:
                        self.spool.add(kind, record[id_field], record)
                    except SpoolFull:
                        self.counters.lost += 1
        return len(aggregates) + len(connections)

    def _heartbeat(self) -> wire.ServerHeartbeat:
        counters = self.counters
        return wire.ServerHeartbeat(
            version=__version__,
            uptime_s=round(time.monotonic() - counters.started, 1),
            arms_state=self.arms_state,
            connections_seen=counters.seen,
            connections_captured=counters.captured,
            notifications_lost=counters.lost,
            packets_dropped=counters.packets_dropped,
            capture_share=self.measurer.capture_share if self.measurer is not None else self._last_shares[0],
            closes_share=self.measurer.closes_share if self.measurer is not None else self._last_shares[1],
            spool_backlog=self.uploader.backlog() if self.uploader is not None else 0,
            spool_bytes=self.spool.disk_bytes() if self.spool is not None else 0,
        )

    def status(self) -> dict[str, Any]:
        heartbeat = wire.to_dict(self._heartbeat())
        heartbeat.update(
            arms_method=self.arms.method,
            ambiguous=self.counters.ambiguous,
            arm_exceeded=self.counters.arm_exceeded,
            unmeasured=self.counters.unmeasured,
            study=self.plan.key[0] if self.plan is not None else None,
            phase=self.plan.key[1] if self.plan is not None else None,
            pid=os.getpid(),
            written_at=wire.utc_timestamp(),
        )
        return heartbeat

    def _write_status(self) -> None:
        path = os.path.join(self.directory, STATUS_FILE)
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(self.status(), handle)
        os.replace(path + ".tmp", path)

    # ----------------------------------------------------------------- the loop
    def run(self, stop: threading.Event) -> int:
        """Until ``stop``: follow the configuration, keep the lease, flush, upload."""
        if os.path.exists(self.state_path):
            log.info("removing the arms a previous agent left: %s", "; ".join(remove(self.state_path)) or "nothing")
        upload_stop = threading.Event()
        uploader_thread = None
        if self.uploader is not None:
            uploader_thread = threading.Thread(
                target=self.uploader.run_forever, args=(upload_stop, 1.0), name="tap-upload", daemon=True
            )
            uploader_thread.start()
        next_flush = time.monotonic()
        next_lease = 0.0
        try:
            while not stop.is_set():
                study = self._in_force(self._poll_config())
                self._apply(study)
                now = time.monotonic()
                if self.plan is not None and now >= next_lease:
                    try:
                        self.arms.renew_lease(self.plan)
                    except ArmsError as error:
                        log.error("lease renewal failed (%s): installing the arms again", error)
                        self.plan = None
                    next_lease = now + self.lease_s / 4
                if now >= next_flush:
                    self.flush()
                    self._write_status()
                    interval = study.flush_interval_s if study is not None else 60
                    next_flush = now + interval
                stop.wait(min(1.0, self.lease_s / 8))
        finally:
            self._apply(None)
            self.flush()
            self._write_status()
            if self.uploader is not None:
                self.uploader.drain(deadline=time.monotonic() + SHUTDOWN_UPLOAD_S)
                upload_stop.set()
                if uploader_thread is not None:
                    uploader_thread.join(timeout=5)
        return 0
