"""The schedules' snapshot of one API process (:class:`iwscope.probes.services.ScheduleSnapshot`).

A fleet of probes asks for its schedule every poll interval; what they are told changes when an
admin creates or edits a campaign, an origin enrolls or is revoked, or a probe finishes an
adaptive campaign.  So the process reads campaigns, origins and done marks at most every
``IWSCOPE_SCHEDULE_CACHE_S`` seconds (one reader at a time, the others wait for its result)
and answers every probe from memory.  Writes through this process's API drop the snapshot at
once; changes made elsewhere (another API process, the worker's precision checks, the CLI)
show at most ``IWSCOPE_SCHEDULE_CACHE_S`` later.
"""

from __future__ import annotations

import datetime as dt

import anyio
from anyio.lowlevel import RunVar

from iwscope.config import Settings
from iwscope.db import session_scope
from iwscope.dbslots import run_db
from iwscope.probes.services import ScheduleSnapshot, load_schedule_snapshot
from iwscope.types import utcnow

_LOCK: RunVar[anyio.Lock] = RunVar("iwscope_schedule_lock")


class _Kept:
    """The process's snapshot and how many writes of this process dropped one (a snapshot
    read while a write happened is not kept: it may predate the write)."""

    snapshot: ScheduleSnapshot | None = None
    generation: int = 0


_kept = _Kept()


def invalidate() -> None:
    """Forget the snapshot: the next schedule reads the database (after a write of this process)."""
    _kept.snapshot = None
    _kept.generation += 1


def _load(now: dt.datetime, horizon_s: float) -> ScheduleSnapshot:
    with session_scope() as session:
        return load_schedule_snapshot(session, now, horizon_s)


def _fresh(snapshot: ScheduleSnapshot | None, now: dt.datetime, settings: Settings) -> ScheduleSnapshot | None:
    if snapshot is None or settings.schedule_cache_s <= 0:
        return None
    if now - snapshot.loaded_at > dt.timedelta(seconds=settings.schedule_cache_s):
        return None
    if now + dt.timedelta(seconds=settings.schedule_poll_s) > snapshot.horizon:
        return None
    return snapshot


def readers_lock() -> anyio.Lock:
    """This event loop's lock of the snapshot's readers (one reads, the others wait for it)."""
    try:
        return _LOCK.get()
    except LookupError:
        lock = anyio.Lock()
        _LOCK.set(lock)
        return lock


class BeingRead(Exception):
    """The kept snapshot is too old and another request is reading the next (``wait=False``)."""


async def current_snapshot(settings: Settings, *, wait: bool = True) -> tuple[ScheduleSnapshot, dt.datetime]:
    """A snapshot valid now, and now (read from the database when the kept one is too old).

    With ``wait=False`` a request that finds another one reading it raises :class:`BeingRead`
    instead of waiting: an upload's answer only offers the schedule's ETag, and at the fleet's
    shape every upload finishing during a read (under load up to a second) waited for it, counted
    in progress by the front door, which then turned new requests away."""
    now = utcnow()
    kept = _fresh(_kept.snapshot, now, settings)
    if kept is not None:
        return kept, now
    lock = readers_lock()
    if not wait and lock.locked():
        raise BeingRead
    async with lock:
        now = utcnow()
        kept = _fresh(_kept.snapshot, now, settings)
        if kept is not None:  # another request read it while this one waited
            return kept, now
        generation = _kept.generation
        snapshot = await run_db(_load, now, settings.schedule_poll_s + settings.schedule_cache_s)
        if _kept.generation == generation:  # no write of this process meanwhile
            _kept.snapshot = snapshot
        return snapshot, now
