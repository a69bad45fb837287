"""Path calibration: the minimum RTT and the bottleneck bandwidth to an origin, from one larger transfer."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Optional

from . import wire
from ._fetch import FetchResult, fetch, object_url

log = logging.getLogger("iwprobe.agent")

#: Bytes fetched to calibrate a path (min RTT and bottleneck bandwidth).
DEFAULT_CALIBRATION_BYTES = 1_000_000


def estimate_bottleneck_bps(progress: Sequence[tuple[int, ...]], window_us: int) -> Optional[int]:
    """Highest rate over any span of at least ``window_us`` (two-pointer scan).

    ``progress`` holds ``(microseconds, cumulative bytes, ...)`` samples; with more than one
    byte count per sample, a span's rate is the lowest of their rates (see :func:`arrivals`).
    """
    best: Optional[float] = None
    start = 0
    for end in range(len(progress)):
        while start + 1 < end and progress[end][0] - progress[start + 1][0] >= window_us:
            start += 1
        span = progress[end][0] - progress[start][0]
        if span >= window_us and span > 0:
            moved = min(after - before for after, before in zip(progress[end][1:], progress[start][1:]))
            rate = moved * 8 * 1_000_000 / span
            best = rate if best is None or rate > best else best
    return int(best) if best is not None else None


def arrivals(result: FetchResult) -> list[tuple[int, ...]]:
    """``(microseconds, bytes read, payload bytes arrived)`` of a progress-recording fetch.

    Each count overshoots the link in its own way, so a span's rate is the lower of the two.
    Bytes the application read jump after a loss, when the retransmission releases the
    out-of-order queue in one read, and when a reader that fell behind reads a backlog (a
    1 Mbit/s, 1.5 %-loss path read at +54 %, an unloaded 100 Mbit/s, 5 ms one at +21 %).
    Segments the kernel received (``tcpi_data_segs_in`` times the receive MSS) follow the
    arrivals but count duplicates: behind a deep buffer the sender's RTO fires spuriously and
    resends what is still queued (+7 % on a 56 kbit/s modem with a 4.6 s buffer).
    """
    mss = result.tcp_info.get("rcv_mss") or 0
    if not mss:
        return [(t_us, read) for t_us, read, _ in result.progress]
    return [(t_us, read, segments * mss) for t_us, read, segments in result.progress]


#: Shortest span a calibration rate is taken over, whatever the RTT: over a few
#: milliseconds, scheduling (the reader's, a loaded emulator's) bunches arrivals.  A
#: transfer too fast to last four of them (16 MiB over a veth: ~7 ms) uses a quarter of its
#: duration instead.
MIN_RATE_SPAN_US = 50_000


#: A calibration transfer is long enough once it carries this many estimated BDPs.
CALIBRATION_BDPS = 4


def calibrate(
    probe_id: str,
    target: wire.ScheduleTarget,
    calibration_bytes: int,
    timeout_s: float = 120.0,
    max_bytes: int = wire.MAX_OBJECT_BYTES,
) -> Optional[wire.PathSample]:
    """Measure min RTT and bottleneck bandwidth to ``target`` with a larger transfer.

    ``tcpi_delivery_rate`` is a sender-side estimate (the rate the *sender's* data is
    delivered); on the probe, which only receives, it is meaningless, so the bottleneck is
    the highest rate of arriving data (:func:`arrivals`) over any span of at least two minimum
    RTTs and :data:`MIN_RATE_SPAN_US` (or a quarter of a shorter transfer).  That equals the
    bottleneck rate only once the transfer left slow start (window above the BDP).  While
    still in slow start that estimate B is about 3/4 of the last window per RTT and the
    transfer about two last windows, so ``size < CALIBRATION_BDPS * B * min_rtt``: the
    transfer is then repeated 4x larger (up to ``max_bytes``, the origin's object bound,
    and ``timeout_s`` overall).  A transfer covering 4 estimated BDPs gives the plateau
    rate.  If a larger transfer fails, the previous one is used.  The origin's own
    ``tcpi_delivery_rate`` of the same connections is in its observations.
    """
    if not target.arms:
        return None
    arm = max(target.arms, key=lambda a: a.iw)
    deadline = time.monotonic() + timeout_s
    size = min(calibration_bytes, max_bytes)
    best_rtt: Optional[int] = None
    good: Optional[FetchResult] = None
    while True:
        remaining = deadline - time.monotonic()
        result = fetch(object_url(target.host, arm.port, size), timeout_s=max(1.0, remaining), record_progress=True)
        if result.connect_us is None and good is None:
            log.warning("calibration of %s failed: %s %s", target.host, result.error_kind, result.error_detail)
            return None
        if result.error_kind is not None and good is not None:
            log.warning(
                "calibration transfer of %d bytes from %s failed (%s); keeping the previous one",
                size,
                target.host,
                result.error_kind,
            )
            result = good
            break
        rtts = [value for value in (result.connect_us, result.tcp_info.get("min_rtt") or None, best_rtt) if value]
        if not rtts:
            log.warning("calibration of %s failed: %s %s", target.host, result.error_kind, result.error_detail)
            return None
        best_rtt = int(min(rtts))
        duration_us = result.progress[-1][0] - result.progress[0][0] if result.progress else 0
        window_us = max(2 * best_rtt, min(MIN_RATE_SPAN_US, duration_us // 4))
        bottleneck = estimate_bottleneck_bps(arrivals(result), window_us) if result.error_kind is None else None
        long_enough = bottleneck is not None and size >= CALIBRATION_BDPS * bottleneck / 8 * best_rtt / 1e6
        elapsed_s = (result.total_us or 0) / 1e6
        good = result if result.error_kind is None else good
        if (
            result.error_kind is not None
            or long_enough
            or size >= max_bytes
            or time.monotonic() + 5 * max(elapsed_s, 0.1) > deadline
        ):
            break
        size = min(size * 4, max_bytes)
    if best_rtt is None:
        return None
    if bottleneck is not None and not long_enough:
        log.warning(
            "calibration of %s stopped at %d bytes, fewer than %d BDPs: the bandwidth is a lower bound",
            target.host,
            size,
            CALIBRATION_BDPS,
        )
    return wire.PathSample(
        sample_id=wire.new_id(),
        probe_id=probe_id,
        origin_id=target.origin_id,
        measured_at=result.started_at,
        min_rtt_us=best_rtt,
        bottleneck_bps=bottleneck,
        transfer_bytes=result.body_bytes if result.error_kind is None else 0,
        method="arrival_rate_max",
    )
