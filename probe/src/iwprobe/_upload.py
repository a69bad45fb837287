"""Upload spooled records in batches, with exponential backoff and full jitter."""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from typing import Any, Callable, Optional, Union

from . import wire
from ._collector import CollectorClient, CollectorError
from ._spool import Spool

log = logging.getLogger("iwprobe.upload")

#: What rides along with an upload: a probe's or a server's heartbeat.
AnyHeartbeat = Union[wire.Heartbeat, wire.ServerHeartbeat]
#: The spooled record kinds each role uploads.
_KINDS: dict[str, tuple[str, ...]] = {
    "probe": ("trial", "path_sample", "census"),
    "origin": ("observation",),
    "server": ("aggregate", "passive_connection"),
    "trace": ("trace",),
}
#: Batches stay well below the collector's body limit.
MAX_UPLOAD_BODY_BYTES = 8 * 1024 * 1024


def backoff_delay(attempt: int, base_s: float = 1.0, cap_s: float = 300.0, rng: Optional[random.Random] = None) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base * 2**attempt)]."""
    generator = rng or random
    return generator.uniform(0.0, min(cap_s, base_s * (2 ** min(attempt, 30))))


def retry_delay(
    error: CollectorError, attempt: int, base_s: float = 1.0, cap_s: float = 300.0, rng: Optional[random.Random] = None
) -> float:
    """Seconds before the next attempt after ``error``: :func:`backoff_delay`, but never less
    than the collector's ``Retry-After`` (an overloaded collector answers 503 with one), plus
    up to 50 % jitter so that probes turned away together do not all come back together."""
    generator = rng or random
    delay = backoff_delay(attempt, base_s, cap_s, rng)  # same generator (None: the random module there too)
    if error.retry_after_s is not None:
        delay = max(delay, error.retry_after_s * generator.uniform(1.0, 1.5))
    return delay


def _check_acknowledgement(answer: Any, batch_id: str, records: int) -> None:
    """Records leave the spool only on a :class:`wire.UploadResult` for *this* batch that
    accounts for every record (accepted + duplicates).  Anything else -- an HTML page from a
    captive portal or proxy, a truncated or foreign answer -- is a retryable failure: the
    batch is sent again later and the collector's idempotency makes that harmless."""
    if (
        isinstance(answer, dict)
        and answer.get("batch_id") == batch_id
        and isinstance(answer.get("accepted"), int)
        and isinstance(answer.get("duplicates"), int)
        and answer["accepted"] + answer["duplicates"] == records
    ):
        return
    shown = answer if isinstance(answer, str) else json.dumps(answer)
    raise CollectorError(f"the answer does not acknowledge batch {batch_id} of {records} records: {shown[:200]!r}")


class Uploader:
    """Moves records from a :class:`Spool` to the collector.

    ``role`` is ``"probe"`` (trials and path samples -> :class:`wire.TrialBatch`),
    ``"origin"`` (observations -> :class:`wire.ObservationBatch`), ``"server"`` (a passive
    study's aggregates and connection records -> :class:`wire.PassiveBatch`) or ``"trace"``
    (trial traces -> :class:`wire.TraceBatch`, on their own path).  An uploader may carry a
    ``traces`` uploader of the same spool: it sends traces only when none of its own records
    wait, so traces never delay a trial, and its backlog counts them.  A probe's or
    server's ``heartbeat`` (a function giving its heartbeat when one is due, else ``None``) rides along
    with the next batch it sends (not with the halves of a refused one, so a record is judged
    on its own): one heartbeat per heartbeat interval, whether posted alone or folded into an
    upload (``heartbeat_sent_at``), so folding adds no write to the collector's upload path.
    """

    def __init__(
        self,
        spool: Spool,
        client: CollectorClient,
        role: str,
        owner_id: str,
        max_records: int = wire.MAX_BATCH_RECORDS,
        backoff_base_s: float = 1.0,
        backoff_cap_s: float = 300.0,
        heartbeat: Optional[Callable[[], Optional[AnyHeartbeat]]] = None,
        traces: Optional[Uploader] = None,
    ) -> None:
        if role not in _KINDS:
            raise ValueError(f"role must be one of {', '.join(_KINDS)}, got {role!r}")
        self.spool = spool
        self.client = client
        self.role = role
        self.owner_id = owner_id
        self.max_records = min(max_records, wire.MAX_TRACES_PER_BATCH if role == "trace" else wire.MAX_BATCH_RECORDS)
        self.traces = traces
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.failures = 0
        self.uploaded = 0
        #: ``time.monotonic()`` before which the collector asked not to be sent anything (Retry-After).
        self.not_before = 0.0
        self.heartbeat = heartbeat if role != "origin" else None
        #: ``time.monotonic()`` of the last batch that carried a heartbeat and was stored (0: none).
        self.heartbeat_sent_at = 0.0
        #: The schedule ETag the last accepted trial batch's answer named, and when (monotonic):
        #: the agent skips its schedule poll while it matches the cached one (wire.UploadResult).
        self.schedule_etag = ""
        self.schedule_etag_at = 0.0

    @property
    def kinds(self) -> tuple[str, ...]:
        return _KINDS[self.role]

    def backlog(self) -> int:
        return self.spool.backlog(self.kinds) + (self.traces.backlog() if self.traces is not None else 0)

    def upload_once(self) -> int:
        """Send one batch of the oldest pending records; return how many left the spool.

        Raises :class:`CollectorError` when the collector cannot take it now.
        """
        rows = self.spool.pending(self.kinds, self.max_records, MAX_UPLOAD_BODY_BYTES)
        if not rows:
            return self.traces.upload_once() if self.traces is not None else 0
        return self._send(rows, self.heartbeat() if self.heartbeat is not None else None)

    def _send(self, rows: list[tuple[int, str, dict[str, Any]]], heartbeat: Optional[AnyHeartbeat] = None) -> int:
        batch_id, envelope = self._envelope(rows, heartbeat)
        try:
            _, answer = self.client.post_json(self._path(), envelope)
            _check_acknowledgement(answer, batch_id, len(rows))
            if heartbeat is not None:
                self.heartbeat_sent_at = time.monotonic()
            etag = answer.get("schedule_etag")
            if isinstance(etag, str) and etag:
                self.schedule_etag, self.schedule_etag_at = etag, time.monotonic()
        except CollectorError as error:
            if error.status == 422:
                return self._isolate_rejects(rows, error)
            if error.status == 404 and self.role == "trace":
                # A collector before wire v7 has no traces route: keep them aside (the spool's
                # ``rejected`` table), never block the trials behind them.
                for seq, _, _ in rows:
                    self.spool.reject(seq, f"the collector has no {wire.TRACES_BATCH_PATH} (before wire v7)")
                log.warning("the collector takes no traces (before wire v7): %d kept aside in the spool", len(rows))
                return len(rows)
            if error.status == 413 and len(rows) > 1:
                half = len(rows) // 2
                return self._send(rows[:half]) + self._send(rows[half:])
            raise
        self.spool.acknowledge([seq for seq, _, _ in rows])
        self.uploaded += len(rows)
        log.info("uploaded %d records (accepted %s, duplicates %s)", len(rows), answer["accepted"], answer["duplicates"])
        return len(rows)

    def _isolate_rejects(self, rows: list[tuple[int, str, dict[str, Any]]], error: CollectorError) -> int:
        """A 422 stores nothing: bisect the batch to find the refused records, keep the rest."""
        if len(rows) == 1:
            self.spool.reject(rows[0][0], json.dumps(error.body)[:2000] if error.body is not None else str(error))
            return 1
        half = len(rows) // 2
        return self._send(rows[:half]) + self._send(rows[half:])

    def _path(self) -> str:
        return {
            "probe": wire.TRIALS_BATCH_PATH,
            "origin": wire.OBSERVATIONS_BATCH_PATH,
            "server": wire.PASSIVE_BATCH_PATH,
            "trace": wire.TRACES_BATCH_PATH,
        }[self.role]

    def _envelope(
        self, rows: list[tuple[int, str, dict[str, Any]]], heartbeat: Optional[AnyHeartbeat] = None
    ) -> tuple[str, bytes]:
        """The batch's id and its JSON body."""
        batch_id = wire.new_id()
        envelope: dict[str, Any] = {"wire_version": wire.WIRE_VERSION, "batch_id": batch_id, "sent_at": wire.utc_timestamp()}
        if self.role == "probe":
            envelope["probe_id"] = self.owner_id
            envelope["trials"] = [record for _, kind, record in rows if kind == "trial"]
            envelope["path_samples"] = [record for _, kind, record in rows if kind == "path_sample"]
            census = [record for _, kind, record in rows if kind == "census"]
            if census:  # wire v5; absent otherwise, so a collector of v4 still takes the batch
                envelope["census"] = census
            if heartbeat is not None:
                envelope["heartbeat"] = wire.to_dict(heartbeat)
        elif self.role == "trace":
            envelope["agent_id"] = self.owner_id
            envelope["traces"] = [record for _, _, record in rows]
        elif self.role == "server":
            envelope["server_id"] = self.owner_id
            envelope["aggregates"] = [record for _, kind, record in rows if kind == "aggregate"]
            envelope["connections"] = [record for _, kind, record in rows if kind == "passive_connection"]
            if heartbeat is not None:
                envelope["heartbeat"] = wire.to_dict(heartbeat)
        else:
            envelope["origin_id"] = self.owner_id
            envelope["observations"] = [record for _, _, record in rows]
        return batch_id, json.dumps(envelope, separators=(",", ":")).encode("utf-8")

    def drain(self, deadline: Optional[float] = None, stop: Optional[threading.Event] = None) -> bool:
        """Upload until the backlog is empty (True) or ``deadline`` (monotonic) / ``stop``.

        After an answer with ``Retry-After`` (503 from an overloaded collector) nothing is sent
        before that time, in this call or the next ones: when it lies beyond ``deadline`` the
        call returns False at once, the records stay spooled."""
        while True:
            wait = self.not_before - time.monotonic()
            if wait > 0:
                if deadline is not None and self.not_before > deadline:
                    return False
                if stop is not None:
                    if stop.wait(wait):
                        return False
                else:
                    time.sleep(wait)
            try:
                while self.upload_once():
                    self.failures = 0
                return True
            except CollectorError as error:
                self.failures += 1
                delay = retry_delay(error, self.failures - 1, self.backoff_base_s, self.backoff_cap_s)
                log.warning(
                    "upload failed (%s); retrying in %.1f s (attempt %d, backlog %d)", error, delay, self.failures, self.backlog()
                )
                if error.retry_after_s is not None:
                    self.not_before = time.monotonic() + delay
                    continue
                if deadline is not None and time.monotonic() + delay > deadline:
                    if time.monotonic() >= deadline:
                        return False
                    delay = max(0.0, deadline - time.monotonic())
                if stop is not None:
                    if stop.wait(delay):
                        return False
                else:
                    time.sleep(delay)

    def run_forever(self, stop: threading.Event, idle_s: float = 2.0) -> None:
        """Background loop of the origin: drain whenever there is something to send."""
        while not stop.is_set():
            self.drain(stop=stop)
            stop.wait(idle_s)
