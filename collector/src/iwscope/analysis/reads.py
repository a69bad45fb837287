"""The reads every analysis function starts with: the per-path paired sums (from the analysis
copy when configured and usable, else PostgreSQL) and the bucket roll-ups of the filters,
overlapped on one connection (:func:`read`), and what is computed straight from them (group
sums and histograms, the paired estimate of a set of rows, the within-path interval)."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from sqlalchemy.orm import Session

from iwscope.analysis import pathcopy, readcache
from iwscope.analysis._types import FloatArray, IntArray
from iwscope.analysis.filters import Filters, without_cost
from iwscope.analysis.frames import Frame, PathFrame, load_buckets, load_path_detail, load_path_stats
from iwscope.analysis.paired import Cells, PairedEstimate, PathStats, path_estimate, within_path_interval
from iwscope.analysis.stats import Interval, merge_pieces, sum_by
from iwscope.config import get_settings
from iwscope.metrics import ANALYSIS_PATH_READS


def group_sum(values: FloatArray, groups: IntArray, n_groups: int) -> FloatArray:
    if n_groups == 0:
        return np.zeros(0)
    return sum_by(groups, values, n_groups)[:n_groups]


def histograms(frame: Frame, groups: IntArray, n_groups: int) -> IntArray:
    """Merged histograms per group (``groups`` has one entry per frame row; negative = ignored)."""
    return merge_pieces(groups[frame.piece_row], frame.piece_lo, frame.piece_len, frame.blob, n_groups)


#: Size-octave slots per path in a cell key (octaves -1 .. 34 fit).
SIZE_SLOTS = 64
_T = TypeVar("_T")


def copy_or_postgresql(from_copy: Callable[[pathlib.Path], _T | None], from_postgresql: Callable[[], _T]) -> _T:
    """A per-path read from the analysis copy when one is configured and usable (``pathcopy``),
    else from PostgreSQL; ``iwscope_analysis_path_reads_total`` counts which answered."""
    directory = get_settings().analysis_copy_dir
    found = None if directory is None else from_copy(directory)
    ANALYSIS_PATH_READS.labels("postgresql" if found is None else "copy").inc()
    return from_postgresql() if found is None else found


@dataclass
class Data:
    """What one analysis call read: per-path paired sums (``paths``) and bucket rows (arm
    statistics, histograms), and how to read per-path histograms of a few paths."""

    session: Session
    filters: Filters
    paths: PathFrame
    buckets: Frame
    #: The roll-ups' version the reads were made at (``readcache``; ``None``: not kept).
    version: readcache.Version | None = None

    def path_histograms(self, path_codes: IntArray) -> Frame:
        """Per-path roll-up rows with histograms of these paths (coded as in ``paths``)."""
        return self.start_path_histograms(path_codes)()

    def start_path_histograms(self, path_codes: IntArray) -> Callable[[], Frame]:
        """:meth:`path_histograms`, begun: with the analysis copy its DuckDB half runs in another
        thread while the caller goes on computing (the returned function waits for it); from
        PostgreSQL the read happens when the function is called (the session's one connection
        is the caller's)."""
        ids = [self.paths.path_ids[int(code)] for code in path_codes]
        arms = (self.filters.baseline_iw, self.filters.treatment_iw)
        key = ("detail", self.filters, arms, tuple(ids), path_codes.tobytes())
        kept: Frame | None = readcache.READS.get(self.version, key)
        if kept is not None:
            return lambda: kept
        directory = get_settings().analysis_copy_dir
        prepared = (
            None
            if directory is None
            else pathcopy.prepare_path_detail(self.session, directory, self.filters, arms, ids, _signatures_of(self.version))
        )
        pending = None if prepared is None else _COPY_READS.submit(prepared.run)

        def finish() -> Frame:
            found = None if pending is None else pending.result()
            ANALYSIS_PATH_READS.labels("postgresql" if found is None else "copy").inc()
            if prepared is None or found is None:
                detail = load_path_detail(self.session, self.filters, arms, ids)
            else:
                detail = prepared.frame(found)
            code_of = {path_id: int(code) for path_id, code in zip(ids, path_codes, strict=True)}
            detail.path = np.fromiter(
                (code_of[detail.path_ids[int(c)]] for c in detail.path.tolist()), dtype=np.int64, count=detail.size
            )
            return readcache.READS.put(self.version, key, detail)

        return finish


#: Threads that run the analysis copy's DuckDB half of a read beside the bucket roll-ups' query.
_COPY_READS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="iwscope-copy-read")


def read(session: Session, filters: Filters, all_arms: bool = False, by_size: bool = False) -> Data:
    """The per-path sums (from the analysis copy when configured and usable, see ``pathcopy``)
    and the bucket rows of ``filters``, on the session's one connection (an API request holds
    one database slot: one connection).  With the copy, its PostgreSQL half runs first; its
    DuckDB half then runs in another thread while this one reads the bucket roll-ups: the
    two largest reads of a figure overlap without a second connection.  Cost-experiment campaigns
    are left out unless ``filters.include_cost`` (:func:`~iwscope.analysis.filters.without_cost`)."""
    filters = without_cost(session, filters)
    arms = None if all_arms else (filters.baseline_iw, filters.treatment_iw)
    version = readcache.rollups_version(session)
    path_key = ("paths", filters, all_arms, by_size)
    paths: PathFrame | None = readcache.READS.get(version, path_key)
    if paths is not None:
        return Data(session, filters, paths, _bucket_rows(session, version, filters, arms), version)
    directory = get_settings().analysis_copy_dir
    prepared = (
        None
        if directory is None
        else pathcopy.prepare_path_stats(session, directory, filters, all_arms, by_size, _signatures_of(version))
    )
    if prepared is None:
        ANALYSIS_PATH_READS.labels("postgresql").inc()
        paths = load_path_stats(session, filters, all_arms, by_size)
        buckets = _bucket_rows(session, version, filters, arms)
    else:
        copy_columns = _COPY_READS.submit(prepared.run)
        try:
            buckets = _bucket_rows(session, version, filters, arms)
        finally:
            columns = copy_columns.result()
        ANALYSIS_PATH_READS.labels("postgresql" if columns is None else "copy").inc()
        paths = load_path_stats(session, filters, all_arms, by_size) if columns is None else prepared.frame(session, columns)
    return Data(session, filters, readcache.READS.put(version, path_key, paths), buckets, version)


def _signatures_of(version: readcache.Version | None) -> tuple[Any, ...] | None:
    return None if version is None else version.signatures


def _bucket_rows(session: Session, version: readcache.Version | None, filters: Filters, arms: tuple[int, int] | None) -> Frame:
    return readcache.READS.get_or_read(version, ("buckets", filters, arms), lambda: load_buckets(session, filters, arms))


def cached_buckets(session: Session, filters: Filters, arms: tuple[int, int] | None) -> Frame:
    """``load_buckets`` through the process's copy of recent reads (``readcache``)."""
    return _bucket_rows(session, readcache.rollups_version(session), filters, arms)


def data_within_path_interval(data: Data, paths: IntArray, sizes: IntArray | None) -> Interval | None:
    """The within-path interval of ``paths`` (fewer than MIN_CLUSTERS), from their cells'
    histograms (only size octaves ``sizes`` when given)."""
    detail = data.path_histograms(paths)
    filters = data.filters
    rows = (detail.arm == filters.baseline_iw) | (detail.arm == filters.treatment_iw)
    if sizes is not None:
        rows &= np.isin(detail.size_bucket, sizes)
    is_treat = detail.arm == filters.treatment_iw
    key = detail.path * SIZE_SLOTS + (detail.size_bucket + 1)
    cell_keys, cell = np.unique(key[rows], return_inverse=True)
    k = cell_keys.size
    n, sums_ms, treat = detail.n[rows], detail.sum_us[rows] / 1000.0, is_treat[rows]
    slot = np.full(detail.size, -1, dtype=np.int64)
    slot[rows] = cell * 2 + treat
    hists = histograms(detail, slot, 2 * k).reshape(k, 2, -1)
    cells = Cells(
        path=cell_keys // SIZE_SLOTS,
        n_base=sum_by(cell, n * ~treat, k),
        sum_base_ms=sum_by(cell, sums_ms * ~treat, k),
        n_treat=sum_by(cell, n * treat, k),
        sum_treat_ms=sum_by(cell, sums_ms * treat, k),
        hist_base=hists[:, 0],
        hist_treat=hists[:, 1],
    )
    return within_path_interval(cells)


def paired_estimate(data: Data, rows: IntArray) -> PairedEstimate:
    """The paired estimate of ``data.paths`` entries ``rows`` (summed per path)."""
    frame = data.paths
    codes, index = np.unique(frame.path[rows], return_inverse=True)
    k = codes.size
    n = sum_by(index, frame.n_pairs[rows], k)
    keep = n > 0
    stats = PathStats(
        path=codes[keep],
        n_pairs=n[keep],
        sum_diff_ms=sum_by(index, frame.sum_diff_ms[rows], k)[keep],
        sum_base_ms=sum_by(index, frame.sum_base_ms[rows], k)[keep],
    )
    sizes = frame.size_bucket[rows]
    wanted_sizes = None if (sizes.size == 0 or (sizes == -2).all()) else np.unique(sizes)
    return path_estimate(stats, lambda: data_within_path_interval(data, stats.path, wanted_sizes))
