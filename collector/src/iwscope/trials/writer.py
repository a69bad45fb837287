"""Group commit of uploads: the uploads that arrive while a group is being stored are checked
and stored together, in one thread hop and one transaction.

At the fleet's shape (10,000 probes, 10-30 trials per upload) the API's CPU went to the
requests, not to the records (docs/ingest-throughput.md): per upload a thread hop with anyio's
slot and timeout machinery, a pooled connection's checkout, and three or four round trips with
a commit (a WAL flush) of their own.  :class:`GroupWriter` pays those once per group:

* an upload joins the writer's queue and waits for its own outcome;
* the writer (a task of the event loop; at most :data:`LANES` groups in flight) takes
  everything queued and hands it to a free :class:`Lane` -- a thread with a database connection
  of its own -- which checks each body (a refused one is answered alone, nothing of it
  stored), then stores the others in one transaction (:func:`iwscope.trials.services.store_group`);
* if that transaction fails for any other reason, each upload is stored alone, so one upload's
  failure is never another's: all or nothing stays per upload.

A lane is not a pooled connection in a thread of anyio's: on the benchmark machine anyio's hop
cost 209-229 us of CPU where a ``SimpleQueue`` to a thread of its own cost 92 us, and the pool's
checkout and return with its reset 20-200 us a group (docs/ingest-throughput.md).  Uploads so never wait
for the slots other requests take (:mod:`iwscope.dbslots`), and other requests never wait
for uploads; the process holds :data:`LANES` connections more than its pool.  A lane's
connection is pinged after a second idle (as the pool's are) and replaced when it broke; a
lane idle for :data:`LANE_IDLE_S` closes it and ends its thread.

An origin's observation uploads (up to ``wire.MAX_BATCH_RECORDS`` records each: statements of
hundreds of milliseconds) are stored by one lane at a time; the others wait for it, so a lane is
always left to the probes' trial uploads.  At the fleet's shape both lanes were at times busy
with observations for a second, the trial uploads queued behind them (90 in one process), and
the front door, which counts them in progress, turned new requests away.

An upload the writer has not taken within ``IWSCOPE_DB_POOL_TIMEOUT_S`` is answered 503 (nothing
of it stored), as a request that finds no database slot is; once taken, it waits for its group.
A group smaller than :data:`GROUP_UPLOADS` waits up to ``IWSCOPE_INGEST_LINGER_MS`` (20 ms) for
more uploads; while one waits, no other drain starts.  Without the wait, at the fleet's rate
(about 80 uploads a second per process) nearly every group held one upload and paid the hand-off,
the round trip and the transaction alone (docs/ingest-throughput.md has the measured difference).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import anyio.to_thread
import psycopg
from anyio.lowlevel import RunVar
from sqlalchemy.engine import Engine

from iwscope.config import get_settings
from iwscope.db import PING_AFTER_IDLE_S, dedicated_connection, get_engine, ping
from iwscope.dbslots import DatabaseBusy
from iwscope.metrics import DB_BUSY
from iwscope.trials import fastwire, services

log = logging.getLogger(__name__)

#: Groups stored at once per process (each in a :class:`Lane`: a thread and a connection).
LANES = 2
#: A group this large is stored at once; a smaller one waits up to ``IWSCOPE_INGEST_LINGER_MS`` for more.
GROUP_UPLOADS = 8
#: A lane idle this long closes its connection and ends its thread (a new group starts them again).
LANE_IDLE_S = 30.0

Validate = Callable[[bytes, uuid.UUID], fastwire.FastTrialBatch | fastwire.FastObservationBatch]


@dataclass(eq=False)
class _Pending:
    validate: Validate
    body: bytes
    identity_id: uuid.UUID
    future: asyncio.Future[services.IngestResult]
    #: An origin's observations (up to ``wire.MAX_BATCH_RECORDS`` a batch): at most one lane at a time.
    observations: bool = False
    expiry: asyncio.TimerHandle | None = field(default=None)


Work = list[tuple[Validate, bytes, uuid.UUID]]
Outcomes = list[services.IngestResult | BaseException]


def check_and_store(database: Engine | psycopg.Connection, pending: Work) -> Outcomes:
    """In a thread: each body checked, the valid ones stored as one group (``database``: as for
    :func:`~iwscope.trials.services.store_group`); one outcome per upload (its result, its
    refusal, or the error that stopped it alone)."""
    outcomes: list[services.IngestResult | BaseException | None] = [None] * len(pending)
    uploads: list[tuple[int, services.Upload]] = []
    for position, (validate, body, identity_id) in enumerate(pending):
        try:
            uploads.append((position, services.Upload(validate(body, identity_id), identity_id)))
        except Exception as error:
            outcomes[position] = error
    if uploads:
        try:
            services.store_group(database, [upload for _, upload in uploads])
        except Exception as error:
            if len(uploads) == 1 or (isinstance(database, psycopg.Connection) and database.closed):
                for position, _ in uploads:  # one upload, or the connection is gone: each fails
                    outcomes[position] = error
            else:
                log.warning("a group of %d uploads failed (%s): storing each alone", len(uploads), error)
                for position, upload in uploads:
                    try:
                        services.store_group(database, [upload])
                    except Exception as alone:
                        outcomes[position] = alone
                    else:
                        outcomes[position] = upload.outcome
        else:
            for position, upload in uploads:
                outcomes[position] = upload.outcome
    return [outcome if outcome is not None else RuntimeError("upload without an outcome") for outcome in outcomes]


_Job = tuple[Work, asyncio.AbstractEventLoop, "asyncio.Future[Outcomes]"]


class Lane:
    """A thread with a database connection of its own that runs :func:`check_and_store` for
    one group at a time (see the module's docstring)."""

    def __init__(self, engine: Engine, idle_s: float = LANE_IDLE_S) -> None:
        self._engine = engine
        self._idle_s = idle_s
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._connection: psycopg.Connection | None = None
        self._used_at = 0.0

    def run(self, work: Work) -> asyncio.Future[Outcomes]:
        """Check and store ``work`` in this lane's thread; the future of its outcomes."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcomes] = loop.create_future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="iwscope-upload-lane", daemon=True)
                self._thread.start()
            self._jobs.put((work, loop, future))
        return future

    def close(self, timeout_s: float = 5.0) -> None:
        """End the thread (after the group in hand) and close the connection; blocks."""
        with self._lock:
            thread = self._thread
            if thread is not None:
                self._jobs.put(None)
        if thread is not None:
            thread.join(timeout_s)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def _serve(self) -> None:
        try:
            while True:
                try:
                    job = self._jobs.get(timeout=self._idle_s)
                except queue.Empty:
                    with self._lock:
                        if self._jobs.empty():  # else a job came meanwhile: serve it
                            self._thread = None
                            return
                    continue
                if job is None:
                    with self._lock:
                        self._thread = None
                    return
                work, loop, future = job
                try:
                    outcome: Outcomes | BaseException = check_and_store(self._usable_connection(), work)
                except Exception as error:  # no connection: every upload of the group gets it
                    outcome = error
                self._used_at = time.monotonic()
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                    loop.call_soon_threadsafe(_settle, future, outcome)
        finally:
            if self._connection is not None:
                with contextlib.suppress(psycopg.Error):
                    self._connection.close()
                self._connection = None

    def _usable_connection(self) -> psycopg.Connection:
        """The lane's connection: replaced when it broke, pinged after a second idle."""
        connection = self._connection
        if connection is not None and connection.closed:
            connection = None
        if connection is not None and time.monotonic() - self._used_at > PING_AFTER_IDLE_S:
            try:
                ping(self._engine, connection)
            except psycopg.Error:
                with contextlib.suppress(psycopg.Error):
                    connection.close()
                connection = None
        if connection is None:
            connection = dedicated_connection(self._engine, f"iwscope-upload-lane[{os.getpid()}]")
        self._connection = connection
        return connection


Result = TypeVar("Result")


def _settle(future: asyncio.Future[Result], outcome: Result | BaseException) -> None:
    """The future's result or exception, unless it is settled already (expired, cancelled)."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class GroupWriter:
    """The uploads of one event loop, stored in groups (see the module's docstring)."""

    def __init__(
        self, lanes: int = LANES, engine: Engine | None = None, linger_s: float | None = None, group_uploads: int = GROUP_UPLOADS
    ) -> None:
        self.lanes = lanes
        self._engine = engine
        self.linger_s = get_settings().ingest_linger_ms / 1000 if linger_s is None else linger_s
        self.group_uploads = group_uploads
        self._queue: deque[_Pending] = deque()
        self._running = 0
        #: Set while a drain waits for its group to fill; set again (early) once it is full.
        self._filling: asyncio.Event | None = None
        #: Lanes no drain task holds (created as drains need them, at most ``lanes``).
        self._free: list[Lane] = []
        self._all: list[Lane] = []
        #: The drain tasks in flight (the event loop keeps only weak references to tasks).
        self._tasks: set[asyncio.Task[None]] = set()
        #: A lane is storing a group with observation uploads (the others' wait for it).
        self._observing = False

    async def aclose(self) -> None:
        """End the lanes' threads and close their connections."""
        for lane in self._all:
            await anyio.to_thread.run_sync(lane.close)

    async def store(
        self, validate: Validate, body: bytes, identity_id: uuid.UUID, *, observations: bool = False
    ) -> services.IngestResult:
        """Check and store one upload's body with whatever else is queued; its result, or
        :class:`~iwscope.trials.validation.BatchRejected` / :class:`~iwscope.dbslots.DatabaseBusy`.
        ``observations``: an origin's observation upload, which at most one lane stores at a time."""
        loop = asyncio.get_running_loop()
        pending = _Pending(validate, body, identity_id, loop.create_future(), observations)
        timeout_s = get_settings().db_pool_timeout_s
        pending.expiry = loop.call_later(timeout_s, self._expire, pending, timeout_s)
        self._queue.append(pending)
        if self._filling is not None:  # a drain waits for this group: no second one
            if len(self._queue) >= self.group_uploads:
                self._filling.set()
        elif self._running < self.lanes:
            self._running += 1
            task = loop.create_task(self._drain())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await pending.future

    def _expire(self, pending: _Pending, timeout_s: float) -> None:
        """Not taken within the slot timeout: a 503, as for a request that found no slot."""
        try:
            self._queue.remove(pending)
        except ValueError:  # taken meanwhile
            return
        DB_BUSY.labels("admission").inc()
        if not pending.future.done():
            pending.future.set_exception(DatabaseBusy(timeout_s))

    def _lane(self) -> Lane:
        if self._free:
            return self._free.pop()
        lane = Lane(self._engine if self._engine is not None else get_engine())
        self._all.append(lane)
        return lane

    async def _fill(self) -> None:
        """Wait up to ``linger_s`` for the queued group to reach ``group_uploads``."""
        filling = self._filling = asyncio.Event()
        try:
            # asyncio.timeout, not wait_for: wait_for wraps the wait in a task of its own (3.11).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.linger_s):
                    await filling.wait()
        finally:
            self._filling = None

    def _take(self) -> tuple[list[_Pending], bool]:
        """The queued uploads this drain stores next, and whether they include observation
        uploads; those stay queued while another lane stores some (see the module's docstring)."""
        if self._observing:
            group = [pending for pending in self._queue if not pending.observations]
            self._queue = deque(pending for pending in self._queue if pending.observations)
            return group, False
        group = list(self._queue)
        self._queue.clear()
        observing = any(pending.observations for pending in group)
        self._observing = observing
        return group, observing

    async def _drain(self) -> None:
        lane = self._lane()
        observing = False
        try:
            while self._queue:
                if self.linger_s > 0 and len(self._queue) < self.group_uploads:
                    await self._fill()
                group, observing = self._take()
                if not group:  # only observation uploads, and another lane stores some: it takes them next
                    break
                for pending in group:
                    if pending.expiry is not None:
                        pending.expiry.cancel()
                work = [(pending.validate, pending.body, pending.identity_id) for pending in group]
                try:
                    outcomes = await lane.run(work)
                except Exception as error:  # no connection, or a fault: every upload of the group gets it
                    for pending in group:
                        if not pending.future.done():
                            pending.future.set_exception(error)
                    continue
                except BaseException:  # the loop is going away: so are the requests waiting on it
                    for pending in group:
                        pending.future.cancel()
                    raise
                finally:
                    if observing:
                        self._observing = observing = False
                for pending, outcome in zip(group, outcomes, strict=True):
                    _settle(pending.future, outcome)
        finally:
            if observing:
                self._observing = False
            self._free.append(lane)
            self._running -= 1


_WRITER: RunVar[GroupWriter] = RunVar("iwscope_group_writer")


def group_writer() -> GroupWriter:
    """This event loop's :class:`GroupWriter`."""
    try:
        return _WRITER.get()
    except LookupError:
        writer = GroupWriter()
        _WRITER.set(writer)
        return writer


async def close_group_writer() -> None:
    """Close this event loop's :class:`GroupWriter`, if it has one (its lanes' threads and connections)."""
    try:
        writer = _WRITER.get()
    except LookupError:
        return
    await writer.aclose()


__all__ = [
    "LANES",
    "LANE_IDLE_S",
    "GroupWriter",
    "Lane",
    "Outcomes",
    "Validate",
    "Work",
    "check_and_store",
    "close_group_writer",
    "group_writer",
]
