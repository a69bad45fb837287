"""Group commit of uploads: the uploads that arrive while a group is being stored are checked
and stored together, in one thread hop and one transaction.

At the fleet's shape (10,000 probes, 10-30 trials per upload) the API's CPU went to the
requests, not to the records (docs/ingest-throughput.md): per upload a thread hop with anyio's
slot and timeout machinery, a pooled connection's checkout, and three or four round trips with
a commit (a WAL flush) of their own.  :class:`GroupWriter` pays those once per group:

* an upload joins the writer's queue and waits for its own outcome;
* the writer (a task of the event loop; at most :data:`LANES` groups in flight) takes
  everything queued, waits for ONE database slot (:func:`iwscope.dbslots.run_db`, so the
  admission, the readers' share and the 503 of a busy database are those of every other
  request) and, in one thread: checks each body (a refused one is answered alone, nothing of it
  stored), then stores the others in one transaction (:func:`iwscope.trials.services.store_group`);
* if that transaction fails for any other reason, each upload is stored alone, so one upload's
  failure is never another's: all or nothing stays per upload.

An upload the writer has not taken within ``IWSCOPE_DB_POOL_TIMEOUT_S`` is answered 503 as an
upload that found no slot was (nothing of it stored); once taken, it waits for its group.
A group is no later than the uploads it holds: the writer does not wait to fill one.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from anyio.lowlevel import RunVar
from sqlalchemy.engine import Engine

from iwscope.config import get_settings
from iwscope.db import get_engine
from iwscope.dbslots import DatabaseBusy, run_db
from iwscope.metrics import DB_BUSY
from iwscope.trials import fastwire, services

log = logging.getLogger(__name__)

#: Groups stored at once per process (each holds one database slot while it is stored).
LANES = 2

Validate = Callable[[bytes, uuid.UUID], fastwire.FastTrialBatch | fastwire.FastObservationBatch]


@dataclass(eq=False)
class _Pending:
    validate: Validate
    body: bytes
    identity_id: uuid.UUID
    future: asyncio.Future[services.IngestResult]
    expiry: asyncio.TimerHandle | None = field(default=None)


def check_and_store(
    engine: Engine, pending: list[tuple[Validate, bytes, uuid.UUID]]
) -> list[services.IngestResult | BaseException]:
    """In a thread: each body checked, the valid ones stored as one group; one outcome per
    upload (its result, its refusal, or the error that stopped it alone)."""
    outcomes: list[services.IngestResult | BaseException | None] = [None] * len(pending)
    uploads: list[tuple[int, services.Upload]] = []
    for position, (validate, body, identity_id) in enumerate(pending):
        try:
            uploads.append((position, services.Upload(validate(body, identity_id), identity_id)))
        except Exception as error:
            outcomes[position] = error
    if uploads:
        try:
            services.store_group(engine, [upload for _, upload in uploads])
        except Exception as error:
            if len(uploads) == 1:
                outcomes[uploads[0][0]] = error
            else:
                log.warning("a group of %d uploads failed (%s): storing each alone", len(uploads), error)
                for position, upload in uploads:
                    try:
                        services.store_group(engine, [upload])
                    except Exception as alone:
                        outcomes[position] = alone
                    else:
                        outcomes[position] = upload.outcome
        else:
            for position, upload in uploads:
                outcomes[position] = upload.outcome
    return [outcome if outcome is not None else RuntimeError("upload without an outcome") for outcome in outcomes]


class GroupWriter:
    """The uploads of one event loop, stored in groups (see the module's docstring)."""

    def __init__(self, lanes: int = LANES) -> None:
        self.lanes = lanes
        self._queue: deque[_Pending] = deque()
        self._running = 0
        #: The drain tasks in flight (the event loop keeps only weak references to tasks).
        self._tasks: set[asyncio.Task[None]] = set()

    async def store(self, validate: Validate, body: bytes, identity_id: uuid.UUID) -> services.IngestResult:
        """Check and store one upload's body with whatever else is queued; its result, or
        :class:`~iwscope.trials.validation.BatchRejected` / :class:`~iwscope.dbslots.DatabaseBusy`."""
        loop = asyncio.get_running_loop()
        pending = _Pending(validate, body, identity_id, loop.create_future())
        timeout_s = get_settings().db_pool_timeout_s
        pending.expiry = loop.call_later(timeout_s, self._expire, pending, timeout_s)
        self._queue.append(pending)
        if self._running < self.lanes:
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

    async def _drain(self) -> None:
        try:
            while self._queue:
                group = list(self._queue)
                self._queue.clear()
                for pending in group:
                    if pending.expiry is not None:
                        pending.expiry.cancel()
                work = [(pending.validate, pending.body, pending.identity_id) for pending in group]
                try:
                    outcomes = await run_db(check_and_store, get_engine(), work)
                except Exception as error:  # DatabaseBusy (no slot in time), or a fault: every upload of the group gets it
                    for pending in group:
                        if not pending.future.done():
                            fresh = DatabaseBusy(error.waited_s) if isinstance(error, DatabaseBusy) else error
                            pending.future.set_exception(fresh)
                    continue
                except BaseException:  # the loop is going away: so are the requests waiting on it
                    for pending in group:
                        pending.future.cancel()
                    raise
                for pending, outcome in zip(group, outcomes, strict=True):
                    if pending.future.done():
                        continue
                    if isinstance(outcome, BaseException):
                        pending.future.set_exception(outcome)
                    else:
                        pending.future.set_result(outcome)
        finally:
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


__all__ = ["LANES", "GroupWriter", "Validate", "check_and_store", "group_writer"]
