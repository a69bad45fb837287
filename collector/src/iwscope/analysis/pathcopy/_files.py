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

from iwscope.analysis.rollups import PATH_KEY, WATERMARK_NAME, path_bin_sums_sql

#: 2: with the per-path histograms (``hist``/``histdelta`` files).
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
#: ``grain`` of the base's whole-history rows (0 and 1 are the roll-ups' day and month).
GRAIN_ALL = 2
#: Deltas kept before :func:`update` merges them: into one delta while they are small beside
#: the base (below ``REBASE_SHARE`` of its bytes), else with the base into a new one.
COMPACT_AFTER = 12
REBASE_SHARE = 0.125
#: A reader whose copy is further behind the roll-ups than this reads PostgreSQL instead (the
#: trials in between would cost more than the copy saves: the worker is down or far behind).
MAX_LAG = dt.timedelta(minutes=10)
#: Seconds a file no manifest names any more stays on disk (readers of the older manifest).
KEEP_UNREFERENCED_S = 600.0

MEASURES = ("n_trials", "client_n", "client_sum_us", "server_n", "server_sum_us")
KEY = PATH_KEY
CSV_COLUMNS = (
    "{'campaign_id': 'BIGINT', 'probe_id': 'UUID', 'origin_id': 'UUID', 'arm_iw': 'SMALLINT', "
    "'size_bucket': 'SMALLINT', 'day': 'DATE', " + ", ".join(f"'{name}': 'BIGINT'" for name in MEASURES) + "}"
)
FILE_NAME = re.compile(r"^(base|delta|hist|histdelta)-\d{8}(-\d{2})?\.parquet$")
#: The base's histograms are written in this many files, by the top bits of the paths' order
#: (``mix_sql``): each is sorted on its own, within the writer's memory.
HIST_PARTS = 16
HIST_PART_SHIFT = 60
#: The per-path histogram rows of one side (``hist_rows_sql``), as CSV.
HIST_CSV_COLUMNS = (
    "{'campaign_id': 'BIGINT', 'probe_id': 'UUID', 'origin_id': 'UUID', 'arm_iw': 'SMALLINT', "
    "'size_bucket': 'SMALLINT', 'day': 'DATE', 'bin': 'SMALLINT', 'n_all': 'BIGINT', 'n': 'BIGINT', "
    "'sum_us': 'BIGINT', 'sumsq': 'DOUBLE'}"
)


def hist_rows_sql(client: bool, where: str) -> str:
    """One side's per-path histogram rows of the trials ``where`` selects: (campaign, probe,
    origin, arm, size octave, day, bin -- -1 for trials without a latency --, n_all, n, sum_us,
    sumsq), the roll-ups' own arithmetic (``rollups.path_bin_sums_sql``)."""
    return (
        f"SELECT b.campaign_id, b.probe_id, b.origin_id, b.arm_iw, b.size_bucket, b.day, COALESCE(b.bin, -1), "
        f"b.n_all, b.n, b.sum_us, b.sumsq FROM ({path_bin_sums_sql(client, where)}) AS b"
    )


def mix_sql(table: str = "") -> str:
    """A path's place in the fixed pseudo-random order of the percentile intervals' subsets
    (``frames.PathIds.order_keys``: the XOR of the high 64 bits of its two UUIDs; 64 bits
    because Parquet has no 128-bit integers, DuckDB would store them as doubles), in DuckDB;
    ``table`` qualifies the id columns."""
    qualify = f"{table}." if table else ""
    return (
        f"xor(('0x' || left(replace({qualify}probe_id::VARCHAR, '-', ''), 16))::UBIGINT, "
        f"('0x' || left(replace({qualify}origin_id::VARCHAR, '-', ''), 16))::UBIGINT)"
    )


BASE_ROWS = f"SELECT campaign_id, probe_id, origin_id, arm_iw, size_bucket, day, {', '.join(MEASURES)} FROM analysis_rollups"


@dataclass(frozen=True)
class Manifest:
    """What a copy holds: ``base`` and ``deltas`` (file names in its directory) sum to the trials
    received by ``received_upto`` (client sides) and joined by ``joined_upto`` (server sides);
    ``hist_base`` (one file per part, ``HIST_PARTS``) and ``hist_deltas`` hold the same trials'
    per-path histograms."""

    database: str
    received_upto: dt.datetime
    joined_upto: dt.datetime
    sequence: int
    base: str
    hist_base: tuple[str, ...]
    deltas: tuple[str, ...] = ()
    hist_deltas: tuple[str, ...] = ()
    format: int = FORMAT_VERSION

    def files(self) -> list[str]:
        return [self.base, *self.hist_base, *self.deltas, *self.hist_deltas]


def read_manifest(directory: pathlib.Path) -> Manifest | None:
    """The copy's manifest, or ``None`` (none yet, unreadable, or of another format)."""
    try:
        raw = json.loads((directory / MANIFEST).read_text())
        if raw.get("format") != FORMAT_VERSION:
            return None
        manifest = Manifest(
            database=str(raw["database"]),
            received_upto=dt.datetime.fromisoformat(raw["received_upto"]),
            joined_upto=dt.datetime.fromisoformat(raw["joined_upto"]),
            sequence=int(raw["sequence"]),
            base=str(raw["base"]),
            hist_base=tuple(str(name) for name in raw["hist_base"]),
            deltas=tuple(str(name) for name in raw["deltas"]),
            hist_deltas=tuple(str(name) for name in raw["hist_deltas"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if len(manifest.hist_base) != HIST_PARTS or not all(FILE_NAME.match(name) for name in manifest.files()):
        return None
    return manifest


def write_manifest(directory: pathlib.Path, manifest: Manifest) -> None:
    values = asdict(manifest)
    values.update(
        received_upto=manifest.received_upto.isoformat(),
        joined_upto=manifest.joined_upto.isoformat(),
        deltas=list(manifest.deltas),
        hist_deltas=list(manifest.hist_deltas),
        hist_base=list(manifest.hist_base),
    )
    partial = directory / f".{MANIFEST}.tmp"
    partial.write_text(json.dumps(values, indent=1))
    os.replace(partial, directory / MANIFEST)


def database_identity(session: Session) -> str:
    """Names the database a copy belongs to: a dropped and re-created database of the same
    name gets a new oid, so a copy never outlives its database."""
    row = session.execute(
        text("""SELECT current_database(), d.oid, inet_server_addr(), inet_server_port()
                                   FROM pg_database AS d WHERE d.datname = current_database()""")
    ).one()
    return f"{row[0]}/{row[1]}@{row[2]}:{row[3]}"


def rollup_marks(session: Session) -> tuple[dt.datetime, dt.datetime] | None:
    row = session.execute(
        text("SELECT received_upto, joined_upto FROM analysis_watermarks WHERE name = :name"), {"name": WATERMARK_NAME}
    ).one_or_none()
    return None if row is None else (row[0], row[1])


def file_list(directory: pathlib.Path, names: tuple[str, ...] | list[str]) -> str:
    """DuckDB's list literal of these files of ``directory``."""
    return "[" + ", ".join(f"'{directory / name}'" for name in names) + "]"
