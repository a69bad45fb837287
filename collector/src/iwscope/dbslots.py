"""Admission of request handlers to the database: one slot per pooled connection.

A request that needs the database runs its blocking work through :func:`run_db`: it waits
(asynchronously, holding neither a thread nor a connection) for one of
``pool_size + max_overflow`` slots, at most ``IWSCOPE_DB_POOL_TIMEOUT_S``, then runs the work
in a thread of the slots' own limiter (as many threads as slots), where it checks a
connection out and returns it before the thread ends.  So

* no connection is held while a request reads its body, waits for a thread or sends its
  answer (the starvation of docs/reliability.md "Load": connection holders waiting for
  threads that wait for connections) -- except by a streamed CSV export, which holds its
  slot until the last chunk is sent (:mod:`iwscope.streaming`);
* admitted work never waits in ``pool.connect()`` for connections held by other admitted
  work (there are as many slots as connections; every route of the API takes its
  connections inside a slot; ``/readyz`` uses a connection outside the pool);
* when the database cannot keep up, requests are turned away after a short wait with
  :class:`DatabaseBusy` (answered 503 + ``Retry-After`` by ``iwscope.api``) instead of
  queueing until the clients' own timeouts.

Public reads (the analysis API and its CSV export: arbitrary filters, possibly slow scans)
additionally take one of ``read_share`` -- half the slots, at least one -- before a slot
(``run_db(..., read=True)``, ``db_slot(read=True)``), so however many readers come, the other
half is left to probes, origins and admins.

The slots live per event loop (an anyio ``RunVar``): one uvicorn process has one loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar

from iwscope.config import get_settings
from iwscope.metrics import DB_BUSY

Result = TypeVar("Result")


class DatabaseBusy(Exception):
    """No database slot became free within ``IWSCOPE_DB_POOL_TIMEOUT_S``: retry later."""

    def __init__(self, waited_s: float) -> None:
        super().__init__(f"no database connection free within {waited_s:g} s")
        self.waited_s = waited_s


@dataclass
class _Slots:
    semaphore: anyio.Semaphore
    limiter: anyio.CapacityLimiter
    timeout_s: float
    #: Admission of public reads: at most this many of the slots at once.
    reads: anyio.Semaphore


_SLOTS: RunVar[_Slots] = RunVar("iwscope_db_slots")


def _slots() -> _Slots:
    try:
        return _SLOTS.get()
    except LookupError:
        settings = get_settings()
        slots = _Slots(
            anyio.Semaphore(settings.db_connections),
            anyio.CapacityLimiter(settings.db_connections),
            settings.db_pool_timeout_s,
            anyio.Semaphore(read_share(settings.db_connections)),
        )
        _SLOTS.set(slots)
        return slots


def read_share(connections: int) -> int:
    """Slots public reads may hold at once: half, at least one."""
    return max(1, connections // 2)


async def _acquire(semaphore: anyio.Semaphore, deadline: float, where: str, timeout_s: float) -> None:
    try:
        with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
            await semaphore.acquire()
    except TimeoutError:
        DB_BUSY.labels(where).inc()
        raise DatabaseBusy(timeout_s) from None


@asynccontextmanager
async def db_slot(*, read: bool = False) -> AsyncIterator[anyio.CapacityLimiter]:
    """Hold one database slot (yields the limiter of the slots' threads); with ``read``, one
    within the public reads' share.  All waiting together lasts at most
    ``IWSCOPE_DB_POOL_TIMEOUT_S``, then :class:`DatabaseBusy`."""
    slots = _slots()
    deadline = anyio.current_time() + slots.timeout_s
    async with AsyncExitStack() as held:
        if read:
            await _acquire(slots.reads, deadline, "reads", slots.timeout_s)
            held.callback(slots.reads.release)
        await _acquire(slots.semaphore, deadline, "admission", slots.timeout_s)
        held.callback(slots.semaphore.release)
        yield slots.limiter


async def run_db(function: Callable[..., Result], *args: object, read: bool = False) -> Result:
    """``function(*args)`` -- blocking work that checks a connection out and returns it before
    it ends -- in a thread, once a database slot (``read``: within the readers' share) is free.

    A free slot is taken at once, without :func:`db_slot`'s timeout machinery (a cancel scope
    and an exit stack per call); only a wait for one pays for it.  A free slot means nobody
    waits for one: a released slot goes to a waiter first."""
    slots = _slots()
    if not read:
        try:
            slots.semaphore.acquire_nowait()
        except anyio.WouldBlock:
            pass
        else:
            try:
                return await anyio.to_thread.run_sync(function, *args, limiter=slots.limiter)
            finally:
                slots.semaphore.release()
    async with db_slot(read=read) as limiter:
        return await anyio.to_thread.run_sync(function, *args, limiter=limiter)
