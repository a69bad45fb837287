"""Writing the analysis copy: :func:`update` (the worker, after each refresh)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
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
    HIST_CSV_COLUMNS,
    HIST_PART_SHIFT,
    HIST_PARTS,
    KEEP_UNREFERENCED_S,
    KEY,
    MEASURES,
    REBASE_SHARE,
    Manifest,
    database_identity,
    file_list,
    hist_rows_sql,
    mix_sql,
    read_manifest,
    rollup_marks,
    write_manifest,
)
from iwscope.analysis.rollups import path_window_sums_sql, side_window
from iwscope.db import driver_connection, driver_statement


@dataclass(frozen=True)
class UpdateResult:
    """What one :func:`update` did: ``action`` is one of ``locked`` (another writer),
    ``no-rollups``, ``current``, ``ahead`` (the roll-ups are being rebuilt), ``base`` (a new
    copy), ``delta``."""

    action: str
    rows: int = 0
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
    statement = f"COPY ({driver_statement(query)}) TO STDOUT (FORMAT csv)"
    with driver_connection(session).cursor() as cursor, cursor.copy(statement, params) as copy, target.open("wb") as out:
        for chunk in copy:
            out.write(chunk)


#: The writer's DuckDB memory: sorts and aggregations past it spill to ``directory/.spill``
#: (the chart's worker pods are limited to 1 GiB in all).
WRITER_MEMORY = "512MB"


def _duck(directory: pathlib.Path) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(
        config={
            "memory_limit": WRITER_MEMORY,
            "temp_directory": str(directory / ".spill"),
            "preserve_insertion_order": False,
            "threads": 1,
        }
    )


def _sums() -> str:
    return ", ".join(f"sum({name})::BIGINT AS {name}" for name in MEASURES)


def _csv(path: pathlib.Path, columns: str) -> str:
    return f"read_csv('{path}', header = false, auto_detect = false, columns = {columns})"


def _write(connection: duckdb.DuckDBPyConnection, query: str, target: pathlib.Path, row_group: int = 122_880) -> int:
    """``query``'s rows as the Parquet file ``target`` (written aside, then renamed); its rows."""
    partial = target.with_suffix(".tmp")
    written = connection.execute(
        f"COPY ({query}) TO '{partial}' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE {row_group})"
    ).fetchone()
    os.replace(partial, target)
    return int(written[0]) if written else 0  # DuckDB's COPY answers the rows it wrote


def _base_sql(days_sql: str) -> str:
    """A base's rows from ``days_sql`` (day rows, possibly several per key): day rows summed per
    key, month rows and whole-history rows, sorted by grain and day."""
    keys = ", ".join(KEY[:-1])
    return f"""
        WITH d AS (SELECT {keys}, day, {_sums()} FROM ({days_sql}) GROUP BY ALL)
        SELECT {keys}, day, 0::SMALLINT AS grain, {", ".join(MEASURES)} FROM d
        UNION ALL SELECT {keys}, date_trunc('month', day)::DATE, 1::SMALLINT, {_sums()} FROM d GROUP BY ALL
        UNION ALL SELECT {keys}, DATE '1970-01-01', {GRAIN_ALL}::SMALLINT, {_sums()} FROM d GROUP BY ALL
        ORDER BY grain, day, probe_id, origin_id"""


def _days_sql(days_sql: str) -> str:
    """Day rows (grain 0) summed per key: a merged delta."""
    return (
        f"SELECT {', '.join(KEY)}, 0::SMALLINT AS grain, {_sums()} FROM ({days_sql}) "
        "GROUP BY ALL ORDER BY day, probe_id, origin_id"
    )


#: Histogram files: small row groups, sorted by side and the paths' pseudo-random order, so a
#: percentile interval's subset (the first paths of that order) is read from a few row groups.
_HIST_ROW_GROUP = 16_384


def _hist_sql(rows_sql: str, summed: bool = True) -> str:
    """Histogram rows (side, mix, key, day, bin, sums), sorted; ``summed``: one per key, day and
    bin (rows of one export are already)."""
    if not summed:
        return f"SELECT * FROM ({rows_sql}) ORDER BY side, mix, day"
    return (
        f"SELECT side, mix, campaign_id, probe_id, origin_id, arm_iw, size_bucket, day, bin, "
        f"sum(n_all)::BIGINT AS n_all, sum(n)::BIGINT AS n, sum(sum_us)::BIGINT AS sum_us, "
        f"sum(sumsq)::DOUBLE AS sumsq FROM ({rows_sql}) GROUP BY ALL ORDER BY side, mix, day"
    )


def _hist_from_csv(client_csv: pathlib.Path, server_csv: pathlib.Path) -> str:
    return " UNION ALL ".join(
        f"SELECT {side}::TINYINT AS side, {mix_sql()} AS mix, * FROM {_csv(path, HIST_CSV_COLUMNS)}"
        for side, path in ((0, client_csv), (1, server_csv))
    )


def _export_hists(
    session: Session, bounds: dict[str, Any], window: bool, scratch: pathlib.Path
) -> tuple[pathlib.Path, pathlib.Path]:
    """Both sides' per-path histogram rows as CSV: of the refresh windows ``bounds`` (``window``)
    or of every trial up to their high ends."""
    paths = (scratch.with_suffix(".client.csv"), scratch.with_suffix(".server.csv"))
    for client, path in zip((True, False), paths, strict=True):
        where = side_window(client) if window else ("received_at <= :rhigh" if client else "joined_at <= :jhigh")
        _copy_out(session, hist_rows_sql(client, where), bounds, path)
    return paths


def update(session: Session, directory: pathlib.Path) -> UpdateResult:
    """Bring the copy in ``directory`` up to the roll-ups' watermarks as ``session`` sees them.

    Run it in a REPEATABLE READ transaction (the worker does) so that the watermarks and the
    rows it reads are one snapshot; it writes nothing to the database.  While that transaction
    is open the refreshes' safe bound cannot pass its start (``rollups``): a delta takes a
    fraction of a second, a new copy minutes at a fleet's size (once).  :func:`compact` runs
    after it, outside any transaction."""
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
            if manifest is None:
                manifest, rows = _new_copy(session, directory, connection, identity, marks, scratch)
                return UpdateResult("base", rows, manifest=manifest)
            if (manifest.received_upto, manifest.joined_upto) == marks:
                return UpdateResult("current", manifest=manifest)
            if manifest.received_upto > marks[0] or manifest.joined_upto > marks[1]:
                return UpdateResult("ahead", manifest=manifest)
            sequence = manifest.sequence + 1
            bounds = {"rlow": manifest.received_upto, "rhigh": marks[0], "jlow": manifest.joined_upto, "jhigh": marks[1]}
            _copy_out(session, path_window_sums_sql(MEASURES), bounds, scratch)
            delta, hist_delta = f"delta-{sequence:08d}.parquet", f"histdelta-{sequence:08d}.parquet"
            rows = _write(connection, _days_sql(f"SELECT * FROM {_csv(scratch, CSV_COLUMNS)}"), directory / delta)
            _write(
                connection,
                _hist_sql(_hist_from_csv(*_export_hists(session, bounds, True, scratch)), summed=False),
                directory / hist_delta,
                _HIST_ROW_GROUP,
            )
            manifest = replace(
                manifest,
                received_upto=marks[0],
                joined_upto=marks[1],
                sequence=sequence,
                deltas=(*manifest.deltas, delta),
                hist_deltas=(*manifest.hist_deltas, hist_delta),
            )
            write_manifest(directory, manifest)
            return UpdateResult("delta", rows, manifest=manifest)
        finally:
            connection.close()
            for path in (scratch, scratch.with_suffix(".client.csv"), scratch.with_suffix(".server.csv")):
                path.unlink(missing_ok=True)
            _remove_unreferenced(directory, manifest)


def _write_hist_parts(
    connection: duckdb.DuckDBPyConnection, rows_sql: str, directory: pathlib.Path, sequence: int, summed: bool
) -> tuple[str, ...]:
    """The histogram rows of ``rows_sql`` as ``HIST_PARTS`` files, each sorted: first written as
    they come (streamed), then one part at a time, so no sort holds more than a part."""
    unsorted = directory / f".hist-{sequence:08d}.unsorted.tmp"
    connection.execute(
        f"COPY (SELECT *, (mix >> {HIST_PART_SHIFT})::TINYINT AS part FROM ({rows_sql})) TO '{unsorted}' (FORMAT parquet)"
    )
    names = []
    try:
        for part in range(HIST_PARTS):
            name = f"hist-{sequence:08d}-{part:02d}.parquet"
            _write(
                connection,
                _hist_sql(f"SELECT * EXCLUDE (part) FROM read_parquet('{unsorted}') WHERE part = {part}", summed),
                directory / name,
                _HIST_ROW_GROUP,
            )
            names.append(name)
    finally:
        unsorted.unlink(missing_ok=True)
    return tuple(names)


def _new_copy(
    session: Session,
    directory: pathlib.Path,
    connection: duckdb.DuckDBPyConnection,
    identity: str,
    marks: tuple[Any, Any],
    scratch: pathlib.Path,
) -> tuple[Manifest, int]:
    """A new copy at ``marks``: the roll-ups' day rows, and both sides' histograms of every
    trial up to the marks (one pass over the trials each)."""
    sequence = 1 + max(
        (int(path.stem.split("-")[1]) for path in directory.glob("*-*.parquet") if FILE_NAME.match(path.name)), default=0
    )
    base = f"base-{sequence:08d}.parquet"
    _copy_out(session, BASE_ROWS + " WHERE grain = 0", {}, scratch)
    _write(connection, _base_sql(f"SELECT * FROM {_csv(scratch, CSV_COLUMNS)}"), directory / base)
    rows = connection.execute(f"SELECT count(*) FROM read_parquet('{directory / base}') WHERE grain = 0").fetchone()
    hists = _export_hists(session, {"rhigh": marks[0], "jhigh": marks[1]}, False, scratch)
    hist = _write_hist_parts(connection, _hist_from_csv(*hists), directory, sequence, summed=False)
    manifest = Manifest(identity, marks[0], marks[1], sequence, base, hist)
    write_manifest(directory, manifest)
    return manifest, int(rows[0]) if rows else 0


def compact(directory: pathlib.Path, *, compact_after: int = COMPACT_AFTER, rebase_share: float = REBASE_SHARE) -> str | None:
    """Once the copy has ``compact_after`` deltas, merge them (:func:`_compact`); returns
    ``"deltas"`` (merged into one), ``"base"`` (into new bases) or ``None`` (nothing done, or
    another writer holds the copy)."""
    with _writer_lock(directory) as locked:
        manifest = read_manifest(directory) if locked else None
        if manifest is None or len(manifest.deltas) < compact_after:
            return None
        connection = _duck(directory)
        try:
            manifest, compacted = _compact(directory, connection, manifest, rebase_share)
            write_manifest(directory, manifest)
        finally:
            connection.close()
            _remove_unreferenced(directory, manifest)
        return compacted


def _compact(
    directory: pathlib.Path, connection: duckdb.DuckDBPyConnection, manifest: Manifest, rebase_share: float
) -> tuple[Manifest, str]:
    """Merge the deltas: into one delta (and one histogram delta) while their bytes are below
    ``rebase_share`` of the bases', else into new bases."""
    sequence = manifest.sequence + 1

    def size(names: tuple[str, ...]) -> int:
        return sum((directory / name).stat().st_size for name in names)

    deltas = f"SELECT * EXCLUDE (grain) FROM read_parquet({file_list(directory, manifest.deltas)})"
    hist_deltas = f"SELECT * FROM read_parquet({file_list(directory, manifest.hist_deltas)})"
    if size((*manifest.deltas, *manifest.hist_deltas)) < rebase_share * size((manifest.base, *manifest.hist_base)):
        delta, hist_delta = f"delta-{sequence:08d}.parquet", f"histdelta-{sequence:08d}.parquet"
        _write(connection, _days_sql(deltas), directory / delta)
        _write(connection, _hist_sql(hist_deltas), directory / hist_delta, _HIST_ROW_GROUP)
        return replace(manifest, sequence=sequence, deltas=(delta,), hist_deltas=(hist_delta,)), "deltas"
    base = f"base-{sequence:08d}.parquet"
    _write(
        connection,
        _base_sql(
            f"SELECT * EXCLUDE (grain) FROM read_parquet('{directory / manifest.base}') WHERE grain = 0 UNION ALL {deltas}"
        ),
        directory / base,
    )
    hist = _write_hist_parts(
        connection,
        f"SELECT * FROM read_parquet({file_list(directory, manifest.hist_base)}) UNION ALL {hist_deltas}",
        directory,
        sequence,
        summed=True,
    )
    return replace(manifest, sequence=sequence, base=base, hist_base=hist, deltas=(), hist_deltas=()), "base"


def _remove_unreferenced(directory: pathlib.Path, manifest: Manifest | None) -> None:
    keep = set(manifest.files()) if manifest else set()
    cutoff = time.time() - KEEP_UNREFERENCED_S
    for path in directory.iterdir():
        if (FILE_NAME.match(path.name) or path.suffix == ".tmp") and path.name not in keep:
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
