"""What the agents measured, independently of what the collector says it stored.

The probe's spool deletes a record once the collector acknowledged it, so after a campaign
the spool no longer says what was measured.  Before an agent starts, :func:`install_journal`
creates its spool database (the agent's own schema, ``CREATE ... IF NOT EXISTS``) and adds a
``fault_journal`` table filled by a trigger on every insert into ``records``: the entry is
written in the same SQLite transaction as the record, so it survives SIGKILL exactly when
the record does, and it is never deleted.  The table has no unique key, so a record stored
twice by an agent would show up twice.
"""

from __future__ import annotations

import pathlib
import sqlite3
from collections import Counter

from iwprobe._spool import Spool

PROBE_SPOOL = "probe-spool.sqlite"
ORIGIN_SPOOL = "origin-spool.sqlite"

_JOURNAL = """
CREATE TABLE IF NOT EXISTS fault_journal (record_id TEXT NOT NULL, kind TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TRIGGER IF NOT EXISTS fault_journal_insert AFTER INSERT ON records
BEGIN
    INSERT INTO fault_journal (record_id, kind, created_at) VALUES (NEW.record_id, NEW.kind, NEW.created_at);
END;
"""


def install_journal(spool_path: pathlib.Path) -> None:
    """Create the agent's spool at ``spool_path`` with the journal table and trigger."""
    spool = Spool(str(spool_path))
    spool.close()
    with sqlite3.connect(spool_path) as db:
        db.executescript(_JOURNAL)
    db.close()


def journal(spool_path: pathlib.Path, kind: str) -> Counter[str]:
    """record_id -> how many times the agent stored it (read-only; the agent may be writing)."""
    if not spool_path.exists():
        return Counter()
    db = sqlite3.connect(f"file:{spool_path}?mode=ro", uri=True, timeout=30)
    try:
        rows = db.execute("SELECT record_id FROM fault_journal WHERE kind = ?", (kind,)).fetchall()
    finally:
        db.close()
    return Counter(row[0] for row in rows)
