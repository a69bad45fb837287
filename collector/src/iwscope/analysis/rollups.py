"""Incremental refresh of ``analysis_rollups`` and ``analysis_bucket_rollups`` from ``trials``.

Every trial is folded into two rows of each: its UTC day's and its calendar month's (``grain``),
so queries read month rows for whole months and day rows only at the edges of a time range.
The per-path rows hold sums only and are folded by one INSERT ... SELECT ... ON CONFLICT for
both sides (set-based: the work is PostgreSQL's, about one key per trial at fleet density); the
bucket rows (keyed by the path's signature, with histograms) are merged here, one per touched
(signature, arm, size octave, day / month).

A trial contributes twice, at different times:

* its **client side** (count, errors, size range, probe-side ``total_us``) once it is stored,
  selected by ``received_at``;
* its **server side** (origin ``server_latency_us``, retransmission counters) once the join
  task has copied the origin observation into it, selected by ``joined_at``.

Each refresh folds in the trials whose ``received_at`` (resp. ``joined_at``) lies in
``(watermark, bound]`` and moves both watermarks to ``bound``, all in one transaction under
a transaction-level advisory lock, so running it twice or concurrently folds every trial in
exactly once.

``bound`` is ``min(now, start of the oldest other open transaction) - margin``: a row that is
not yet committed was stamped (``received_at``/``joined_at`` = ``now()``, i.e. its
transaction's start, or the application clock a moment before) after that instant, so it
can never be skipped by a watermark that has already moved past it.  The margin (default
1 s) absorbs the difference between an application-side timestamp and its transaction's
start.  This assumes ``joined_at`` is set once per trial (the join task's contract).
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, cast

from sqlalchemy import BigInteger, CursorResult, Date, Integer, SmallInteger, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import UUID as PgUUID
from sqlalchemy.orm import Session

from iwscope.analysis import signatures
from iwscope.analysis.buckets import hist_bin_sql
from iwscope.analysis.models import NO_CAMPAIGN, NO_ORIGIN, BucketRollup, Rollup, Watermark
from iwscope.analysis.stats import add_to_packed, unpack_histogram
from iwscope.db import driver_connection
from iwscope.paths import services as paths

#: Key of the transaction-level advisory lock that serialises refreshes (any fixed bigint).
ADVISORY_LOCK_KEY = 0x69777363_6F706531  # "iwscope1"
WATERMARK_NAME = "trials"
DEFAULT_MARGIN = dt.timedelta(seconds=1)

#: ``grain`` of a roll-up row: one UTC day, or one calendar month (``day`` = its first day).
GRAIN_DAY = 0
GRAIN_MONTH = 1

_SIZE_EDGES = "ARRAY[" + ",".join(str(2**k) for k in range(63)) + "]::bigint[]"
_KEY_SQL = f"""
    COALESCE(campaign_id, {NO_CAMPAIGN}) AS campaign_id,
    probe_id,
    COALESCE(origin_id, '{NO_ORIGIN}'::uuid) AS origin_id,
    arm_iw,
    width_bucket(object_size, {_SIZE_EDGES}) - 1 AS size_bucket,
    (started_at AT TIME ZONE 'UTC')::date AS day"""
#: The per-path roll-ups' key (besides ``grain``), as the trial selections name it.
PATH_KEY = ("campaign_id", "probe_id", "origin_id", "arm_iw", "size_bucket", "day")


#: The trials the roll-ups (and so every latency figure) are made of: short flows of plain arms.
#: Background, interactive and page-load flows and paced or learned arms are the cost
#: analysis's (:mod:`iwscope.analysis.cost`); keyed by ``arm_iw`` they would pass for plain arms.
def paired_trials_sql(alias: str = "") -> str:
    """The condition on ``trials`` (aliased ``alias``) that picks what the roll-ups hold."""
    prefix = f"{alias}." if alias else ""
    return f"{prefix}role = 'short' AND {prefix}arm IS NULL"


_PAIRED_TRIALS = paired_trials_sql()

#: The inner selection of each side: trials (``{where}``) with their roll-up key, latency
#: (NULL unless successful) and histogram bin.
_CLIENT_TRIALS = f"""
    SELECT {_KEY_SQL}, object_size,
           CASE WHEN error_kind IS NULL AND total_us IS NOT NULL THEN total_us END AS latency_us,
           CASE WHEN error_kind IS NULL AND total_us IS NOT NULL THEN {hist_bin_sql("total_us")} END AS bin
    FROM trials WHERE {{where}} AND {_PAIRED_TRIALS}"""
_SERVER_TRIALS = f"""
    SELECT {_KEY_SQL}, server_total_retrans, server_bytes_retrans, server_bytes_sent,
           CASE WHEN error_kind IS NULL AND server_latency_us IS NOT NULL THEN server_latency_us END AS latency_us,
           CASE WHEN error_kind IS NULL AND server_latency_us IS NOT NULL
                THEN {hist_bin_sql("server_latency_us")} END AS bin
    FROM trials WHERE {{where}} AND {_PAIRED_TRIALS}"""
#: The aggregates over a side's trials (``t``), each defined once: the bucket deltas and the
#: per-path fold select them under their own names.
_AGG = {
    "all": "count(*)",
    "n": "count(t.latency_us)",
    "sum": "COALESCE(sum(t.latency_us), 0)",
    "sumsq": "COALESCE(sum(t.latency_us::numeric * t.latency_us), 0)",
    "retrans_n": "count(t.server_total_retrans)",
    "retrans_trials": "count(*) FILTER (WHERE t.server_total_retrans > 0)",
    "bytes_retrans": "COALESCE(sum(t.server_bytes_retrans) FILTER (WHERE t.server_total_retrans IS NOT NULL), 0)",
    "bytes_sent": "COALESCE(sum(t.server_bytes_sent) FILTER (WHERE t.server_total_retrans IS NOT NULL), 0)",
}
_CLIENT_MEASURES = (
    f"{_AGG['all']} AS n_all, {_AGG['n']} AS n, min(t.object_size) AS size_min, "
    f"max(t.object_size) AS size_max, {_AGG['sum']} AS sum_us, {_AGG['sumsq']} AS sumsq"
)
_SERVER_MEASURES = f"{_AGG['all']} AS n_all, {_AGG['n']} AS n, {_AGG['sum']} AS sum_us, {_AGG['sumsq']} AS sumsq, " + ", ".join(
    f"{_AGG[name]} AS {name}" for name in ("retrans_n", "retrans_trials", "bytes_retrans", "bytes_sent")
)
#: A ``{where}`` of received (resp. joined) trials inside a refresh's windows (an empty window,
#: high <= low, selects nothing).
_RECEIVED_IN_WINDOW = "received_at > :rlow AND received_at <= :rhigh"
_JOINED_IN_WINDOW = "joined_at > :jlow AND joined_at <= :jhigh"


def side_window(client: bool) -> str:
    """The ``{where}`` of one side's trials in a refresh's window (``:rlow``/``:rhigh`` on
    ``received_at`` for the client side, ``:jlow``/``:jhigh`` on ``joined_at`` for the server's)."""
    return _RECEIVED_IN_WINDOW if client else _JOINED_IN_WINDOW


def side_trials_sql(client: bool, where: str) -> str:
    """The trials the roll-ups hold, of one side (``client``: stored; else joined), selected by
    ``where`` (a condition on ``trials``' own columns): their roll-up key (``campaign_id``,
    ``probe_id``, ``origin_id`` with NULLs mapped, ``arm_iw``, ``size_bucket``, ``day``), the
    side's ``latency_us`` (NULL unless successful) and its histogram ``bin``."""
    return (_CLIENT_TRIALS if client else _SERVER_TRIALS).format(where=where)


def _side(client: bool, where: str) -> tuple[str, str]:
    """The trials of one side selected by ``where``, and the aggregates of that side."""
    return side_trials_sql(client, where), _CLIENT_MEASURES if client else _SERVER_MEASURES


def _bucket_delta_sql(client: bool, where: str) -> Any:
    """One side's aggregates per (campaign, signature, arm, size octave, day, histogram bin):
    what the bucket roll-ups fold (every path has its signature stored before this runs)."""
    trials, measures = _side(client, where)
    return text(f"""
        SELECT t.campaign_id, ps.signature_id AS unit, t.arm_iw, t.size_bucket, t.day, t.bin, {measures}
        FROM ({trials}) AS t
        JOIN analysis_path_signatures AS ps ON ps.probe_id = t.probe_id AND ps.origin_id = t.origin_id
        GROUP BY t.campaign_id, ps.signature_id, t.arm_iw, t.size_bucket, t.day, t.bin""")


def path_bin_sums_sql(client: bool, where: str) -> str:
    """One side's aggregates of the trials ``where`` selects, per (campaign, path, arm, size
    octave, day, histogram bin), as the roll-ups count them: a path's share of the bucket rows
    (``rebucket``) and the analysis copy's per-path histograms (``pathcopy``).  Client side:
    ``n_all`` trials, ``n`` with a latency, ``size_min``/``size_max``, ``sum_us``, ``sumsq``;
    server side adds the retransmission counters."""
    trials, measures = _side(client, where)
    return f"""
        SELECT t.campaign_id, t.probe_id, t.origin_id, t.arm_iw, t.size_bucket, t.day, t.bin, {measures}
        FROM ({trials}) AS t
        GROUP BY t.campaign_id, t.probe_id, t.origin_id, t.arm_iw, t.size_bucket, t.day, t.bin"""


#: The per-path roll-ups' key of a trial, per grain (day row and month row of each trial).
_PATH_KEY_OUT = f"""t.campaign_id, t.probe_id, t.origin_id, t.arm_iw, t.size_bucket,
    CASE WHEN g.grain = {GRAIN_DAY} THEN t.day ELSE date_trunc('month', t.day)::date END, g.grain"""
_GRAINS = f"CROSS JOIN (VALUES ({GRAIN_DAY}), ({GRAIN_MONTH})) AS g(grain)"

#: The per-path roll-ups' measure columns each side adds to, and the aggregate that fills each.
_PATH_SIDE_COLUMNS = {
    True: {
        "n_trials": _AGG["all"],
        "n_errors": f"{_AGG['all']} - {_AGG['n']}",
        "client_n": _AGG["n"],
        "client_sum_us": _AGG["sum"],
        "client_sumsq_us2": _AGG["sumsq"],
    },
    False: {
        "server_n": _AGG["n"],
        "server_sum_us": _AGG["sum"],
        "server_sumsq_us2": _AGG["sumsq"],
        **{name: _AGG[name] for name in ("retrans_n", "retrans_trials", "bytes_retrans", "bytes_sent")},
    },
}
_PATH_MEASURES = (*_PATH_SIDE_COLUMNS[True], *_PATH_SIDE_COLUMNS[False])


def _path_side_sql(client: bool, grains: str = _GRAINS, measures: tuple[str, ...] = _PATH_MEASURES) -> str:
    """One side's deltas of the per-path roll-ups over its window (``:rlow``/``:rhigh`` on
    ``received_at``, ``:jlow``/``:jhigh`` on ``joined_at``), per key and grain, in the column
    order of ``_path_fold_sql`` (the other side's measures 0).  The client side carries the
    size range; the server side its size octave's lower edge (``edge``) for rows it creates."""
    side = _PATH_SIDE_COLUMNS[client]
    edge = "CASE WHEN t.size_bucket >= 0 THEN 1::bigint << t.size_bucket ELSE 0 END"
    sizes = "min(t.object_size), max(t.object_size), NULL::bigint" if client else f"NULL::bigint, NULL::bigint, {edge}"
    trials = side_trials_sql(client, side_window(client))
    return f"""
        SELECT {_PATH_KEY_OUT}, {sizes}, {", ".join(side.get(name, "0") for name in measures)}
        FROM ({trials}) AS t {grains}
        GROUP BY 1, 2, 3, 4, 5, 6, 7"""


def path_window_sums_sql(measures: tuple[str, ...]) -> str:
    """Both sides' sums ``measures`` (per-path roll-up columns) of the trials in a refresh's
    windows (``:rlow``/``:rhigh``, ``:jlow``/``:jhigh``), per (campaign, probe, origin, arm,
    size octave, UTC day): the day rows the fold of those windows adds to (``pathcopy``)."""
    key = ", ".join(PATH_KEY)
    day_only = f"CROSS JOIN (VALUES ({GRAIN_DAY})) AS g(grain)"
    return f"""
        SELECT {key}, {", ".join(f"sum(d.{name})::bigint AS {name}" for name in measures)}
        FROM ({_path_side_sql(True, day_only, measures)}
              UNION ALL {_path_side_sql(False, day_only, measures)}) AS d ({key}, grain, size_min, size_max, edge,
                                                                           {", ".join(measures)})
        GROUP BY {key}"""


def _path_fold_sql() -> Any:
    """One statement folds both sides' windows into the per-path roll-ups (sufficient
    statistics, no histograms): the measures are added to existing rows, missing rows are
    created.  Size bounds: a client side widens the row's (a new row takes the client side's);
    a row a server side creates alone takes its size octave's lower edge.  One upsert instead
    of one per side: the two sides of a window touch mostly the same keys, and each index
    probe of the ON CONFLICT is paid once."""
    key = "campaign_id, probe_id, origin_id, arm_iw, size_bucket, day, grain"
    measures = ", ".join(f"sum(d.{name})" for name in _PATH_MEASURES)
    return text(f"""
        INSERT INTO analysis_rollups AS r ({key}, size_min, size_max, {", ".join(_PATH_MEASURES)}, updated_at)
        SELECT {", ".join(f"d.{column}" for column in key.split(", "))},
               COALESCE(min(d.size_min), min(d.edge)), COALESCE(max(d.size_max), min(d.edge)), {measures}, clock_timestamp()
        FROM ({_path_side_sql(True)}
              UNION ALL {_path_side_sql(False)}) AS d ({key}, size_min, size_max, edge, {", ".join(_PATH_MEASURES)})
        GROUP BY {", ".join(f"d.{column}" for column in key.split(", "))}
        ON CONFLICT ON CONSTRAINT pk_analysis_rollups DO UPDATE SET
            size_min = CASE WHEN EXCLUDED.n_trials > 0 THEN LEAST(r.size_min, EXCLUDED.size_min) ELSE r.size_min END,
            size_max = CASE WHEN EXCLUDED.n_trials > 0 THEN GREATEST(r.size_max, EXCLUDED.size_max) ELSE r.size_max END,
            {", ".join(f"{name} = r.{name} + EXCLUDED.{name}" for name in _PATH_MEASURES)},
            updated_at = EXCLUDED.updated_at""")


#: Paths with trials in either window that have no stored signature yet.
_UNSIGNED_PATHS = text(f"""
    SELECT DISTINCT t.probe_id, COALESCE(t.origin_id, '{NO_ORIGIN}'::uuid) AS origin_id FROM trials AS t
    WHERE (({_RECEIVED_IN_WINDOW}) OR ({_JOINED_IN_WINDOW}))
      AND {paired_trials_sql("t")} AND NOT EXISTS (
        SELECT 1 FROM analysis_path_signatures AS ps
        WHERE ps.probe_id = t.probe_id AND ps.origin_id = COALESCE(t.origin_id, '{NO_ORIGIN}'::uuid))""")

_BOUND = text("""
    SELECT LEAST(clock_timestamp(),
                 COALESCE((SELECT min(xact_start) FROM pg_stat_activity
                           WHERE pid <> pg_backend_pid() AND xact_start IS NOT NULL
                             AND backend_type = 'client backend' AND datname = current_database()),
                          'infinity'::timestamptz)) - make_interval(secs => :margin)""")


@dataclass
class _MetricDelta:
    n: int = 0
    sum_us: int = 0
    sumsq: Decimal = Decimal(0)
    bins: dict[int, int] = field(default_factory=dict)

    def add(self, row: Any) -> None:
        if row.bin is None:
            return
        self.n += int(row.n)
        self.sum_us += int(row.sum_us)
        self.sumsq += Decimal(row.sumsq)
        self.bins[int(row.bin)] = self.bins.get(int(row.bin), 0) + int(row.n)

    def merge(self, other: _MetricDelta, sign: int = 1) -> None:
        self.n += sign * other.n
        self.sum_us += sign * other.sum_us
        self.sumsq += sign * other.sumsq
        for index, count in other.bins.items():
            self.bins[index] = self.bins.get(index, 0) + sign * count


@dataclass
class _Delta:
    n_trials: int = 0
    n_errors: int = 0
    size_min: int | None = None
    size_max: int | None = None
    client: _MetricDelta = field(default_factory=_MetricDelta)
    server: _MetricDelta = field(default_factory=_MetricDelta)
    retrans_n: int = 0
    retrans_trials: int = 0
    bytes_retrans: int = 0
    bytes_sent: int = 0

    def merge(self, other: _Delta, sign: int = 1) -> None:
        """Add (``sign`` 1) or take away (-1) ``other``.  Size bounds only widen: a bound of a
        union stays a (loose) bound after a part is taken away."""
        self.n_trials += sign * other.n_trials
        self.n_errors += sign * other.n_errors
        for name, pick in (("size_min", min), ("size_max", max)):
            values = [value for value in (getattr(self, name), getattr(other, name)) if value is not None]
            setattr(self, name, pick(values) if values else None)
        self.client.merge(other.client, sign)
        self.server.merge(other.server, sign)
        self.retrans_n += sign * other.retrans_n
        self.retrans_trials += sign * other.retrans_trials
        self.bytes_retrans += sign * other.bytes_retrans
        self.bytes_sent += sign * other.bytes_sent


@dataclass(frozen=True)
class _Table:
    """A roll-up table: its model, primary key constraint and key columns with their SQL types."""

    model: Any
    constraint: str
    keys: tuple[tuple[str, Any], ...]

    @property
    def name(self) -> str:
        return str(self.model.__tablename__)

    def key(self, row: Any) -> tuple[Any, ...]:
        return tuple(int(value) if isinstance(value, int) else value for value in (getattr(row, name) for name, _ in self.keys))


#: Per path: the paired estimate's sufficient statistics (no histograms; folded in SQL).
PATH_TABLE = _Table(
    Rollup,
    "pk_analysis_rollups",
    (
        ("campaign_id", BigInteger),
        ("probe_id", PgUUID),
        ("origin_id", PgUUID),
        ("arm_iw", SmallInteger),
        ("size_bucket", SmallInteger),
        ("day", Date),
        ("grain", SmallInteger),
    ),
)
#: Per path signature (``signatures``): what the figures' histograms read (folded by :func:`fold`).
BUCKET_TABLE = _Table(
    BucketRollup,
    "pk_analysis_bucket_rollups",
    (
        ("campaign_id", BigInteger),
        ("signature_id", Integer),
        ("arm_iw", SmallInteger),
        ("size_bucket", SmallInteger),
        ("day", Date),
        ("grain", SmallInteger),
    ),
)
BucketKey = tuple[int, int, int, int, dt.date, int]


@dataclass(frozen=True)
class RefreshResult:
    """What one refresh did (JSON-serialisable with ``dataclasses.asdict`` after isoformat)."""

    skipped: bool
    client_trials: int
    server_trials: int
    #: Per-path roll-up rows written (inserted or added to).
    keys_updated: int
    received_upto: dt.datetime | None
    joined_upto: dt.datetime | None


def _delta_keys(row: Any, unit: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The day row and the month row of ``unit`` (a signature id, or a path) that a delta row of
    trials is folded into."""
    base = (int(row.campaign_id), *unit, int(row.arm_iw), int(row.size_bucket))
    return (*base, row.day, GRAIN_DAY), (*base, row.day.replace(day=1), GRAIN_MONTH)


def _add_client(delta: _Delta, row: Any) -> None:
    delta.n_trials += int(row.n_all)
    delta.n_errors += int(row.n_all) - int(row.n)
    delta.size_min = row.size_min if delta.size_min is None else min(delta.size_min, row.size_min)
    delta.size_max = row.size_max if delta.size_max is None else max(delta.size_max, row.size_max)
    delta.client.add(row)


def _add_server(delta: _Delta, row: Any) -> None:
    delta.server.add(row)
    delta.retrans_n += int(row.retrans_n)
    delta.retrans_trials += int(row.retrans_trials)
    delta.bytes_retrans += int(row.bytes_retrans)
    delta.bytes_sent += int(row.bytes_sent)


def _merge_metric(existing: Any, prefix: str, delta: _MetricDelta) -> dict[str, Any]:
    n = delta.n + (getattr(existing, f"{prefix}_n") if existing else 0)
    sum_us = delta.sum_us + (getattr(existing, f"{prefix}_sum_us") if existing else 0)
    sumsq = delta.sumsq + (Decimal(getattr(existing, f"{prefix}_sumsq_us2")) if existing else Decimal(0))
    lo, packed = add_to_packed(
        getattr(existing, f"{prefix}_hist_lo") if existing else 0,
        getattr(existing, f"{prefix}_hist") if existing else b"",
        delta.bins,
    )
    return {
        f"{prefix}_n": n,
        f"{prefix}_sum_us": sum_us,
        f"{prefix}_sumsq_us2": sumsq,
        f"{prefix}_hist_lo": lo,
        f"{prefix}_hist": packed,
    }


def _load_existing(session: Session, table: _Table, keys: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], Any]:
    if not keys:
        return {}
    columns = list(zip(*keys, strict=True))
    names = [name for name, _ in table.keys]
    statement = text(f"""
        SELECT r.* FROM {table.name} AS r
        JOIN unnest({", ".join(f":k{i}" for i in range(len(names)))}) AS k({", ".join(names)})
          ON ({", ".join(f"r.{name}" for name in names)}) = ({", ".join(f"k.{name}" for name in names)})""").bindparams(
        *(bindparam(f"k{i}", type_=ARRAY(sql_type)) for i, (_, sql_type) in enumerate(table.keys))
    )
    rows = session.execute(statement, {f"k{i}": list(column) for i, column in enumerate(columns)}).all()
    return {table.key(row): row for row in rows}


def _upsert(session: Session, table: _Table, records: list[dict[str, Any]]) -> None:
    """Write ``records`` (complete rows) over ``table``'s rows: COPY into a temporary stage,
    then one INSERT ... ON CONFLICT DO UPDATE (several times faster than executemany)."""
    if not records:
        return
    columns = list(records[0])
    names = ", ".join(columns)
    key_names = {name for name, _ in table.keys}
    updates = ", ".join(f"{name} = EXCLUDED.{name}" for name in columns if name not in key_names)
    stage = f"{table.name}_stage"
    with driver_connection(session).cursor() as cursor:
        cursor.execute(f"CREATE TEMP TABLE IF NOT EXISTS {stage} (LIKE {table.name}) ON COMMIT DELETE ROWS")
        cursor.execute(f"DELETE FROM {stage}")  # a second fold in the same transaction
        with cursor.copy(f"COPY {stage} ({names}) FROM STDIN") as copy:
            for record in records:
                copy.write_row(tuple(record[name] for name in columns))
        cursor.execute(
            f"INSERT INTO {table.name} ({names}) SELECT {names} FROM {stage} "
            f"ON CONFLICT ON CONSTRAINT {table.constraint} DO UPDATE SET {updates}"
        )


def fold(session: Session, deltas: dict[Any, _Delta], table: _Table = BUCKET_TABLE) -> int:
    """Add ``deltas`` (keyed like ``table``'s primary key) to its rows, histograms included,
    creating missing ones; returns rows written."""
    keys = list(deltas)
    existing = {}
    for start in range(0, len(keys), 20000):
        existing.update(_load_existing(session, table, keys[start : start + 20000]))
    now = dt.datetime.now(dt.UTC)
    names = [name for name, _ in table.keys]
    size_at = names.index("size_bucket")
    records: list[dict[str, Any]] = []
    for key, delta in deltas.items():
        old = existing.get(key)
        sizes_min = [value for value in (delta.size_min, old.size_min if old else None) if value is not None]
        sizes_max = [value for value in (delta.size_max, old.size_max if old else None) if value is not None]
        if not sizes_min:  # a server side folded before its client side: the key's size octave bounds
            sizes_min = sizes_max = [2 ** key[size_at] if key[size_at] >= 0 else 0]
        record: dict[str, Any] = dict(zip(names, key, strict=True))
        record.update(
            {
                "n_trials": delta.n_trials + (old.n_trials if old else 0),
                "n_errors": delta.n_errors + (old.n_errors if old else 0),
                "size_min": min(sizes_min),
                "size_max": max(sizes_max),
                "retrans_n": delta.retrans_n + (old.retrans_n if old else 0),
                "retrans_trials": delta.retrans_trials + (old.retrans_trials if old else 0),
                "bytes_retrans": delta.bytes_retrans + (old.bytes_retrans if old else 0),
                "bytes_sent": delta.bytes_sent + (old.bytes_sent if old else 0),
                "updated_at": now,
            }
        )
        record.update(_merge_metric(old, "client", delta.client))
        record.update(_merge_metric(old, "server", delta.server))
        records.append(record)
    _upsert(session, table, records)
    return len(records)


def rebucket(session: Session, pairs: list[tuple[uuid.UUID, uuid.UUID]]) -> int:
    """Move the bucket roll-ups of those ``pairs`` whose buckets changed (their path estimate
    moved) from their old signature's rows to their new one's; returns the paths moved.

    A path's share of its old signature's rows is recomputed from its raw trials up to the
    roll-ups' watermarks (client sides received, server sides joined by then): exactly what was
    folded under that signature, histograms included.  Callers hold the refresh lock."""
    moves = signatures.moved(session, pairs)
    if not moves:
        return 0
    watermark = _ensure_watermark(session)
    by_pair = {pair: (old, new) for pair, old, new in moves}
    where = "probe_id = ANY(CAST(:probe_ids AS uuid[])) AND {column} <= :high"
    params = {"probe_ids": sorted({str(pair[0]) for pair in by_pair})}
    deltas: dict[BucketKey, _Delta] = {}
    for client, column, high in ((True, "received_at", watermark.received_upto), (False, "joined_at", watermark.joined_upto)):
        for row in session.execute(text(path_bin_sums_sql(client, where.format(column=column))), {**params, "high": high}):
            signatures_of = by_pair.get((row.probe_id, row.origin_id))
            if signatures_of is None:  # another path of a moved path's probe
                continue
            for signature_id, sign in ((signatures_of[0], -1), (signatures_of[1], 1)):
                share = _Delta()
                (_add_client if client else _add_server)(share, row)
                for key in _delta_keys(row, (signature_id,)):
                    deltas.setdefault(key, _Delta()).merge(share, sign)
    fold(session, deltas)
    session.execute(
        text("""
        DELETE FROM analysis_bucket_rollups
        WHERE signature_id = ANY(:old) AND n_trials = 0 AND client_n = 0 AND server_n = 0 AND retrans_n = 0"""),
        {"old": sorted({old for old, _ in by_pair.values()})},
    )
    return len(moves)


def _ensure_watermark(session: Session, name: str = WATERMARK_NAME) -> Watermark:
    session.execute(
        text("""
        INSERT INTO analysis_watermarks (name, received_upto, joined_upto, folded_total)
        VALUES (:name, '1970-01-01T00:00:00Z', '1970-01-01T00:00:00Z', 0) ON CONFLICT (name) DO NOTHING"""),
        {"name": name},
    )
    row = session.execute(text("SELECT * FROM analysis_watermarks WHERE name = :name FOR UPDATE"), {"name": name}).one()
    return Watermark(
        name=row.name,
        received_upto=row.received_upto,
        joined_upto=row.joined_upto,
        refreshed_at=row.refreshed_at,
        folded_total=row.folded_total,
    )


#: A watermark that has never moved: nothing folded under its name yet.
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _window(
    session: Session, name: str, margin: dt.timedelta, upto: dt.datetime | None = None
) -> tuple[Watermark, dt.datetime, dt.datetime]:
    """Watermark ``name`` (created at the epoch if missing, row locked) and the high ends of its
    windows: the safe bound of the module docstring, capped by ``upto``, never below the marks."""
    watermark = _ensure_watermark(session, name)
    bound: dt.datetime = session.execute(_BOUND, {"margin": margin.total_seconds()}).scalar_one()
    if upto is not None:
        bound = min(bound, upto)
    return watermark, max(bound, watermark.received_upto), max(bound, watermark.joined_upto)


def _advance(session: Session, name: str, received: dt.datetime, joined: dt.datetime, folded: int) -> None:
    session.execute(
        text("""
        UPDATE analysis_watermarks SET received_upto = :received, joined_upto = :joined,
               refreshed_at = clock_timestamp(), folded_total = folded_total + :folded
        WHERE name = :name"""),
        {"received": received, "joined": joined, "folded": folded, "name": name},
    )


def refresh_rollups(
    session: Session, *, margin: dt.timedelta = DEFAULT_MARGIN, wait: bool = True, upto: dt.datetime | None = None
) -> RefreshResult:
    """Fold new and newly joined trials into the roll-ups; the caller commits.

    ``wait=False`` returns ``skipped=True`` at once when another refresh holds the lock.
    ``upto`` caps the bound (tests and back-fills in slices); it never moves past the safe
    bound described in the module docstring.
    """
    if wait:
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
    elif not session.execute(text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY}).scalar():
        return RefreshResult(True, 0, 0, 0, None, None)
    watermark, received_high, joined_high = _window(session, WATERMARK_NAME, margin, upto)
    bounds = {"rlow": watermark.received_upto, "rhigh": received_high, "jlow": watermark.joined_upto, "jhigh": joined_high}
    # every path gets its signature before the bucket fold
    unsigned = session.execute(_UNSIGNED_PATHS, bounds).all()
    signatures.path_signatures(session, [(row.probe_id, row.origin_id) for row in unsigned])
    keys_updated = cast(CursorResult[Any], session.execute(_path_fold_sql(), bounds)).rowcount
    sides = [
        client for client, (low, high) in ((True, ("rlow", "rhigh")), (False, ("jlow", "jhigh"))) if bounds[high] > bounds[low]
    ]
    deltas, client_trials, server_trials = _collect(session, bounds, sides)
    fold(session, deltas)
    _advance(session, WATERMARK_NAME, received_high, joined_high, client_trials + server_trials)
    return RefreshResult(False, client_trials, server_trials, keys_updated, received_high, joined_high)


def _collect(session: Session, bounds: dict[str, dt.datetime], sides: list[bool]) -> tuple[dict[BucketKey, _Delta], int, int]:
    """The bucket roll-ups' deltas of the trials received (client side) / joined (server side)
    in the windows ``bounds``, of the ``sides`` whose window is not empty."""
    deltas: dict[BucketKey, _Delta] = {}
    counted = {True: 0, False: 0}
    for client in sides:
        statement = _bucket_delta_sql(client, side_window(client))
        for row in session.execute(statement, bounds, execution_options={"yield_per": 50_000}):
            counted[client] += int(row.n_all)
            for key in _delta_keys(row, (int(row.unit),)):
                (_add_client if client else _add_server)(deltas.setdefault(key, _Delta()), row)
    return deltas, counted[True], counted[False]


def reset_rollups(session: Session) -> None:
    """Empty the roll-ups and reset their watermarks (the next refresh folds every trial in)."""
    session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
    session.execute(text("DELETE FROM analysis_rollups"))
    session.execute(text("DELETE FROM analysis_bucket_rollups"))
    session.execute(text("DELETE FROM analysis_path_signatures"))
    session.execute(text("DELETE FROM analysis_watermarks WHERE name = :name"), {"name": WATERMARK_NAME})


def rebuild_rollups(session: Session, *, upto: dt.datetime | None = None) -> RefreshResult:
    """Full recomputation from the raw trials: reset, then fold everything in again."""
    reset_rollups(session)
    return refresh_rollups(session, upto=upto)


#: The path estimates' own watermarks (``paths.services``): a reset of the roll-ups does not
#: fold their history into the estimates twice.
PATH_WATERMARK_NAME = "path_estimates"


def refresh_path_estimates(session: Session, *, margin: dt.timedelta = DEFAULT_MARGIN) -> int:
    """Fold the trials and path samples received, and the joins made, since the last call into
    the path estimates (``paths.fold_window``), under the refresh's lock and with the same
    safe bound; returns the pairs written.  The worker's refresh task runs it after the
    roll-ups; the caller commits.  The first call (no watermark yet, e.g. after migration 0007)
    empties the parts of rows written earlier and folds the whole history."""
    session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
    watermark, received_high, joined_high = _window(session, PATH_WATERMARK_NAME, margin)
    if watermark.received_upto == _EPOCH:  # first fold: rows written before 0007 start from zero
        paths.forget_parts(session)
    pairs = paths.fold_window(session, watermark.received_upto, received_high, watermark.joined_upto, joined_high)
    _advance(session, PATH_WATERMARK_NAME, received_high, joined_high, len(pairs))
    rebucket(session, pairs)
    return len(pairs)


def caught_up(session: Session, received_at: dt.datetime | None, joined_at: dt.datetime | None) -> bool:
    """Whether the roll-ups and the path estimates have both folded in everything received up to
    ``received_at`` and joined up to ``joined_at`` (``None``: nothing to wait for)."""
    if received_at is None and joined_at is None:
        return True
    folded = session.execute(
        text("""
        SELECT count(*) FROM analysis_watermarks WHERE name IN (:rollups, :paths)
           AND received_upto >= COALESCE(:received, received_upto) AND joined_upto >= COALESCE(:joined, joined_upto)"""),
        {"rollups": WATERMARK_NAME, "paths": PATH_WATERMARK_NAME, "received": received_at, "joined": joined_at},
    ).scalar_one()
    return int(folded) == 2


def rebuild_path_estimates(session: Session, pairs: list[list[str]]) -> int:
    """Recompute the path estimates of ``pairs`` from their history up to their watermarks,
    under the refresh's lock (so no window is folded twice or missed); returns rows written."""
    session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
    watermark = _ensure_watermark(session, PATH_WATERMARK_NAME)
    written = paths.rebuild(session, pairs, watermark.received_upto, watermark.joined_upto)
    rebucket(session, [(uuid.UUID(str(pair[0])), uuid.UUID(str(pair[1]))) for pair in pairs])
    return written


def rollup_snapshot(session: Session, table: _Table = PATH_TABLE) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Every roll-up row's aggregates (histograms, where the table has them, unpacked to lists),
    for comparisons in tests."""
    snapshot: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in session.execute(text(f"SELECT * FROM {table.name}")):
        values = dict(row._mapping)
        for prefix in ("client", "server"):
            if f"{prefix}_hist" in values:
                values[f"{prefix}_hist"] = unpack_histogram(values.pop(f"{prefix}_hist_lo"), values[f"{prefix}_hist"]).tolist()
        values.pop("updated_at")
        snapshot[table.key(row)] = values
    return snapshot
