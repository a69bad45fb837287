"""The on-disk journal of measured records (stdlib ``sqlite3``, WAL, ``synchronous=FULL``).

Every record is committed here before any upload is attempted, and deleted only after the
collector acknowledged the batch that carried it.  A process killed with SIGKILL loses at
most the trial it was measuring; on restart the remaining records are uploaded again (the
collector is idempotent by record UUID, and acknowledged records are gone from the spool,
so nothing is sent twice once acknowledged).

The spool also remembers the progress of campaign rounds (the plan of a round and how many
of its trials are done), committed in the same transaction as each trial, so a restart
resumes a round instead of measuring it again.

Disk use is bounded: when the database reaches ``max_bytes``, :meth:`Spool.add` raises
:class:`SpoolFull` (and logs a warning) instead of growing; the agent then pauses
measuring until uploads make room.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from typing import Any, Optional

log = logging.getLogger("iwprobe.spool")

#: Record kinds the spool holds.
KINDS = ("trial", "path_sample", "census", "observation", "aggregate", "passive_connection", "trace")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    record_id TEXT NOT NULL UNIQUE,
    body TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS rejected (
    seq INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    record_id TEXT NOT NULL,
    body TEXT NOT NULL,
    reason TEXT NOT NULL,
    rejected_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS rounds (
    campaign_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    plan TEXT NOT NULL,
    next_index INTEGER NOT NULL DEFAULT 0,
    started_at REAL NOT NULL,
    finished_at REAL,
    PRIMARY KEY (campaign_id, round)
);
CREATE TABLE IF NOT EXISTS calibrations (
    campaign_id INTEGER NOT NULL,
    origin_id TEXT NOT NULL,
    measured_at REAL NOT NULL,
    PRIMARY KEY (campaign_id, origin_id)
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""


class SpoolFull(Exception):
    """The spool reached its disk bound; the record was not stored."""


class Spool:
    """A thread-safe sqlite journal at ``path`` bounded to ``max_bytes`` on disk."""

    def __init__(self, path: str, max_bytes: int = 512 * 1024 * 1024) -> None:
        self.path = path
        self.max_bytes = max_bytes
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._full_warned = False

    # ---------------------------------------------------------------- records
    def add(self, kind: str, record_id: str, record: dict[str, Any], round_key: Optional[tuple[int, int, int]] = None) -> None:
        """Store one record durably.  With ``round_key=(campaign, round, next_index)`` the
        round's progress is advanced in the same transaction."""
        if kind not in KINDS:
            raise ValueError(f"unknown record kind {kind!r}")
        body = json.dumps(record, separators=(",", ":"))
        with self._lock:
            if self._size_locked() + len(body) > self.max_bytes:
                if not self._full_warned:
                    log.warning(
                        "SPOOL FULL: %s holds %d bytes (bound %d); not storing new records until the collector accepts uploads",
                        self.path,
                        self._size_locked(),
                        self.max_bytes,
                    )
                    self._full_warned = True
                raise SpoolFull(f"spool {self.path} reached its bound of {self.max_bytes} bytes")
            self._full_warned = False
            with self._transaction():
                self._db.execute(
                    "INSERT OR IGNORE INTO records (kind, record_id, body, created_at) VALUES (?, ?, ?, ?)",
                    (kind, record_id, body, time.time()),
                )
                self._bump_locked(f"stored_{kind}", 1)
                if round_key is not None:
                    campaign_id, round_number, next_index = round_key
                    self._db.execute(
                        "UPDATE rounds SET next_index = ? WHERE campaign_id = ? AND round = ?",
                        (next_index, campaign_id, round_number),
                    )

    def pending(self, kinds: Sequence[str], limit: int, max_body_bytes: int) -> list[tuple[int, str, dict[str, Any]]]:
        """Oldest unacknowledged records of ``kinds``: (seq, kind, record), bounded in count and bytes."""
        marks = ",".join("?" for _ in kinds)
        with self._lock:
            rows = self._db.execute(
                f"SELECT seq, kind, body FROM records WHERE kind IN ({marks}) ORDER BY seq LIMIT ?", (*kinds, limit)
            ).fetchall()
        chosen: list[tuple[int, str, dict[str, Any]]] = []
        total = 0
        for seq, kind, body in rows:
            if chosen and total + len(body) > max_body_bytes:
                break
            total += len(body)
            chosen.append((seq, kind, json.loads(body)))
        return chosen

    def acknowledge(self, seqs: Sequence[int]) -> None:
        """The collector stored (or already had) these records: remove them."""
        with self._lock, self._transaction():
            self._db.executemany("DELETE FROM records WHERE seq = ?", [(seq,) for seq in seqs])
            self._bump_locked("acknowledged", len(seqs))

    def reject(self, seq: int, reason: str) -> None:
        """Move a record the collector refuses (422) aside, kept on disk for inspection."""
        with self._lock, self._transaction():
            self._db.execute(
                "INSERT OR REPLACE INTO rejected (seq, kind, record_id, body, reason, rejected_at) "
                "SELECT seq, kind, record_id, body, ?, ? FROM records WHERE seq = ?",
                (reason[:2000], time.time(), seq),
            )
            self._db.execute("DELETE FROM records WHERE seq = ?", (seq,))
        log.error("collector rejected spooled record %d, kept in table 'rejected': %s", seq, reason[:300])

    def backlog(self, kinds: Sequence[str] = KINDS) -> int:
        marks = ",".join("?" for _ in kinds)
        with self._lock:
            return int(self._db.execute(f"SELECT count(*) FROM records WHERE kind IN ({marks})", tuple(kinds)).fetchone()[0])

    def rejected_count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM rejected").fetchone()[0])

    def disk_bytes(self) -> int:
        """Bytes the spool files (database and WAL) take on disk."""
        with self._lock:
            return self._file_bytes_locked()

    def counter(self, name: str) -> int:
        with self._lock:
            row = self._db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
            return int(row[0]) if row else 0

    # ----------------------------------------------------------------- rounds
    def round_state(self, campaign_id: int) -> dict[int, tuple[list[Any], int, Optional[float], float]]:
        """round -> (plan, next_index, finished_at, started_at) for one campaign."""
        with self._lock:
            rows = self._db.execute(
                "SELECT round, plan, next_index, finished_at, started_at FROM rounds WHERE campaign_id = ?", (campaign_id,)
            ).fetchall()
        return {r: (json.loads(plan), nxt, fin, started) for r, plan, nxt, fin, started in rows}

    def start_round(self, campaign_id: int, round_number: int, plan: list[Any]) -> None:
        with self._lock, self._transaction():
            self._db.execute(
                "INSERT OR IGNORE INTO rounds (campaign_id, round, plan, next_index, started_at) VALUES (?, ?, ?, 0, ?)",
                (campaign_id, round_number, json.dumps(plan), time.time()),
            )

    def finish_round(self, campaign_id: int, round_number: int) -> None:
        with self._lock, self._transaction():
            self._db.execute(
                "UPDATE rounds SET finished_at = ? WHERE campaign_id = ? AND round = ?", (time.time(), campaign_id, round_number)
            )

    def calibrated(self, campaign_id: int, origin_id: str) -> bool:
        with self._lock:
            return (
                self._db.execute(
                    "SELECT 1 FROM calibrations WHERE campaign_id = ? AND origin_id = ?", (campaign_id, origin_id)
                ).fetchone()
                is not None
            )

    def add_calibration(self, campaign_id: int, origin_id: str, sample_id: str, sample: dict[str, Any]) -> None:
        """Store a path sample and mark the (campaign, origin) calibrated, atomically."""
        body = json.dumps(sample, separators=(",", ":"))
        with self._lock, self._transaction():
            self._db.execute(
                "INSERT OR IGNORE INTO records (kind, record_id, body, created_at) VALUES ('path_sample', ?, ?, ?)",
                (sample_id, body, time.time()),
            )
            self._db.execute("INSERT OR REPLACE INTO calibrations VALUES (?, ?, ?)", (campaign_id, origin_id, time.time()))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---------------------------------------------------------------- helpers
    def _size_locked(self) -> int:
        """Bytes of live pages (freed pages are reused by sqlite, so they do not count)."""
        page_count = self._db.execute("PRAGMA page_count").fetchone()[0]
        free_pages = self._db.execute("PRAGMA freelist_count").fetchone()[0]
        page_size = self._db.execute("PRAGMA page_size").fetchone()[0]
        return int((page_count - free_pages) * page_size)

    def _file_bytes_locked(self) -> int:
        total = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                total += os.path.getsize(self.path + suffix)
        return total

    def _bump_locked(self, name: str, amount: int) -> None:
        self._db.execute(
            "INSERT INTO counters (name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
            (name, amount),
        )

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
