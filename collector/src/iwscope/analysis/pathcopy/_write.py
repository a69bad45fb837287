"""Writing the analysis copy: :func:`update` (the worker, after each refresh)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import duckdb
from sqlalchemy.orm import Session

from iwscope.analysis.pathcopy._files import (
    BASE_ROWS,
    COMPACT_AFTER,
    CSV_COLUMNS,
    FILE_NAME,
    GRAIN_ALL,
    KEEP_UNREFERENCED_S,
    KEY,
    MEASURES,
    Manifest,
    database_identity,
    file_list,
    read_manifest,
    rollup_marks,
    write_manifest,
)
from iwscope.analysis.rollups import path_window_sums_sql


@dataclass(frozen=True)
class UpdateResult:
    """What one :func:`update` did: ``action`` is one of ``locked`` (another writer),
    ``no-rollups``, ``current``, ``ahead`` (the roll-ups are being rebuilt), ``base`` (built
    from the roll-ups), ``delta``; ``compacted`` when the deltas were folded into a new base."""

    action: str
    rows: int = 0
    compacted: bool = False
    manifest: Manifest | None = None


@contextlib.contextmanager
def _writer_lock(directory: pathlib.Path) -> Iterator[bool]:
    with open(directory / ".lock", "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _copy_out(session: Session, query: str, params: dict[str, Any], target: pathlib.Path) -> None:
    """``query`` (SQLAlchemy ``:name`` parameters) as CSV in ``target``, streamed by COPY."""
    statement = re.sub(r"(?<![:\w]):(\w+)\b", r"%(\1)s", query)
    connection = session.connection().connection.driver_connection
    assert connection is not None  # a live session's DBAPI connection
    with connection.cursor() as cursor, cursor.copy(f"COPY ({statement}) TO STDOUT (FORMAT csv)", params) as copy, \
            target.open("wb") as out:
        for chunk in copy:
            out.write(chunk)


def _duck(directory: pathlib.Path) -> duckdb.DuckDBPyConnection:
    connection = duckdb.connect(config={"memory_limit": "1GB", "temp_directory": str(directory / ".spill")})
    return connection


def _sums(prefix: str = "") -> str:
    return ", ".join(f"sum({prefix}{name})::BIGINT AS {name}" for name in MEASURES)


def _write_base(connection: duckdb.DuckDBPyConnection, days_sql: str, target: pathlib.Path) -> None:
    """A base file from ``days_sql`` (day rows, possibly several per key): day rows summed per
    key, month rows and whole-history rows, sorted by grain and day."""
    keys = ", ".join(KEY[:-1])
    measures = ", ".join(MEASURES)
    partial = target.with_suffix(".tmp")
    connection.execute(f"""
        COPY (
            WITH d AS (SELECT {keys}, day, {_sums()} FROM ({days_sql}) GROUP BY ALL)
            SELECT {keys}, day, 0::SMALLINT AS grain, {measures} FROM d
            UNION ALL SELECT {keys}, date_trunc('month', day)::DATE, 1::SMALLINT, {_sums()} FROM d GROUP BY ALL
            UNION ALL SELECT {keys}, DATE '1970-01-01', {GRAIN_ALL}::SMALLINT, {_sums()} FROM d GROUP BY ALL
            ORDER BY grain, day, probe_id, origin_id
        ) TO '{partial}' (FORMAT parquet, COMPRESSION zstd)""")
    os.replace(partial, target)


def _write_delta(connection: duckdb.DuckDBPyConnection, csv_path: pathlib.Path, target: pathlib.Path) -> int:
    partial = target.with_suffix(".tmp")
    connection.execute(f"""
        COPY (SELECT {", ".join(KEY)}, 0::SMALLINT AS grain, {", ".join(MEASURES)}
              FROM read_csv('{csv_path}', header = false, auto_detect = false, columns = {CSV_COLUMNS})
              ORDER BY day, probe_id, origin_id) TO '{partial}' (FORMAT parquet, COMPRESSION zstd)""")
    rows = int(connection.execute(f"SELECT count(*) FROM read_parquet('{partial}')").fetchone()[0])  # type: ignore[index]
    os.replace(partial, target)
    return rows


def update(session: Session, directory: pathlib.Path, *, compact_after: int = COMPACT_AFTER) -> UpdateResult:
    """Bring the copy in ``directory`` up to the roll-ups' watermarks as ``session`` sees them.

    Run it in a REPEATABLE READ transaction (the worker does) so that the watermarks and the
    rows it reads are one snapshot; it writes nothing to the database."""
    directory.mkdir(parents=True, exist_ok=True)
    with _writer_lock(directory) as locked:
        if not locked:
            return UpdateResult("locked")
        marks = rollup_marks(session)
        if marks is None:
            return UpdateResult("no-rollups")
        identity = database_identity(session)
        manifest = read_manifest(directory)
        if manifest is not None and manifest.database != identity:
            manifest = None
        scratch = directory / ".export.csv"
        connection = _duck(directory)
        try:
            if manifest is None:  # a new copy: the roll-ups' day rows at the watermarks
                sequence = 1 + max((int(path.stem.split("-")[1]) for path in directory.glob("*-*.parquet")
                                    if FILE_NAME.match(path.name)), default=0)
                _copy_out(session, BASE_ROWS + " WHERE grain = 0", {}, scratch)
                base = f"base-{sequence:08d}.parquet"
                _write_base(connection, f"SELECT * FROM read_csv('{scratch}', header = false, auto_detect = false, "
                                        f"columns = {CSV_COLUMNS})", directory / base)
                manifest = Manifest(identity, marks[0], marks[1], sequence, base)
                rows = int(connection.execute(
                    f"SELECT count(*) FROM read_parquet('{directory / base}') WHERE grain = 0").fetchone()[0])  # type: ignore[index]
                write_manifest(directory, manifest)
                return UpdateResult("base", rows, manifest=manifest)
            if (manifest.received_upto, manifest.joined_upto) == marks:
                return UpdateResult("current", manifest=manifest)
            if manifest.received_upto > marks[0] or manifest.joined_upto > marks[1]:
                return UpdateResult("ahead", manifest=manifest)
            sequence = manifest.sequence + 1
            delta = f"delta-{sequence:08d}.parquet"
            _copy_out(session, path_window_sums_sql(MEASURES),
                      {"rlow": manifest.received_upto, "rhigh": marks[0],
                       "jlow": manifest.joined_upto, "jhigh": marks[1]}, scratch)
            rows = _write_delta(connection, scratch, directory / delta)
            manifest = replace(manifest, received_upto=marks[0], joined_upto=marks[1], sequence=sequence,
                               deltas=(*manifest.deltas, delta))
            compacted = len(manifest.deltas) >= compact_after
            if compacted:
                base = f"base-{sequence + 1:08d}.parquet"
                _write_base(connection, f"""
                    SELECT * EXCLUDE (grain) FROM read_parquet('{directory / manifest.base}') WHERE grain = 0
                    UNION ALL SELECT * EXCLUDE (grain) FROM read_parquet({file_list(directory, manifest.deltas)})""",
                            directory / base)
                manifest = replace(manifest, sequence=sequence + 1, base=base, deltas=())
            write_manifest(directory, manifest)
            return UpdateResult("delta", rows, compacted, manifest)
        finally:
            connection.close()
            scratch.unlink(missing_ok=True)
            _remove_unreferenced(directory, manifest)


def _remove_unreferenced(directory: pathlib.Path, manifest: Manifest | None) -> None:
    keep = set(manifest.files()) if manifest else set()
    cutoff = time.time() - KEEP_UNREFERENCED_S
    for path in directory.iterdir():
        if (FILE_NAME.match(path.name) or path.suffix == ".tmp") and path.name not in keep:
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
