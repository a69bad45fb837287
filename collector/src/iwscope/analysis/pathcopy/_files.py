"""The analysis copy's files: names, the manifest, and which database a copy belongs to."""

from __future__ import annotations

import datetime as dt
import json
import os
import pathlib
import re
from dataclasses import asdict, dataclass

from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.analysis.rollups import WATERMARK_NAME

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
#: ``grain`` of the base's whole-history rows (0 and 1 are the roll-ups' day and month).
GRAIN_ALL = 2
#: Deltas kept before :func:`update` folds them into a new base.
COMPACT_AFTER = 12
#: A reader whose copy is further behind the roll-ups than this reads PostgreSQL instead (the
#: trials in between would cost more than the copy saves: the worker is down or far behind).
MAX_LAG = dt.timedelta(minutes=10)
#: Seconds a file no manifest names any more stays on disk (readers of the older manifest).
KEEP_UNREFERENCED_S = 600.0

MEASURES = ("n_trials", "client_n", "client_sum_us", "server_n", "server_sum_us")
KEY = ("campaign_id", "probe_id", "origin_id", "arm_iw", "size_bucket", "day")
CSV_COLUMNS = ("{'campaign_id': 'BIGINT', 'probe_id': 'UUID', 'origin_id': 'UUID', 'arm_iw': 'SMALLINT', "
               "'size_bucket': 'SMALLINT', 'day': 'DATE', "
               + ", ".join(f"'{name}': 'BIGINT'" for name in MEASURES) + "}")
FILE_NAME = re.compile(r"^(base|delta)-\d{8}\.parquet$")
BASE_ROWS = f"SELECT campaign_id, probe_id, origin_id, arm_iw, size_bucket, day, {', '.join(MEASURES)} FROM analysis_rollups"


@dataclass(frozen=True)
class Manifest:
    """What a copy holds: ``base`` and ``deltas`` (file names in its directory) sum to the trials
    received by ``received_upto`` (client sides) and joined by ``joined_upto`` (server sides)."""

    database: str
    received_upto: dt.datetime
    joined_upto: dt.datetime
    sequence: int
    base: str
    deltas: tuple[str, ...] = ()
    format: int = FORMAT_VERSION

    def files(self) -> list[str]:
        return [self.base, *self.deltas]


def read_manifest(directory: pathlib.Path) -> Manifest | None:
    """The copy's manifest, or ``None`` (none yet, unreadable, or of another format)."""
    try:
        raw = json.loads((directory / MANIFEST).read_text())
        if raw.get("format") != FORMAT_VERSION:
            return None
        manifest = Manifest(database=str(raw["database"]), received_upto=dt.datetime.fromisoformat(raw["received_upto"]),
                            joined_upto=dt.datetime.fromisoformat(raw["joined_upto"]), sequence=int(raw["sequence"]),
                            base=str(raw["base"]), deltas=tuple(str(name) for name in raw["deltas"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not all(FILE_NAME.match(name) for name in manifest.files()):
        return None
    return manifest


def write_manifest(directory: pathlib.Path, manifest: Manifest) -> None:
    values = asdict(manifest)
    values.update(received_upto=manifest.received_upto.isoformat(), joined_upto=manifest.joined_upto.isoformat(),
                  deltas=list(manifest.deltas))
    partial = directory / f".{MANIFEST}.tmp"
    partial.write_text(json.dumps(values, indent=1))
    os.replace(partial, directory / MANIFEST)


def database_identity(session: Session) -> str:
    """Names the database a copy belongs to: a dropped and re-created database of the same
    name gets a new oid, so a copy never outlives its database."""
    row = session.execute(text("""SELECT current_database(), d.oid, inet_server_addr(), inet_server_port()
                                   FROM pg_database AS d WHERE d.datname = current_database()""")).one()
    return f"{row[0]}/{row[1]}@{row[2]}:{row[3]}"


def rollup_marks(session: Session) -> tuple[dt.datetime, dt.datetime] | None:
    row = session.execute(text("SELECT received_upto, joined_upto FROM analysis_watermarks WHERE name = :name"),
                          {"name": WATERMARK_NAME}).one_or_none()
    return None if row is None else (row[0], row[1])


def file_list(directory: pathlib.Path, names: tuple[str, ...] | list[str]) -> str:
    """DuckDB's list literal of these files of ``directory``."""
    return "[" + ", ".join(f"'{directory / name}'" for name in names) + "]"
