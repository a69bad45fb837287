"""Admission of request handlers to the database: one slot per pooled connection.

A request that needs the database runs its blocking work through :func:`run_db`: it waits
(asynchronously, holding neither a thread nor a connection) for one of
``pool_size + max_overflow`` slots, at most ``IWSCOPE_DB_POOL_TIMEOUT_S``, then runs the work
in a thread of the slots' own limiter (as many threads as slots), where it checks a
connection out and returns it before the thread ends.  So

* no connection is held while a request reads its body, waits for a thread or sends its
  answer (the starvation of docs/reliability.md "Load": connection holders waiting for
  threads that wait for connections);
* admitted work never waits in ``pool.connect()`` for connections held by other admitted
  work (there are as many slots as connections); it can only wait for connections held by
  code outside the slots (sync routes with ``SessionDep``, the CSV export), and then at most
  ``pool_timeout``;
* when the database cannot keep up, requests are turned away after a short wait with
  :class:`DatabaseBusy` (answered 503 + ``Retry-After`` by ``iwscope.api``) instead of
  queueing until the clients' own timeouts.

The slots live per event loop (an anyio ``RunVar``): one uvicorn process has one loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
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


_SLOTS: RunVar[_Slots] = RunVar("iwscope_db_slots")


def _slots() -> _Slots:
    try:
        return _SLOTS.get()
    except LookupError:
        settings = get_settings()
        slots = _Slots(anyio.Semaphore(settings.db_connections),
                       anyio.CapacityLimiter(settings.db_connections), settings.db_pool_timeout_s)
        _SLOTS.set(slots)
        return slots


@asynccontextmanager
async def db_slot() -> AsyncIterator[anyio.CapacityLimiter]:
    """Hold one database slot (yields the limiter of the slots' threads); :class:`DatabaseBusy`
    when none becomes free in time."""
    slots = _slots()
    try:
        with anyio.fail_after(slots.timeout_s):
            await slots.semaphore.acquire()
    except TimeoutError:
        DB_BUSY.labels("admission").inc()
        raise DatabaseBusy(slots.timeout_s) from None
    try:
        yield slots.limiter
    finally:
        slots.semaphore.release()


async def run_db(function: Callable[..., Result], *args: object) -> Result:
    """``function(*args)`` -- blocking work that checks a connection out and returns it before
    it ends -- in a thread, once a database slot is free."""
    async with db_slot() as limiter:
        return await anyio.to_thread.run_sync(function, *args, limiter=limiter)

