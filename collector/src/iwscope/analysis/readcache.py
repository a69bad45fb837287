"""The process's copy of recent roll-up reads, valid until the roll-ups change.

A dashboard page draws several figures from one filter set (Figure 5: a comparison per
dimension, the percentile tables, the headline), and each figure starts with the same reads
(:func:`iwscope.analysis.reads.read`): the bucket roll-ups of the filters and the per-path sums.
Those change only when a refresh folds trials in, so a read is kept here under the **version**
of the roll-ups it was read at and answered again until they change:

* The version is the ``analysis_watermarks`` row's ``xmin`` (the transaction that last wrote
  it: every refresh, reset and rebuild does, in the same transaction as the roll-ups it
  changed) with its watermarks, the database's identity and the paths' signatures (a path
  estimate may move a path to another bucket between refreshes; the analysis copy's reader
  checks them the same way), read in one statement before the read it keys.  A refresh that
  commits between the two makes the kept read newer than its key, never older, and later
  readers see the new version.
* A transaction that has written anything (``pg_current_xact_id_if_assigned()`` not null: it
  may have changed roll-ups it has not committed, e.g. a test's refresh) neither reads nor
  fills the copy.
* What is kept is never changed by its readers: its arrays are made read-only, and each reader
  gets a shallow copy of the frame (its own attributes to rebind).

At most ``IWSCOPE_ANALYSIS_READ_CACHE_MB`` of arrays per process, least recently used first
out; 0 turns it off.  ``iwscope_analysis_read_cache_total{result}`` counts hits and misses.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple, TypeVar

import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.analysis import signatures
from iwscope.analysis.rollups import WATERMARK_NAME
from iwscope.config import get_settings
from iwscope.metrics import ANALYSIS_READ_CACHE

_T = TypeVar("_T")

#: One statement: whether this transaction has written anything, the watermark row's writer
#: and marks, the database, and the paths' signatures (``signatures.VERSION_SQL``).
_VERSION = text(f"""
    SELECT pg_current_xact_id_if_assigned() IS NULL, w.xmin::text, w.received_upto, w.joined_upto,
           current_database(), d.oid, inet_server_addr(), inet_server_port(), p.*
    FROM analysis_watermarks AS w JOIN pg_database AS d ON d.datname = current_database()
    CROSS JOIN ({signatures.VERSION_SQL}) AS p
    WHERE w.name = :name""")
_ROLLUP_FIELDS = 7


class Version(NamedTuple):
    """The roll-ups' version a read is kept under; ``signatures`` is ``signatures.VERSION_SQL``'s
    row, which the analysis copy's reader uses as is (no second statement)."""

    rollups: tuple[Any, ...]
    signatures: tuple[Any, ...]


def rollups_version(session: Session) -> Version | None:
    """The roll-ups' version as ``session`` sees them, or ``None``: do not use the copy (it is
    off, the roll-ups were never refreshed, or this transaction has written)."""
    if _budget_bytes() <= 0:
        return None
    row = session.execute(_VERSION, {"name": WATERMARK_NAME}).one_or_none()
    if row is None or not row[0]:
        return None
    return Version(tuple(row[1 : 1 + _ROLLUP_FIELDS]), tuple(row[1 + _ROLLUP_FIELDS :]))


def _budget_bytes() -> int:
    return int(get_settings().analysis_read_cache_mb * 2**20)


def _arrays(value: object) -> list[np.ndarray[Any, Any]]:
    if not dataclasses.is_dataclass(value):
        return []
    found = []
    for field in dataclasses.fields(value):
        item = getattr(value, field.name)
        if isinstance(item, np.ndarray):
            found.append(item)
    return found


def _size(value: object) -> int:
    total = sum(array.nbytes for array in _arrays(value))
    blob = getattr(value, "blob", b"")
    return total + (len(blob) if isinstance(blob, bytes) else 0) + 1024


class ReadCache:
    """Least recently used reads by (version, key), within a byte budget; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[Version, Hashable], tuple[int, Any]] = OrderedDict()
        self._bytes = 0

    def get(self, version: Version | None, key: Hashable) -> Any | None:
        """A reader's own shallow copy of the kept read, or ``None``."""
        if version is None:
            return None
        with self._lock:
            entry = self._entries.get((version, key))
            if entry is not None:
                self._entries.move_to_end((version, key))
        ANALYSIS_READ_CACHE.labels("miss" if entry is None else "hit").inc()
        return None if entry is None else copy.copy(entry[1])

    def put(self, version: Version | None, key: Hashable, value: _T) -> _T:
        """Keep ``value`` (its arrays made read-only); returns the caller's shallow copy of it."""
        if version is None:
            return value
        for array in _arrays(value):
            array.flags.writeable = False
        size, budget = _size(value), _budget_bytes()
        if size > budget:
            return value
        with self._lock:
            old = self._entries.pop((version, key), None)
            if old is not None:
                self._bytes -= old[0]
            self._entries[(version, key)] = (size, value)
            self._bytes += size
            while self._bytes > budget and self._entries:
                _, (dropped, _) = self._entries.popitem(last=False)
                self._bytes -= dropped
        return copy.copy(value)

    def get_or_read(self, version: Version | None, key: Hashable, read: Callable[[], _T]) -> _T:
        found = self.get(version, key)
        if found is not None:
            return found  # type: ignore[no-any-return]
        return self.put(version, key, read())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    @property
    def bytes(self) -> int:
        return self._bytes


#: The process's one copy.
READS = ReadCache()
