"""Every probe's, origin's and server's stored credential in memory: a credential the cache
does not hold is checked without the database.

The credential cache (:class:`iwscope.auth.dependencies.CredentialCache`) remembers a verified
credential for five minutes, per process.  A probe's cycle is about a minute and a fleet's API
runs several processes, each a probe reaches at random, so at the fleet's shape (10,000
probes, two processes) one upload in five still missed it, and each miss was a database
lookup in a thread of its own: 13 % of the API's CPU in a profile of the steady stage, plus
the query in PostgreSQL (docs/ingest-throughput.md).

So each process reads every row of a kind at once (``id, name, region, secret_hash,
revoked_at``: about 200 bytes a row) and checks a missed credential against it: a dictionary
lookup and the same constant-time hash comparison.  It trusts that copy exactly as long as the
long cache is trusted: while it hears PostgreSQL's notifications of credential changes
(:mod:`iwscope.auth.invalidation`) and for at most ``IWSCOPE_CREDENTIAL_CACHE_NOTIFIED_S``
after reading it.  A notification naming a row drops that row (it is read alone at its next
use); any other notification, and the listener's start and loss, drop the copy.  Rows
inserted later (enrollments notify nothing) are read alone at their first use and added.  A
kind with more than :data:`MAX_ROWS` rows is not copied (its misses are looked up one by one,
as before).

A read of the whole kind, or of one row, notes the copy's generation first and is kept only if
no notification came meanwhile: a revocation heard while the read ran must not be undone by
the old row it read.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Literal

import anyio
from anyio.lowlevel import RunVar
from sqlalchemy import select

from iwscope.db import get_engine
from iwscope.dbslots import run_db
from iwscope.origins.models import Origin
from iwscope.probes.models import Probe
from iwscope.servers.models import Server

#: A kind with more rows than this is not copied (about 200 bytes a row: 40 MB at the bound).
MAX_ROWS = 200_000

IdentityKind = Literal["probe", "origin", "server"]
#: The table of each kind of identity (the same columns: id, name, region, secret_hash, revoked_at).
MODELS: dict[IdentityKind, type[Probe] | type[Origin] | type[Server]] = {"probe": Probe, "origin": Origin, "server": Server}
#: The notification payload's table (``<table>:<id>``, migration 0008) -> the kind.
_KIND_OF_TABLE = {model.__tablename__: kind for kind, model in MODELS.items()}


@dataclass(frozen=True)
class StoredIdentity:
    """A probe's, origin's or server's row as authentication needs it."""

    id: uuid.UUID
    name: str
    region: str
    #: ``None`` when revoked (compared against the dummy hash, like an unknown identity).
    secret_hash: str | None


def read_one(kind: IdentityKind, identity: uuid.UUID) -> StoredIdentity | None:
    """One row (in a database slot's thread; the connection is returned here)."""
    model = MODELS[kind]
    with get_engine().connect() as connection:
        row = connection.execute(
            select(model.id, model.name, model.region, model.secret_hash, model.revoked_at).where(model.id == identity)
        ).first()
    if row is None:
        return None
    return StoredIdentity(row.id, row.name, row.region, row.secret_hash if row.revoked_at is None else None)


def _read_all(kind: IdentityKind) -> dict[uuid.UUID, StoredIdentity] | None:
    """Every row of ``kind``, or ``None`` when there are more than :data:`MAX_ROWS`."""
    model = MODELS[kind]
    with get_engine().connect() as connection:
        found = connection.execute(
            select(model.id, model.name, model.region, model.secret_hash, model.revoked_at).limit(MAX_ROWS + 1)
        ).all()
    if len(found) > MAX_ROWS:
        return None
    return {
        row.id: StoredIdentity(row.id, row.name, row.region, row.secret_hash if row.revoked_at is None else None) for row in found
    }


@dataclass
class KindCopy:
    """The copy of one kind's rows (``rows is None``: none held)."""

    rows: dict[uuid.UUID, StoredIdentity] | None = None
    read_at: float = 0.0
    #: Bumped by every drop: a read that started before it is not kept.
    generation: int = 0
    #: The kind had more than :data:`MAX_ROWS` rows at the last read: not copied until ``read_at + ttl``.
    too_large: bool = False


class IdentityDirectory:
    """This process's copies of every kind (see the module's docstring)."""

    def __init__(self) -> None:
        self.copies = {kind: KindCopy() for kind in MODELS}
        #: Notifications come on the listener's thread: a drop and a keep never interleave.
        self._lock = threading.Lock()

    def drop_all(self) -> None:
        """Forget every copy (the listener started or stopped, or a notification named no row)."""
        with self._lock:
            for copy in self.copies.values():
                copy.rows = None
                copy.too_large = False
                copy.generation += 1

    def notified(self, payload: str | None) -> None:
        """A notification: ``<table>:<id>`` drops that row; anything else (``None``: the listener
        started or stopped) drops every copy."""
        table, _, text = (payload or "").partition(":")
        kind = _KIND_OF_TABLE.get(table)
        try:
            identity = uuid.UUID(text) if kind is not None else None
        except ValueError:
            identity = None
        if kind is None or identity is None:
            self.drop_all()
            return
        copy = self.copies[kind]
        with self._lock:
            copy.generation += 1
            if copy.rows is not None:
                copy.rows.pop(identity, None)

    async def find(
        self, kinds: tuple[IdentityKind, ...], identity: uuid.UUID, ttl_s: float
    ) -> tuple[IdentityKind, StoredIdentity] | None:
        """The row of ``identity`` among ``kinds`` (the first kind that has it) and its kind, from
        the copies when they are trusted (``ttl_s > 0``: the process listens), else from the
        database; ``None`` when no kind has it."""
        if ttl_s <= 0:
            return await _read_each(kinds, identity)
        missing: list[IdentityKind] = []
        for kind in kinds:
            copy = self.copies[kind]
            if not _fresh(copy, ttl_s):
                await self._refresh(kind, ttl_s)
            if not _fresh(copy, ttl_s) or copy.rows is None:  # too large, or notified while it was read
                missing.append(kind)
                continue
            stored = copy.rows.get(identity)
            if stored is not None:
                return kind, stored
            missing.append(kind)
        # Not in the copies: enrolled since they were read (or a kind that is not copied).
        for kind in missing:
            copy = self.copies[kind]
            generation = copy.generation
            stored = await run_db(read_one, kind, identity)
            if stored is not None:
                with self._lock:
                    if copy.rows is not None and copy.generation == generation:
                        copy.rows[identity] = stored
                return kind, stored
        return None

    async def _refresh(self, kind: IdentityKind, ttl_s: float) -> None:
        """Read ``kind``'s rows, one reader at a time (the others wait for its result)."""
        copy = self.copies[kind]
        async with _lock(kind):
            if _fresh(copy, ttl_s) or (copy.too_large and time.monotonic() - copy.read_at <= ttl_s):
                return  # another request read it while this one waited (or it is not copied for now)
            generation = copy.generation
            started = time.monotonic()
            rows = await run_db(_read_all, kind)
            with self._lock:
                if copy.generation != generation:  # a notification meanwhile: the read may predate it
                    return
                copy.rows, copy.read_at = rows, started
                copy.too_large = rows is None


def _fresh(copy: KindCopy, ttl_s: float) -> bool:
    return copy.rows is not None and time.monotonic() - copy.read_at <= ttl_s


async def _read_each(kinds: tuple[IdentityKind, ...], identity: uuid.UUID) -> tuple[IdentityKind, StoredIdentity] | None:
    for kind in kinds:
        stored = await run_db(read_one, kind, identity)
        if stored is not None:
            return kind, stored
    return None


_LOCKS: RunVar[dict[str, anyio.Lock]] = RunVar("iwscope_identity_directory_locks")


def _lock(kind: str) -> anyio.Lock:
    try:
        locks = _LOCKS.get()
    except LookupError:
        locks = {}
        _LOCKS.set(locks)
    return locks.setdefault(kind, anyio.Lock())


#: This process's directory (the credential listener's thread calls :meth:`IdentityDirectory.notified`).
DIRECTORY = IdentityDirectory()

__all__ = ["DIRECTORY", "MAX_ROWS", "MODELS", "IdentityDirectory", "IdentityKind", "StoredIdentity", "read_one"]
