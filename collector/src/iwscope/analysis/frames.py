"""Loading roll-up rows for the analysis functions: one SQL statement each, numpy columns out.

Two tables, two grains of detail (``rollups``):

* :func:`load_buckets` reads ``analysis_bucket_rollups``: one entry per (path signature, arm,
  size octave), where a signature is a combination of region and RTT / bandwidth / BDP / loss
  bucket (``signatures``).  Arm statistics, histograms, CDFs and percentiles come from here:
  the rows read grow with the buckets a figure draws, not with the fleet.
* :func:`load_path_stats` reads ``analysis_rollups`` (counts and sums per path, no histograms):
  the paired estimate's per-path sums, reduced in SQL;
* :func:`load_path_detail` reads the raw trials of a few paths: their histograms, for the
  within-path interval and the percentile intervals.

Both frames carry each entry's bucket indexes from the same ``analysis_signatures`` row, so a
bucket's histogram and its paired estimate count the same paths.
"""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
import numpy.typing as npt
from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.analysis import buckets as bk
from iwscope.analysis._types import FloatArray, IntArray
from iwscope.analysis.filters import Filters
from iwscope.analysis.models import NO_ORIGIN
from iwscope.analysis.rollups import WATERMARK_NAME, side_trials_sql
from iwscope.analysis.stats import sum_by
from iwscope.db import fetch_binary


@dataclass
class Frame:
    """Roll-up rows matching the filters, summed over days in SQL, as numpy columns.

    One entry per (unit, arm, size octave), the unit being a path (:func:`load_path_detail`) or a
    path signature (:func:`load_buckets`).  Histograms stay as the packed pieces of the rows:
    piece ``j`` belongs to entry ``piece_row[j]``, starts at bin ``piece_lo[j]`` and holds
    ``piece_len[j]`` int32 counts in ``blob``.
    """

    path: IntArray  # 0-based code of the unit: (probe_id, origin_id), or the signature
    arm: IntArray
    size_bucket: IntArray
    region: IntArray  # index into region_names
    region_names: list[str]
    rtt_bucket: IntArray  # bucket indexes of the path's signature; -1 = unknown
    bandwidth_bucket: IntArray
    bdp_bucket: IntArray
    loss_bucket: IntArray
    n_trials: FloatArray
    n: FloatArray
    sum_us: FloatArray
    sumsq: FloatArray
    retrans_n: FloatArray
    retrans_trials: FloatArray
    bytes_retrans: FloatArray
    bytes_sent: FloatArray
    piece_row: IntArray
    piece_lo: IntArray
    piece_len: IntArray
    blob: bytes
    #: (probe_id, origin_id) of each path code (path frames only).
    path_ids: list[tuple[uuid.UUID, uuid.UUID]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return int(self.arm.size)


def _month_start(day: dt.date) -> dt.date:
    return day.replace(day=1)


def _next_month(day: dt.date) -> dt.date:
    return (day.replace(day=28) + dt.timedelta(days=4)).replace(day=1)


@dataclass(frozen=True)
class DayWindow:
    """The filters' time range as the roll-ups read it: the whole UTC days ``[first_day,
    last_day]`` (an open end extends to 1970-01-01 / 9999-11-30); of them, the whole months
    ``[months_from, months_to)`` from month rows (``None``: no whole month), the others from
    day rows."""

    first_day: dt.date
    last_day: dt.date
    months_from: dt.date | None
    months_to: dt.date | None


def day_window(filters: Filters) -> DayWindow | None:
    """The filters' :class:`DayWindow`; ``None`` when neither end is set (all history)."""
    if filters.since is None and filters.until is None:
        return None
    first_day = filters.since.astimezone(dt.UTC).date() if filters.since else dt.date(1970, 1, 1)
    last_day = filters.until.astimezone(dt.UTC).date() if filters.until else dt.date(9999, 11, 30)
    months_from = first_day if first_day.day == 1 else _next_month(first_day)
    months_to = _month_start(last_day + dt.timedelta(days=1))
    if months_to <= months_from:
        return DayWindow(first_day, last_day, None, None)
    return DayWindow(first_day, last_day, months_from, months_to)


def _time_clause(filters: Filters, params: dict[str, Any], alias: str) -> str:
    """Month rows for the whole months inside the range, day rows for the days at its edges
    (:func:`day_window`)."""
    window = day_window(filters)
    if window is None:
        return f"{alias}.grain = 1"
    params.update(first_day=window.first_day, last_day=window.last_day)
    if window.months_from is None:
        return f"({alias}.grain = 0 AND {alias}.day BETWEEN :first_day AND :last_day)"
    params.update(months_from=window.months_from, months_to=window.months_to)
    return (
        f"(({alias}.grain = 1 AND {alias}.day >= :months_from AND {alias}.day < :months_to)"
        f" OR ({alias}.grain = 0 AND {alias}.day BETWEEN :first_day AND :last_day"
        f" AND NOT ({alias}.day >= :months_from AND {alias}.day < :months_to)))"
    )


def _where(filters: Filters, arms: Sequence[int] | None, alias: str, region_clause: str) -> tuple[str, dict[str, Any]]:
    clauses: list[str] = []
    params: dict[str, Any] = {}
    if filters.campaign_ids:
        clauses.append(f"{alias}.campaign_id = ANY(:campaign_ids)")
        params["campaign_ids"] = list(filters.campaign_ids)
    clauses.append(_time_clause(filters, params, alias))
    if filters.regions:
        clauses.append(region_clause)
        params["regions"] = list(filters.regions)
    if filters.size_min is not None or filters.size_max is not None:
        first, last = bk.size_buckets_overlapping(filters.size_min, filters.size_max)
        clauses.append(f"{alias}.size_bucket BETWEEN :size_first AND :size_last")
        params.update(size_first=first, size_last=last)
    if arms is not None:
        clauses.append(f"{alias}.arm_iw = ANY(:arms)")
        params["arms"] = list(arms)
    return (" AND ".join(clauses) or "TRUE"), params


def _sums(alias: str, metric: str) -> str:
    hist = f""",
               array_agg({alias}.{metric}_hist_lo) AS los, array_agg(length({alias}.{metric}_hist) / 4) AS lens,
               string_agg({alias}.{metric}_hist, ''::bytea) AS blob"""
    # The three histogram aggregates see a group's rows in the same order (one pass), so piece i
    # of ``los``/``lens`` describes the i-th piece of ``blob``; the order itself does not matter.
    # float8 sums: exact for counts and microsecond sums below 2^53, and several times faster
    # than PostgreSQL's numeric sum of bigints
    columns = (
        "n_trials",
        f"{metric}_n",
        f"{metric}_sum_us",
        f"{metric}_sumsq_us2",
        "retrans_n",
        "retrans_trials",
        "bytes_retrans",
        "bytes_sent",
    )
    names = ("n_trials", "n", "sum_us", "sumsq", "retrans_n", "retrans_trials", "bytes_retrans", "bytes_sent")
    return ", ".join(f"sum({alias}.{column}::float8) AS {name}" for column, name in zip(columns, names, strict=True)) + hist


#: Keeps the per-path rows of the paths in the filters' regions (their signature's region).
_PATH_IN_REGIONS = """(r.probe_id, r.origin_id) IN (
    SELECT ps.probe_id, ps.origin_id FROM analysis_path_signatures AS ps
    JOIN analysis_signatures AS rs ON rs.id = ps.signature_id WHERE rs.region = ANY(:regions))"""


def _path_ids(rows: Sequence[Any], code: int, ids: int) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """(probe_id, origin_id) per 0-based path code: ``row[code]`` is the code (a dense rank),
    ``row[ids]``, ``row[ids + 1]`` the ids."""
    path_ids = [(uuid.UUID(int=0), uuid.UUID(int=0))] * (max((row[code] for row in rows), default=-1) + 1)
    for row in rows:
        path_ids[row[code]] = (row[ids], row[ids + 1])
    return path_ids


#: Columns 0..13 of both loaders' rows are numbers, 14 the region, 15..17 the histogram pieces.
_NUMERIC = 14
#: The fleet table's "per day" counts the trials of this many UTC days, today the last.
WEEK_DAYS = 7
_OUT = """g.arm_iw, g.size_bucket,
          COALESCE(s.rtt_bucket, -1), COALESCE(s.bandwidth_bucket, -1), COALESCE(s.bdp_bucket, -1),
          COALESCE(s.loss_bucket, -1), g.n_trials::float8, g.n::float8, g.sum_us::float8, g.sumsq::float8,
          g.retrans_n::float8, g.retrans_trials::float8, g.bytes_retrans::float8, g.bytes_sent::float8"""


def load_path_detail(
    session: Session, filters: Filters, arms: Sequence[int], paths: Sequence[tuple[uuid.UUID, uuid.UUID]]
) -> Frame:
    """Per (path, arm, size octave) counts, sums and histograms of a few ``paths``, read from
    their raw trials: the trials the roll-ups hold (``rollups.side_trials_sql``) up to the
    roll-ups' watermark, in the filters' whole UTC days -- the same trials their bucket rows
    count.  The per-path roll-ups keep no histograms; the within-path interval (a handful of
    paths) and the percentile intervals (at most ``PERCENTILE_DETAIL_PATHS``) read them here.
    Each histogram bin is one piece of the frame."""
    client = filters.metric != "server"
    # the watermark as a value, not a sub-select: with an unknown bound the planner takes the
    # BRIN index on received_at / joined_at and reads most of the table
    upto = session.execute(
        text(f"SELECT {'received_upto' if client else 'joined_upto'} FROM analysis_watermarks WHERE name = :name"),
        {"name": WATERMARK_NAME},
    ).scalar()
    if upto is None or not paths:
        return detail_frame([()] * 13, [])
    with_origin = [(probe, origin) for probe, origin in paths if origin != NO_ORIGIN]
    params: dict[str, Any] = {
        "path_probes": [str(p) for p, _ in with_origin],
        "path_origins": [str(o) for _, o in with_origin],
        "null_probes": sorted({str(p) for p, o in paths if o == NO_ORIGIN}),
        "arms": list(arms),
        "upto": upto,
    }
    clauses = ["arm_iw = ANY(:arms)", f"{'received_at' if client else 'joined_at'} <= :upto"]
    window = day_window(filters)
    if window is not None:
        clauses.append(
            "started_at >= CAST(:first_day AS timestamp) AT TIME ZONE 'UTC'"
            " AND started_at < (CAST(:last_day AS timestamp) + interval '1 day') AT TIME ZONE 'UTC'"
        )
        params.update(first_day=window.first_day, last_day=window.last_day)
    # campaign and size octave on the roll-up key the selection computes
    keys = ["TRUE"]
    if filters.campaign_ids:
        keys.append("t.campaign_id = ANY(:campaign_ids)")
        params["campaign_ids"] = list(filters.campaign_ids)
    if filters.size_min is not None or filters.size_max is not None:
        first, last = bk.size_buckets_overlapping(filters.size_min, filters.size_max)
        keys.append("t.size_bucket BETWEEN :size_first AND :size_last")
        params.update(size_first=first, size_last=last)
    rest = " AND ".join(clauses)
    # each path's trials through the (probe_id, origin_id) index, one lookup per path (a join
    # with the pairs as a set is planned as a scan of the whole table; OFFSET 0 keeps the
    # lateral query from being flattened into one); trials without an origin, counted under the
    # nil UUID, apart and only when asked for.  ``path`` is the path's place in ``path_ids``.
    path_ids = [*with_origin, *((uuid.UUID(probe), NO_ORIGIN) for probe in params["null_probes"])]
    params["null_offset"] = len(with_origin)
    selection = (
        "SELECT t.*, k.path_no - 1 AS path"
        " FROM unnest(CAST(:path_probes AS uuid[]), CAST(:path_origins AS uuid[])) WITH ORDINALITY AS k(kp, ko, path_no)"
        f" CROSS JOIN LATERAL ({side_trials_sql(client, 'probe_id = k.kp AND origin_id = k.ko AND ' + rest)} OFFSET 0) AS t"
    )
    if params["null_probes"]:
        selection += (
            " UNION ALL SELECT n.*, array_position(CAST(:null_probes AS uuid[]), n.probe_id) - 1 + :null_offset FROM ("
            + side_trials_sql(client, "origin_id IS NULL AND probe_id = ANY(CAST(:null_probes AS uuid[])) AND " + rest)
            + ") AS n"
        )
    rows = session.execute(
        text(f"""
        WITH e AS (
            SELECT t.path, t.probe_id, t.origin_id, t.arm_iw, t.size_bucket, t.bin,
                   count(*)::float8 AS n_all, count(t.latency_us)::float8 AS n,
                   COALESCE(sum(t.latency_us::float8), 0) AS sum_us,
                   COALESCE(sum(t.latency_us::float8 * t.latency_us), 0) AS sumsq
            FROM ({selection}) AS t WHERE {" AND ".join(keys)}
            GROUP BY t.path, t.probe_id, t.origin_id, t.arm_iw, t.size_bucket, t.bin)
        SELECT e.path, e.arm_iw, e.size_bucket, COALESCE(s.rtt_bucket, -1), COALESCE(s.bandwidth_bucket, -1),
               COALESCE(s.bdp_bucket, -1), COALESCE(s.loss_bucket, -1), COALESCE(e.bin, -1),
               e.n_all, e.n, e.sum_us, e.sumsq, COALESCE(s.region, 'unknown')
        FROM e LEFT JOIN analysis_path_signatures AS ps ON ps.probe_id = e.probe_id AND ps.origin_id = e.origin_id
        LEFT JOIN analysis_signatures AS s ON s.id = ps.signature_id"""),
        params,
    ).all()
    return detail_frame(list(zip(*rows, strict=True)) if rows else [()] * 13, path_ids)


def detail_frame(columns: Sequence[Sequence[Any]], path_ids: Sequence[tuple[uuid.UUID, uuid.UUID]]) -> Frame:
    """One entry per (path, arm, size octave) of ``load_path_detail``'s rows (one per histogram
    bin), given as 13 columns: 0-7 integers (path, arm, size, four buckets, bin or -1), 8-11
    sums (n_all, n, sum_us, sumsq), 12 the region."""
    count = len(columns[0])
    ints = np.array(columns[:8], dtype=np.int64).reshape(8, count)
    sums = np.array(columns[8:12], dtype=np.float64).reshape(4, count)
    path, arm, size = ints[0], ints[1], ints[2]
    # (path, arm, size octave) as one integer: arms below 2^15, octaves -1..62
    keys, first, entry = np.unique((path << 22) | ((arm & 0x7FFF) << 7) | (size + 1), return_index=True, return_inverse=True)
    n_entries = keys.size
    region_codes: dict[str, int] = {}
    region = np.fromiter(
        (region_codes.setdefault(columns[12][i], len(region_codes)) for i in first.tolist()), dtype=np.int64, count=n_entries
    )
    piece = (ints[7] >= 0) & (sums[1] > 0)

    def total(column: int) -> FloatArray:
        return sum_by(entry, sums[column], n_entries)

    zeros = np.zeros(n_entries, dtype=np.float64)
    return Frame(
        path=path[first],
        arm=arm[first],
        size_bucket=size[first],
        region=region,
        region_names=list(region_codes),
        rtt_bucket=ints[3][first],
        bandwidth_bucket=ints[4][first],
        bdp_bucket=ints[5][first],
        loss_bucket=ints[6][first],
        n_trials=total(0),
        n=total(1),
        sum_us=total(2),
        sumsq=total(3),
        retrans_n=zeros,
        retrans_trials=zeros,
        bytes_retrans=zeros,
        bytes_sent=zeros,
        piece_row=entry[piece],
        piece_lo=ints[7][piece],
        piece_len=np.ones(int(piece.sum()), dtype=np.int64),
        blob=sums[1][piece].astype("<i4").tobytes(),
        path_ids=list(path_ids),
    )


class PathIds(Sequence[tuple[uuid.UUID, uuid.UUID]]):
    """(probe_id, origin_id) per path code, kept as text and parsed when read: a fleet has
    20,000 paths (about 50 ms to parse them all) and a figure reads the ids of a few hundred."""

    def __init__(self, probe_ids: Sequence[str], origin_ids: Sequence[str], mix: npt.NDArray[np.uint64] | None = None) -> None:
        self._probe_ids, self._origin_ids, self._mix = probe_ids, origin_ids, mix

    def __len__(self) -> int:
        return len(self._probe_ids)

    @overload
    def __getitem__(self, code: int) -> tuple[uuid.UUID, uuid.UUID]: ...
    @overload
    def __getitem__(self, code: slice) -> list[tuple[uuid.UUID, uuid.UUID]]: ...
    def __getitem__(self, code: int | slice) -> tuple[uuid.UUID, uuid.UUID] | list[tuple[uuid.UUID, uuid.UUID]]:
        if isinstance(code, slice):
            return [self[index] for index in range(*code.indices(len(self)))]
        return uuid.UUID(str(self._probe_ids[code])), uuid.UUID(str(self._origin_ids[code]))

    def order_keys(self, codes: IntArray) -> npt.NDArray[np.uint64]:
        """The paths' places in a fixed pseudo-random order: the XOR of the high 64 bits of
        their two (random) UUIDs, as the analysis copy computes them (``pathcopy.mix_sql``,
        which a reader may pass in as ``mix``) -- without building the UUIDs."""
        if self._mix is not None:
            return self._mix[codes]
        probes, origins = self._probe_ids, self._origin_ids
        return np.fromiter(
            (
                int(str(probes[code]).replace("-", "")[:16], 16) ^ int(str(origins[code]).replace("-", "")[:16], 16)
                for code in codes.tolist()
            ),
            dtype=np.uint64,
            count=codes.size,
        )


@dataclass
class PathFrame:
    """The paired estimator's per-path sums (``paired.cell_path_stats``), reduced in SQL: one
    entry per path (or per path and size octave, ``by_size``) holding both arms."""

    path: IntArray  # 0-based code of (probe_id, origin_id)
    probe: IntArray  # 0-based code of probe_id
    size_bucket: IntArray  # -2 when not by size
    region: IntArray
    region_names: list[str]
    rtt_bucket: IntArray
    bandwidth_bucket: IntArray
    bdp_bucket: IntArray
    loss_bucket: IntArray
    n_trials: FloatArray  # every trial of the entry (all arms when ``arms`` was None)
    n_pairs: FloatArray  # sum over (path, size) cells of min(n_base, n_treat)
    sum_diff_ms: FloatArray  # sum of w x (mean_base - mean_treat)
    sum_base_ms: FloatArray  # sum of w x mean_base
    path_ids: PathIds = field(default_factory=lambda: PathIds([], []))

    @property
    def size(self) -> int:
        return int(self.path.size)


def load_path_stats(session: Session, filters: Filters, all_arms: bool, by_size: bool) -> PathFrame:
    """Per path (and size octave when ``by_size``): trials, and the stratified pairs' sums of the
    filters' baseline vs treatment arm, computed in SQL from the per-path roll-ups (only the
    sums travel, not the rows).  ``all_arms``: count the trials of every arm (the arms filter
    is not applied)."""
    metric = "server" if filters.metric == "server" else "client"
    arms = None if all_arms else (filters.baseline_iw, filters.treatment_iw)
    where, params = _where(filters, arms, "r", _PATH_IN_REGIONS)
    params.update(base=filters.baseline_iw, treat=filters.treatment_iw)
    size_out = "w.size_bucket" if by_size else "-2"
    rows = session.execute(
        text(f"""
        WITH c AS (
            SELECT r.probe_id, r.origin_id, r.size_bucket, sum(r.n_trials::float8) AS n_trials,
                   sum(r.{metric}_n::float8) FILTER (WHERE r.arm_iw = :base) AS nb,
                   sum(r.{metric}_sum_us::float8) FILTER (WHERE r.arm_iw = :base) / 1000.0 AS sb,
                   sum(r.{metric}_n::float8) FILTER (WHERE r.arm_iw = :treat) AS nt,
                   sum(r.{metric}_sum_us::float8) FILTER (WHERE r.arm_iw = :treat) / 1000.0 AS st
            FROM analysis_rollups AS r WHERE {where}
            GROUP BY r.probe_id, r.origin_id, r.size_bucket),
        w AS (
            SELECT c.*, CASE WHEN c.nb > 0 AND c.nt > 0 THEN least(c.nb, c.nt) ELSE 0 END AS w FROM c),
        g AS (
            SELECT w.probe_id, w.origin_id, {size_out} AS size_bucket,
                   sum(w.n_trials) AS n_trials, sum(w.w) AS n_pairs,
                   COALESCE(sum(w.w * (w.sb / w.nb - w.st / w.nt)) FILTER (WHERE w.w > 0), 0) AS sum_diff_ms,
                   COALESCE(sum(w.w * w.sb / w.nb) FILTER (WHERE w.w > 0), 0) AS sum_base_ms
            FROM w GROUP BY 1, 2, 3)
        SELECT dense_rank() OVER (ORDER BY g.probe_id, g.origin_id) - 1, dense_rank() OVER (ORDER BY g.probe_id) - 1,
               g.size_bucket, COALESCE(s.rtt_bucket, -1), COALESCE(s.bandwidth_bucket, -1),
               COALESCE(s.bdp_bucket, -1), COALESCE(s.loss_bucket, -1),
               g.n_trials, g.n_pairs, g.sum_diff_ms, g.sum_base_ms,
               COALESCE(s.region, p.region, 'unknown'), g.probe_id, g.origin_id
        FROM g LEFT JOIN analysis_path_signatures AS ps ON ps.probe_id = g.probe_id AND ps.origin_id = g.origin_id
        LEFT JOIN analysis_signatures AS s ON s.id = ps.signature_id
        LEFT JOIN probes AS p ON p.id = g.probe_id"""),
        params,
    ).all()
    return path_frame(rows)


def path_frame(rows: Sequence[Any]) -> PathFrame:
    """A :class:`PathFrame` of rows ``(path code, probe code, size octave, rtt, bandwidth, bdp,
    loss bucket, n_trials, n_pairs, sum_diff_ms, sum_base_ms, region, probe_id, origin_id)``,
    the codes dense ranks of (probe_id, origin_id) and of probe_id."""
    count = len(rows)
    numeric = np.array([row[:11] for row in rows], dtype=np.float64) if count else np.zeros((0, 11))
    ints = numeric[:, :7].astype(np.int64)
    region_codes: dict[str, int] = {}
    region = np.fromiter((region_codes.setdefault(row[11], len(region_codes)) for row in rows), dtype=np.int64, count=count)
    ids = _path_ids(rows, 0, 12)
    path_ids = PathIds([str(probe) for probe, _ in ids], [str(origin) for _, origin in ids])
    return PathFrame(
        path=ints[:, 0],
        probe=ints[:, 1],
        size_bucket=ints[:, 2],
        region=region,
        region_names=list(region_codes),
        rtt_bucket=ints[:, 3],
        bandwidth_bucket=ints[:, 4],
        bdp_bucket=ints[:, 5],
        loss_bucket=ints[:, 6],
        n_trials=numeric[:, 7],
        n_pairs=numeric[:, 8],
        sum_diff_ms=numeric[:, 9],
        sum_base_ms=numeric[:, 10],
        path_ids=path_ids,
    )


def load_probe_totals(session: Session, today: dt.date) -> dict[str, tuple[int, int, int]]:
    """Per probe with trials (its id as text): trials, failed trials (whole history) and trials
    on the 7 UTC days ending with ``today`` (a day a skewed clock put later is not this week's),
    from the per-path roll-ups."""
    return {
        str(row[0]): (int(row[1] or 0), int(row[2] or 0), int(row[3] or 0))
        for row in session.execute(
            text("""
        SELECT r.probe_id, sum(r.n_trials) FILTER (WHERE r.grain = 1), sum(r.n_errors) FILTER (WHERE r.grain = 1),
               sum(r.n_trials) FILTER (WHERE r.grain = 0)
        FROM analysis_rollups AS r
        WHERE r.grain = 1 OR (r.grain = 0 AND r.day > :week_start AND r.day <= :today)
        GROUP BY r.probe_id"""),
            {"week_start": today - dt.timedelta(days=WEEK_DAYS), "today": today},
        )
    }


def load_buckets(session: Session, filters: Filters, arms: Sequence[int] | None) -> Frame:
    """Bucket roll-up rows matching the filters, one entry per (signature, arm, size octave)."""
    metric = "server" if filters.metric == "server" else "client"
    where, params = _where(filters, arms, "b", "s.region = ANY(:regions)")
    rows = fetch_binary(
        session,
        f"""
        WITH g AS (
            SELECT b.signature_id, b.arm_iw, b.size_bucket, {_sums("b", metric)}
            FROM analysis_bucket_rollups AS b JOIN analysis_signatures AS s ON s.id = b.signature_id
            WHERE {where}
            GROUP BY b.signature_id, b.arm_iw, b.size_bucket)
        SELECT {_OUT}, s.region, g.los, g.lens, g.blob, g.signature_id
        FROM g JOIN analysis_signatures AS s ON s.id = g.signature_id""",
        params,
    )
    frame = _frame(rows)
    frame.path = np.fromiter((row[18] for row in rows), dtype=np.int64, count=len(rows))
    return frame


def _frame(rows: Sequence[Any]) -> Frame:
    count = len(rows)
    numeric = np.array([row[:_NUMERIC] for row in rows], dtype=np.float64) if count else np.zeros((0, _NUMERIC))
    region_codes: dict[str, int] = {}
    region = np.fromiter((region_codes.setdefault(row[14], len(region_codes)) for row in rows), dtype=np.int64, count=count)
    if count:
        piece_counts = np.fromiter((len(row[15]) for row in rows), dtype=np.int64, count=count)
        piece_lo = np.fromiter(itertools.chain.from_iterable(row[15] for row in rows), dtype=np.int64)
        piece_len = np.fromiter(itertools.chain.from_iterable(row[16] for row in rows), dtype=np.int64)
        piece_row = np.repeat(np.arange(count, dtype=np.int64), piece_counts)
        blob = b"".join(bytes(row[17]) for row in rows if row[17])
    else:
        piece_lo = piece_len = piece_row = np.zeros(0, dtype=np.int64)
        blob = b""
    ints = numeric[:, :6].astype(np.int64)
    empty = np.zeros(count, dtype=np.int64)
    return Frame(
        path=empty,
        arm=ints[:, 0],
        size_bucket=ints[:, 1],
        region=region,
        region_names=list(region_codes),
        rtt_bucket=ints[:, 2],
        bandwidth_bucket=ints[:, 3],
        bdp_bucket=ints[:, 4],
        loss_bucket=ints[:, 5],
        n_trials=numeric[:, 6],
        n=numeric[:, 7],
        sum_us=numeric[:, 8],
        sumsq=numeric[:, 9],
        retrans_n=numeric[:, 10],
        retrans_trials=numeric[:, 11],
        bytes_retrans=numeric[:, 12],
        bytes_sent=numeric[:, 13],
        piece_row=piece_row,
        piece_lo=piece_lo,
        piece_len=piece_len,
        blob=blob,
    )
