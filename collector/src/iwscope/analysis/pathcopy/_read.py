"""Reading the analysis copy: the paired figures' per-path sums, the intervals' per-path
histograms and the fleet table's totals."""

from __future__ import annotations

import datetime as dt
import logging
import pathlib
import tempfile
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.analysis import buckets as bk
from iwscope.analysis import signatures
from iwscope.analysis._types import FloatArray, IntArray
from iwscope.analysis.filters import Filters
from iwscope.analysis.frames import WEEK_DAYS, DayWindow, Frame, PathFrame, PathIds, day_window, detail_frame
from iwscope.analysis.pathcopy._files import (
    GRAIN_ALL,
    HIST_PART_SHIFT,
    MAX_LAG,
    MEASURES,
    Manifest,
    database_identity,
    file_list,
    hist_rows_sql,
    mix_sql,
    read_manifest,
    rollup_marks,
)
from iwscope.analysis.rollups import path_window_sums_sql, side_window

log = logging.getLogger("iwscope.analysis.pathcopy")

_connection_lock = threading.Lock()
_connection: duckdb.DuckDBPyConnection | None = None
#: Each API and dashboard process has its own DuckDB: a reader's queries hold little (a few
#: hundred thousand rows at a fleet's size), and DuckDB's default would be 80 % of the RAM.
#: Past it DuckDB spills to the temporary directory (``/tmp``, an ``emptyDir`` in the chart's
#: read-only pods), not to ``.tmp`` in the working directory as it would by default.
READER_MEMORY = "256MB"


def _reader() -> duckdb.DuckDBPyConnection:
    """A cursor of the process's in-memory DuckDB (cursors may be used from several threads)."""
    global _connection
    with _connection_lock:
        if _connection is None:
            _connection = duckdb.connect(
                config={
                    "memory_limit": READER_MEMORY,
                    "temp_directory": str(pathlib.Path(tempfile.gettempdir()) / "iwscope-duckdb"),
                }
            )
        return _connection.cursor()


#: Column kinds of rows handed to DuckDB: numbers, ids and days as text (cast in SQL).
_INT, _FLOAT, _TEXT, _DAY = "int", "float", "text", "day"
_KEY_KINDS = (
    ("campaign_id", _INT),
    ("probe_id", _TEXT),
    ("origin_id", _TEXT),
    ("arm_iw", _INT),
    ("size_bucket", _INT),
    ("day", _DAY),
)


def _as_columns(rows: Sequence[Any], kinds: Sequence[tuple[str, str]]) -> dict[str, Any]:
    columns: dict[str, Any] = {}
    for offset, (name, kind) in enumerate(kinds):
        if kind == _INT:
            columns[name] = np.fromiter((row[offset] for row in rows), dtype=np.int64, count=len(rows))
        elif kind == _FLOAT:
            columns[name] = np.fromiter((row[offset] for row in rows), dtype=np.float64, count=len(rows))
        else:
            columns[name] = np.array(
                [row[offset].isoformat() if kind == _DAY else str(row[offset]) for row in rows], dtype=object
            )
    return columns


def _window_bounds(opened: _Open) -> dict[str, dt.datetime]:
    return {
        "rlow": opened.manifest.received_upto,
        "rhigh": opened.marks[0],
        "jlow": opened.manifest.joined_upto,
        "jhigh": opened.marks[1],
    }


def _lag_sums(session: Session, opened: _Open) -> dict[str, Any]:
    """The day rows of the trials between the copy's watermarks and the roll-ups', as columns."""
    rows = session.execute(text(path_window_sums_sql(MEASURES)), _window_bounds(opened)).all()
    return _as_columns(rows, (*_KEY_KINDS, *((name, _INT) for name in MEASURES)))


def _lag_hists(session: Session, opened: _Open, client: bool) -> dict[str, Any]:
    """One side's histogram rows of the trials between the copy's watermarks and the roll-ups'."""
    rows = session.execute(text(hist_rows_sql(client, side_window(client))), _window_bounds(opened)).all()
    return _as_columns(rows, (*_KEY_KINDS, ("bin", _INT), ("n_all", _INT), ("n", _INT), ("sum_us", _INT), ("sumsq", _FLOAT)))


@dataclass(frozen=True)
class _Open:
    """A usable copy as one reader sees it: its manifest, and whether the roll-ups' watermarks
    (``marks``, same transaction as the reader's other reads) are past it."""

    directory: pathlib.Path
    manifest: Manifest
    marks: tuple[dt.datetime, dt.datetime]

    @property
    def behind(self) -> bool:
        return (self.manifest.received_upto, self.manifest.joined_upto) != self.marks

    @property
    def base(self) -> str:
        return f"read_parquet('{self.directory / self.manifest.base}')"

    def day_sources(self) -> list[str]:
        """The day rows after the base: the deltas' and, when behind, the registered ``lag``."""
        sources = [f"read_parquet({file_list(self.directory, self.manifest.deltas)})"] if self.manifest.deltas else []
        if self.behind:
            sources.append(
                "(SELECT * REPLACE (probe_id::UUID AS probe_id, origin_id::UUID AS origin_id, day::DATE AS day) FROM lag)"
            )
        return sources


def _open(session: Session, directory: pathlib.Path) -> _Open | None:
    """The copy in ``directory`` if a reader may use it now (see the module), else ``None``."""
    manifest = read_manifest(directory)
    if manifest is None:
        return None
    marks = rollup_marks(session)
    if marks is None or manifest.database != database_identity(session):
        return None
    if manifest.received_upto > marks[0] or manifest.joined_upto > marks[1]:
        return None
    if marks[0] - manifest.received_upto > MAX_LAG or marks[1] - manifest.joined_upto > MAX_LAG:
        return None
    return _Open(directory, manifest, marks)


def _execute(opened: _Open, sql: str, registered: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The columns of ``sql``, run on a DuckDB cursor with ``registered``'s columns as tables
    (the lag rows as ``lag`` when the copy is behind, the wanted paths); ``None`` when a file
    cannot be read (removed under a very slow reader, damaged): the caller reads PostgreSQL.
    DuckDB alone: it may run in another thread than the session's."""
    cursor = _reader()
    try:
        for name, columns in registered.items():
            cursor.register(name, columns)
        found: dict[str, Any] = cursor.execute(sql).fetchnumpy()
        return found
    except duckdb.Error as error:
        log.warning("analysis copy in %s unreadable, reading PostgreSQL: %s", opened.directory, error)
        return None
    finally:
        cursor.close()


def _key_conditions(filters: Filters) -> list[str]:
    """The filters' campaigns and size octaves on the copy's key columns (the roll-ups' rule:
    an octave is in when it overlaps the size range)."""
    conditions = []
    if filters.campaign_ids:
        conditions.append(f"campaign_id IN ({', '.join(str(int(c)) for c in filters.campaign_ids)})")
    if filters.size_min is not None or filters.size_max is not None:
        first, last = bk.size_buckets_overlapping(filters.size_min, filters.size_max)
        conditions.append(f"size_bucket BETWEEN {int(first)} AND {int(last)}")
    return conditions


def _selection(opened: _Open, window: DayWindow | None) -> str:
    """The rows that sum to the filters' time range: the base's whole-history rows, or its month
    and edge-day rows; the days in range of the rows after the base."""
    columns = f"campaign_id, probe_id, origin_id, arm_iw, size_bucket, {', '.join(MEASURES)}"
    if window is None:
        base_where, day_where = f"grain = {GRAIN_ALL}", "TRUE"
    else:
        first, last = f"DATE '{window.first_day.isoformat()}'", f"DATE '{window.last_day.isoformat()}'"
        day_where = f"day BETWEEN {first} AND {last}"
        if window.months_from is None or window.months_to is None:
            base_where = f"grain = 0 AND {day_where}"
        else:
            months = f"day >= DATE '{window.months_from.isoformat()}' AND day < DATE '{window.months_to.isoformat()}'"
            base_where = f"(grain = 1 AND {months}) OR (grain = 0 AND {day_where} AND NOT ({months}))"
    return " UNION ALL ".join(
        [
            f"SELECT {columns} FROM {opened.base} WHERE {base_where}",
            *(f"SELECT {columns} FROM {source} WHERE {day_where}" for source in opened.day_sources()),
        ]
    )


_SIGNATURES_VERSION = text(signatures.VERSION_SQL)
_SIGNATURES = text("""
    SELECT ps.probe_id::text, ps.origin_id::text, s.rtt_bucket, s.bandwidth_bucket, s.bdp_bucket, s.loss_bucket,
           s.region
    FROM analysis_path_signatures AS ps JOIN analysis_signatures AS s ON s.id = ps.signature_id""")
#: Tables of path signatures in the process's DuckDB, by version, with the region names their
#: ``region_code`` indexes (the newest two: a reader may still be using the previous one).
_signature_tables: dict[tuple[Any, ...], tuple[str, list[str]]] = {}


def _signature_table(
    session: Session, cursor: duckdb.DuckDBPyConnection, version: tuple[Any, ...] | None = None
) -> tuple[str, list[str]]:
    """A DuckDB table of every path's signature (buckets, ``region_code``) as ``session`` sees
    them, and the region names; read from PostgreSQL only when they changed since the last call."""
    if version is None:  # else the caller read it (``signatures.VERSION_SQL``) in this request
        version = tuple(session.execute(_SIGNATURES_VERSION).one())
    with _connection_lock:
        known = _signature_tables.get(version)
    if known is not None:
        return known
    rows = session.execute(_SIGNATURES).all()
    region_names = sorted({str(row[6]) for row in rows})
    code_of = {name: code for code, name in enumerate(region_names)}
    columns: dict[str, Any] = {
        "probe_id": np.array([row[0] for row in rows], dtype=object),
        "origin_id": np.array([row[1] for row in rows], dtype=object),
        "region_code": np.array([code_of[str(row[6])] for row in rows], dtype=np.int64),
    }
    for offset, column in enumerate(("rtt_bucket", "bandwidth_bucket", "bdp_bucket", "loss_bucket"), start=2):
        columns[column] = np.array([-1 if row[offset] is None else row[offset] for row in rows], dtype=np.int64)
    name = f"path_signatures_{uuid.uuid4().hex}"
    cursor.register("incoming_signatures", columns)
    try:
        cursor.execute(f"""CREATE TABLE {name} AS SELECT probe_id::UUID AS probe_id, origin_id::UUID AS origin_id,
                                  rtt_bucket, bandwidth_bucket, bdp_bucket, loss_bucket, region_code
                           FROM incoming_signatures""")
    finally:
        cursor.unregister("incoming_signatures")
    with _connection_lock:
        _signature_tables[version] = (name, region_names)
        for old in list(_signature_tables)[:-2]:
            cursor.execute(f"DROP TABLE IF EXISTS {_signature_tables.pop(old)[0]}")
    return name, region_names


@dataclass
class PreparedPathStats:
    """A per-path read of the copy whose PostgreSQL part is done (the copy opened against the
    roll-ups' watermarks, the lag rows read, the signatures' table current): :meth:`run` is
    DuckDB alone, so it may run in another thread while the session's one connection reads
    the bucket roll-ups; :meth:`frame` (on the session's thread) builds the result."""

    opened: _Open
    sql: str
    lag: dict[str, Any] | None
    region_names: list[str]

    def run(self) -> dict[str, Any] | None:
        """The query's columns, or ``None`` when a file cannot be read (read PostgreSQL)."""
        return _execute(self.opened, self.sql, {} if self.lag is None else {"lag": self.lag})

    def frame(self, session: Session, columns: dict[str, Any]) -> PathFrame:
        return _path_frame(session, columns, self.region_names)


def load_path_stats(
    session: Session, directory: pathlib.Path, filters: Filters, all_arms: bool, by_size: bool
) -> PathFrame | None:
    """``frames.load_path_stats`` from the copy (``None``: read PostgreSQL, see the module)."""
    prepared = prepare_path_stats(session, directory, filters, all_arms, by_size)
    columns = None if prepared is None else prepared.run()
    return None if prepared is None or columns is None else prepared.frame(session, columns)


def prepare_path_stats(
    session: Session,
    directory: pathlib.Path,
    filters: Filters,
    all_arms: bool,
    by_size: bool,
    signatures_version: tuple[Any, ...] | None = None,
) -> PreparedPathStats | None:
    """The PostgreSQL half of :func:`load_path_stats` (``None``: the copy cannot be used now);
    ``signatures_version``: ``signatures.VERSION_SQL``'s row if the caller read it already."""
    opened = _open(session, directory)
    if opened is None:
        return None
    conditions = _key_conditions(filters)
    base_iw, treat_iw = int(filters.baseline_iw), int(filters.treatment_iw)
    if not all_arms:
        conditions.append(f"arm_iw IN ({base_iw}, {treat_iw})")
    metric = "server" if filters.metric == "server" else "client"
    region_names: list[str] = []

    def query(cursor: duckdb.DuckDBPyConnection) -> str:
        signature_table, names = _signature_table(session, cursor, signatures_version)
        region_names.extend(names)
        # only paths whose signature is in the regions, as frames._PATH_IN_REGIONS
        wanted = [str(code) for code, name in enumerate(names) if name in filters.regions]
        regions = f"WHERE s.region_code IN ({', '.join(wanted) or '-1'})" if filters.regions else ""
        if by_size:  # c's rows are already one per (path, size octave): no second grouping
            per_path = """
                SELECT probe_id, origin_id, size_bucket, n_trials, w AS n_pairs,
                       CASE WHEN w > 0 THEN w * (sb / nb - st / nt) ELSE 0 END AS sum_diff_ms,
                       CASE WHEN w > 0 THEN w * sb / nb ELSE 0 END AS sum_base_ms
                FROM w"""
        else:
            per_path = """
                SELECT probe_id, origin_id, -2 AS size_bucket, sum(n_trials) AS n_trials, sum(w) AS n_pairs,
                       COALESCE(sum(w * (sb / nb - st / nt)) FILTER (WHERE w > 0), 0) AS sum_diff_ms,
                       COALESCE(sum(w * sb / nb) FILTER (WHERE w > 0), 0) AS sum_base_ms
                FROM w GROUP BY 1, 2"""
        return f"""
            WITH r AS ({_selection(opened, day_window(filters))}),
            c AS (
                SELECT probe_id, origin_id, size_bucket, sum(n_trials::DOUBLE) AS n_trials,
                       sum({metric}_n::DOUBLE) FILTER (WHERE arm_iw = {base_iw}) AS nb,
                       sum({metric}_sum_us::DOUBLE) FILTER (WHERE arm_iw = {base_iw}) / 1000.0 AS sb,
                       sum({metric}_n::DOUBLE) FILTER (WHERE arm_iw = {treat_iw}) AS nt,
                       sum({metric}_sum_us::DOUBLE) FILTER (WHERE arm_iw = {treat_iw}) / 1000.0 AS st
                FROM r WHERE {" AND ".join(conditions) or "TRUE"} GROUP BY probe_id, origin_id, size_bucket),
            w AS (SELECT *, CASE WHEN nb > 0 AND nt > 0 THEN least(nb, nt) ELSE 0 END AS w FROM c),
            g AS ({per_path})
            SELECT (dense_rank() OVER (ORDER BY g.probe_id, g.origin_id) - 1)::BIGINT AS path,
                   (dense_rank() OVER (ORDER BY g.probe_id) - 1)::BIGINT AS probe, g.size_bucket::BIGINT AS size_bucket,
                   COALESCE(s.rtt_bucket, -1) AS rtt_bucket, COALESCE(s.bandwidth_bucket, -1) AS bandwidth_bucket,
                   COALESCE(s.bdp_bucket, -1) AS bdp_bucket, COALESCE(s.loss_bucket, -1) AS loss_bucket,
                   g.n_trials, g.n_pairs, g.sum_diff_ms, g.sum_base_ms, COALESCE(s.region_code, -1) AS region,
                   -- the ids once per path (NULL on its other rows): parsing 20,000 ids is costly
                   CASE WHEN row_number() OVER (PARTITION BY g.probe_id, g.origin_id) = 1
                        THEN g.probe_id::VARCHAR END AS probe_id,
                   CASE WHEN row_number() OVER (PARTITION BY g.probe_id, g.origin_id) = 1
                        THEN g.origin_id::VARCHAR END AS origin_id,
                   CASE WHEN row_number() OVER (PARTITION BY g.probe_id, g.origin_id) = 1
                        THEN {mix_sql("g")} END AS mix,
                   CASE WHEN s.region_code IS NULL THEN g.probe_id::VARCHAR END AS unsigned_probe
            FROM g LEFT JOIN {signature_table} AS s ON s.probe_id = g.probe_id AND s.origin_id = g.origin_id {regions}
            ORDER BY 1, 3"""

    cursor = _reader()
    try:
        sql = query(cursor)
    finally:
        cursor.close()
    return PreparedPathStats(opened, sql, _lag_sums(session, opened) if opened.behind else None, region_names)


def _path_frame(session: Session, columns: dict[str, Any], region_names: list[str]) -> PathFrame:
    """The frame of the copy's per-path rows (sorted by path; ``region`` codes into
    ``region_names``; the ids on each path's first row): a path without a stored signature
    (``unsigned_probe`` names its probe) takes its probe's region, as in PostgreSQL."""
    path = np.asarray(columns["path"], dtype=np.int64)
    probe_ids = np.ma.asarray(columns["probe_id"]).compressed().tolist()
    origin_ids = np.ma.asarray(columns["origin_id"]).compressed().tolist()
    mix = np.ma.asarray(columns["mix"]).compressed().astype(np.uint64)
    region = np.asarray(columns["region"], dtype=np.int64)
    names = list(region_names)
    unsigned = np.ma.asarray(columns["unsigned_probe"])
    if unsigned.count():
        rows = np.flatnonzero(~np.ma.getmaskarray(unsigned))
        wanted = sorted({str(probe) for probe in unsigned.compressed()})
        known: dict[str, str | None] = {
            str(row[0]): row[1]
            for row in session.execute(
                text("SELECT id::text, region FROM probes WHERE id = ANY(CAST(:ids AS uuid[]))"), {"ids": wanted}
            )
        }
        for row in rows.tolist():
            name = known.get(str(unsigned[row])) or "unknown"
            if name not in names:
                names.append(name)
            region[row] = names.index(name)

    def ints(name: str) -> IntArray:
        return np.asarray(columns[name], dtype=np.int64)

    def floats(name: str) -> FloatArray:
        return np.asarray(columns[name], dtype=np.float64)

    return PathFrame(
        path=path,
        probe=ints("probe"),
        size_bucket=ints("size_bucket"),
        region=region,
        region_names=names,
        rtt_bucket=ints("rtt_bucket"),
        bandwidth_bucket=ints("bandwidth_bucket"),
        bdp_bucket=ints("bdp_bucket"),
        loss_bucket=ints("loss_bucket"),
        n_trials=floats("n_trials"),
        n_pairs=floats("n_pairs"),
        sum_diff_ms=floats("sum_diff_ms"),
        sum_base_ms=floats("sum_base_ms"),
        path_ids=PathIds(probe_ids, origin_ids, mix),
    )


def probe_totals(session: Session, directory: pathlib.Path, today: dt.date) -> dict[str, tuple[int, int, int]] | None:
    """Per probe (its id as text): trials, failed trials (whole history) and trials on the 7
    days ending with ``today`` -- the fleet table's totals (``queries.fleet``,
    ``frames.load_probe_totals``) -- or ``None`` (read PostgreSQL)."""
    opened = _open(session, directory)
    if opened is None:
        return None
    week = f"day > DATE '{(today - dt.timedelta(days=WEEK_DAYS)).isoformat()}' AND day <= DATE '{today.isoformat()}'"
    # the base's whole-history rows count for the totals and its day rows for the week; the day
    # rows after the base count for both
    after_base = "".join(
        f" UNION ALL SELECT probe_id, n_trials, client_n, day, TRUE, TRUE FROM {source}" for source in opened.day_sources()
    )
    columns = _execute(
        opened,
        f"""
            SELECT probe_id::VARCHAR AS probe_id,
                   COALESCE(sum(n_trials) FILTER (WHERE in_total), 0)::BIGINT AS total,
                   COALESCE(sum(n_trials - client_n) FILTER (WHERE in_total), 0)::BIGINT AS errors,
                   COALESCE(sum(n_trials) FILTER (WHERE by_day AND {week}), 0)::BIGINT AS week
            FROM (SELECT probe_id, n_trials, client_n, day, grain = {GRAIN_ALL} AS in_total, grain = 0 AS by_day
                  FROM {opened.base} WHERE grain = {GRAIN_ALL} OR (grain = 0 AND {week}){after_base})
            GROUP BY probe_id""",
        {"lag": _lag_sums(session, opened)} if opened.behind else {},
    )
    if columns is None:
        return None
    return dict(
        zip(
            columns["probe_id"].tolist(),
            zip(columns["total"].tolist(), columns["errors"].tolist(), columns["week"].tolist(), strict=True),
            strict=True,
        )
    )


_DETAIL_COLUMNS = (
    "path",
    "arm_iw",
    "size_bucket",
    "rtt_bucket",
    "bandwidth_bucket",
    "bdp_bucket",
    "loss_bucket",
    "bin",
    "n_all",
    "n",
    "sum_us",
    "sumsq",
)


@dataclass
class PreparedPathDetail:
    """A per-path histogram read of the copy whose PostgreSQL part is done (as
    :class:`PreparedPathStats`): :meth:`run` is DuckDB alone and may run in another thread
    while the session's thread goes on; :meth:`frame` builds the result."""

    opened: _Open
    sql: str
    wanted: dict[str, Any]
    lag: dict[str, Any] | None
    region_names: list[str]
    paths: list[tuple[uuid.UUID, uuid.UUID]]

    def run(self) -> dict[str, Any] | None:
        """The query's columns, or ``None`` when a file cannot be read (read PostgreSQL)."""
        return _execute(self.opened, self.sql, {"wanted_paths": self.wanted, **({} if self.lag is None else {"lag": self.lag})})

    def frame(self, found: dict[str, Any]) -> Frame:
        names = np.array([*self.region_names, "unknown"], dtype=object)  # code -1: no stored signature
        region = names[np.asarray(found["region"], dtype=np.int64)].tolist()
        return detail_frame([*(found[name] for name in _DETAIL_COLUMNS), region], self.paths)


def load_path_detail(
    session: Session, directory: pathlib.Path, filters: Filters, arms: Sequence[int], paths: Sequence[tuple[uuid.UUID, uuid.UUID]]
) -> Frame | None:
    """``frames.load_path_detail`` from the copy's per-path histograms (``None``: read
    PostgreSQL); see :func:`prepare_path_detail`."""
    prepared = prepare_path_detail(session, directory, filters, arms, paths)
    found = None if prepared is None else prepared.run()
    return None if prepared is None or found is None else prepared.frame(found)


def prepare_path_detail(
    session: Session,
    directory: pathlib.Path,
    filters: Filters,
    arms: Sequence[int],
    paths: Sequence[tuple[uuid.UUID, uuid.UUID]],
    signatures_version: tuple[Any, ...] | None = None,
) -> PreparedPathDetail | None:
    """The PostgreSQL half of :func:`load_path_detail` (``None``: the copy cannot be used now;
    ``signatures_version`` as in :func:`prepare_path_stats`).
    The histogram files are sorted by side and the paths' pseudo-random order
    (``frames.PathIds.order_keys``), which is the order the percentile intervals take their subsets
    in: a subset of the first paths of a large group lies in the first row groups."""
    opened = _open(session, directory)
    if opened is None or not paths:
        return None
    client = filters.metric != "server"
    mixes = [(probe.int >> 64) ^ (origin.int >> 64) for probe, origin in paths]
    conditions = [
        f"side = {0 if client else 1}",
        f"arm_iw IN ({', '.join(str(int(arm)) for arm in arms)})",
        *_key_conditions(filters),
    ]
    window = day_window(filters)
    if window is not None:
        conditions.append(f"day BETWEEN DATE '{window.first_day.isoformat()}' AND DATE '{window.last_day.isoformat()}'")
    where = " AND ".join(conditions)
    columns = "probe_id, origin_id, arm_iw, size_bucket, bin, n_all, n, sum_us, sumsq"
    # the base's parts that hold the paths' places in the order, and every delta
    parts = range(min(mixes) >> HIST_PART_SHIFT, (max(mixes) >> HIST_PART_SHIFT) + 1)
    hist_files = [*(opened.manifest.hist_base[part] for part in parts), *opened.manifest.hist_deltas]
    # the mix range prunes row groups; the join picks the paths
    sources = [
        f"SELECT {columns} FROM read_parquet({file_list(directory, hist_files)}) "
        f"WHERE {where} AND mix BETWEEN {min(mixes)}::UBIGINT AND {max(mixes)}::UBIGINT"
    ]
    if opened.behind:  # the lag rows are this side's
        sources.append(
            f"SELECT {columns} FROM (SELECT * REPLACE (probe_id::UUID AS probe_id, origin_id::UUID AS "
            f"origin_id, day::DATE AS day), {0 if client else 1} AS side FROM lag) WHERE {where}"
        )
    wanted = {
        "path": np.arange(len(paths), dtype=np.int64),
        "probe_id": np.array([str(p) for p, _ in paths], dtype=object),
        "origin_id": np.array([str(o) for _, o in paths], dtype=object),
    }
    cursor = _reader()
    try:
        signature_table, region_names = _signature_table(session, cursor, signatures_version)
    finally:
        cursor.close()
    sql = f"""
            WITH h AS ({" UNION ALL ".join(sources)}),
            e AS (
                SELECT w.path, h.probe_id, h.origin_id, h.arm_iw, h.size_bucket, h.bin, sum(h.n_all)::DOUBLE AS n_all,
                       sum(h.n)::DOUBLE AS n, sum(h.sum_us)::DOUBLE AS sum_us, sum(h.sumsq)::DOUBLE AS sumsq
                FROM h JOIN (SELECT path, probe_id::UUID AS probe_id, origin_id::UUID AS origin_id FROM wanted_paths) AS w
                  ON w.probe_id = h.probe_id AND w.origin_id = h.origin_id
                GROUP BY ALL)
            SELECT e.path, e.arm_iw::BIGINT AS arm_iw, e.size_bucket::BIGINT AS size_bucket,
                   COALESCE(s.rtt_bucket, -1) AS rtt_bucket, COALESCE(s.bandwidth_bucket, -1) AS bandwidth_bucket,
                   COALESCE(s.bdp_bucket, -1) AS bdp_bucket, COALESCE(s.loss_bucket, -1) AS loss_bucket,
                   e.bin::BIGINT AS bin, e.n_all, e.n, e.sum_us, e.sumsq, COALESCE(s.region_code, -1) AS region
            FROM e LEFT JOIN {signature_table} AS s ON s.probe_id = e.probe_id AND s.origin_id = e.origin_id"""
    lag = _lag_hists(session, opened, client) if opened.behind else None
    return PreparedPathDetail(opened, sql, wanted, lag, list(region_names), list(paths))
