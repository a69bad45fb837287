"""The model beside every measurement: per path and per RTT bucket, what the model with loss
(:func:`iwscope.model.predict_with_loss`) predicts from the path's own estimates, beside the
measured improvement, the residual, and the paths that stand out ("odd") with what their own
measurements say might explain it.

At most the newest :data:`MAX_TRIALS` trials are read (``truncated`` says when more match) and
the model runs for the :data:`MAX_MODELLED_PATHS` paths with most trials (the others say so):
narrow the filters (a campaign, a region, days) for the rest.

**Measured** -- the paired improvement of the treatment arm over the baseline
(:mod:`~iwscope.analysis.paired`: trials matched on path, round and size; baseline - treatment,
positive = the treatment is faster) with its 95 % interval, per path (the pairs' own spread:
an interval about that path) and per RTT bucket (paths resampled whole from five paths on),
and each arm's mean latency with its t interval.  Plain arms, short flows, no failed fetch;
the metric is ``Filters.metric`` (the origin's response latency, or the probe's total).

**Predicted** -- for every path with at least :data:`~iwscope.analysis.paired.MIN_PAIRS`
pairs, a Monte-Carlo of :data:`MODEL_SAMPLES` simulated connections per arm over the path's
own pair sizes (at most :data:`MODEL_SIZES` of them, evenly spaced in size order), both arms
on the same seed and sizes so that their difference is paired too, from:

* round-trip propagation = the path's ``min_rtt_us`` (``path_estimates``; the probe's smallest
  RTT sample, which includes a small packet's serialisation);
* bottleneck = the path's ``bottleneck_bps`` (the 90th percentile of recent delivery-rate
  samples); none known: no rate limit, and the path says so;
* random loss = the baseline arm's retransmitted bytes / bytes sent on that path in the
  filtered trials (the treatment's own bursts can add losses at a shallow buffer, which is
  what the comparison should reveal, not absorb), the same in both directions;
* the client's receive window = the median ``peer_rwnd`` of the origin's observations, in
  segments of the path's MSS (:data:`~iwscope.model.DEFAULT_MSS` when unknown); none: no cap;
* the origin's congestion control (``cc``, default CUBIC, Linux's; the origin does not report
  its own).

The predicted improvement's interval is the Monte-Carlo's own (mean of the paired simulated
differences +- 1.96 standard errors): it says how precisely the model was evaluated, not how
right it is.  Per bucket, the prediction (and the baseline latency it is relative to) is the pair-weighted
mean of its paths' predictions, set beside the bucket's paired estimate over all its paths'
pairs, and it agrees by a path's rule.

**Residual and "odd"** -- residual = measured - predicted improvement.  A path *agrees* when
its measured interval, widened by the prediction's, holds the prediction, or the residual is
within :data:`ODD_SHARE` of the baseline's predicted latency.  A path is *odd* when it does
not agree, or when either arm's measured mean is more than :data:`ODD_SHARE` and
:data:`ODD_FLOOR_MS` off the model's with its interval excluding the model's.  Each odd path
lists what its trials show (:func:`_explanations`): the client's receive window below the treatment's IW or trials the
origin found receive-window limited; the origin's min RTT far below the probe's (a
TCP-terminating proxy or cache answers the probe); the treatment arm retransmitting in more
trials than the baseline (Wilson intervals apart) -- a shallow buffer when the origin's
smoothed RTT grew on those trials (the burst queued), a policer when it did not; more
retransmitting trials than the estimated random loss gives; no bandwidth estimate.  With
none of these: "unexplained: inspect a trial's packets".
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.analysis import buckets as bk
from iwscope.analysis.filters import Filters, trial_where, without_cost
from iwscope.analysis.modelfit_results import ArmFit, BucketModelFit, Interval, ModelFit, PathInputs, PathModelFit
from iwscope.analysis.paired import Pairs, make_pairs, paired_estimate
from iwscope.analysis.stats import Interval as StatsInterval
from iwscope.analysis.stats import mean_interval, proportion_interval, weighted_mean_interval
from iwscope.model import DEFAULT_MSS, CongestionControl, congestion_control, predict_with_loss

#: Newest trials read (a larger selection is cut there and says so: ``ModelFit.truncated``).
MAX_TRIALS = 200_000
#: Paths the model runs for (those with most trials; 0.25 s a lossy path, 0.06 s a loss-free one).
MAX_MODELLED_PATHS = 40
#: Simulated connections per arm and path.
MODEL_SAMPLES = 800
#: Most sizes of a path's pairs the model is run over (evenly spaced in size order).
MODEL_SIZES = 200
#: A path is odd beyond this share of the baseline's predicted latency (the reproduction's
#: threshold for lossy points).
ODD_SHARE = 0.15
#: ... and by more than this (ms): both arms of make demo's 5-15 ms paths sit 5-7 ms above the
#: model (the endpoints' own processing, in both arms alike), which is no IW matter.
ODD_FLOOR_MS = 10.0
#: Fewest retransmitting trials of an arm before "more loss than random" is said.
MIN_RETRANS_TRIALS = 3
#: The origin's min RTT below this share of the probe's: something closer answers the probe.
PROXY_RTT_SHARE = 0.5
#: The origin's smoothed RTT over its min RTT on retransmitting trials, above which the losses
#: came after queueing (a shallow buffer) rather than without it (a policer).
QUEUEING_RATIO = 1.2
#: A receive-window-limited share of trials worth naming.
RWND_LIMITED_SHARE = 0.2

_ROWS = """
    SELECT t.probe_id::text, p.name, p.region, t.origin_id::text, t.round, t.object_size, t.arm_iw,
           {latency} AS latency_us, coalesce(t.server_total_retrans, 0) AS retrans,
           t.server_bytes_retrans, t.server_bytes_sent, t.tcpi_min_rtt_us, t.tcpi_rcv_mss,
           coalesce(t.rwnd_limited, false), o.peer_rwnd, o.tcpi_min_rtt_us, o.tcpi_rtt_us,
           e.min_rtt_us, e.bottleneck_bps
      FROM trials t JOIN probes p ON p.id = t.probe_id
      LEFT JOIN origin_observations o ON o.trial_id = t.trial_id
      LEFT JOIN path_estimates e ON e.probe_id = t.probe_id AND e.origin_id = t.origin_id
     WHERE {where} AND t.error_kind IS NULL AND t.role = 'short' AND t.arm IS NULL
       AND t.origin_id IS NOT NULL AND t.arm_iw IN (:base, :treat) AND {latency} IS NOT NULL
     ORDER BY t.started_at DESC
     LIMIT :max_trials"""


@dataclass(frozen=True)
class ModelTrials:
    """What :func:`fit_model` works on: the filters (cost campaigns left out) and the newest
    ``MAX_TRIALS + 1`` joined trials of the two arms (one more than used: "truncated")."""

    filters: Filters
    rows: Sequence[Any]


def model_fit(session: Session, filters: Filters, cc: CongestionControl = "cubic") -> ModelFit:
    """Per path and RTT bucket: measured improvement beside the model's (module docstring)."""
    return fit_model(read_model_trials(session, filters), cc)


def read_model_trials(session: Session, filters: Filters) -> ModelTrials:
    """The database half of :func:`model_fit` (the API reads within a database slot, then runs
    the model's CPU-bound half, :func:`fit_model`, without holding one)."""
    filters = without_cost(session, filters)
    latency = "t.server_latency_us" if filters.metric == "server" else "t.total_us"
    where, params = trial_where(filters)
    rows = session.execute(
        text(_ROWS.format(latency=latency, where=where)),
        {**params, "base": filters.baseline_iw, "treat": filters.treatment_iw, "max_trials": MAX_TRIALS + 1},
    ).all()
    return ModelTrials(filters, rows)


def fit_model(trials: ModelTrials, cc: CongestionControl = "cubic") -> ModelFit:
    """The model's half of :func:`model_fit`: no database."""
    filters, rows = trials.filters, trials.rows
    truncated = len(rows) > MAX_TRIALS
    by_path: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for row in rows[:MAX_TRIALS]:
        by_path[(row[0], row[3])].append(row)
    # The model runs for the paths with the most trials first, up to MAX_MODELLED_PATHS.
    ranked = sorted(by_path, key=lambda key: -len(by_path[key]))
    modelled = set(ranked[:MAX_MODELLED_PATHS])
    paths = [_fit_path(trials, filters, cc, key in modelled) for key, trials in by_path.items()]
    paths.sort(key=lambda path: (path.bucket_order, path.region, path.probe_name))
    buckets = [
        _fit_bucket(order, [path for path, _ in members], [pairs for _, pairs in members])
        for order, members in _bucket_members(by_path, paths, filters)
    ]
    return ModelFit(
        baseline_iw=filters.baseline_iw,
        treatment_iw=filters.treatment_iw,
        metric=filters.metric,
        cc=cc,
        model_samples=MODEL_SAMPLES,
        paths=paths,
        buckets=buckets,
        odd_paths=sum(path.odd for path in paths),
        trials_read=min(len(rows), MAX_TRIALS),
        truncated=truncated,
    )


def _pairs_of(trials: Sequence[Any], filters: Filters, path_code: int = 0) -> Pairs:
    return make_pairs(
        np.full(len(trials), path_code),
        [row[4] for row in trials],
        [row[5] for row in trials],
        [row[6] == filters.treatment_iw for row in trials],
        [row[7] / 1000.0 for row in trials],
    )


def _bucket_members(
    by_path: dict[tuple[str, str], list[Any]], paths: list[PathModelFit], filters: Filters
) -> list[tuple[int, list[tuple[PathModelFit, Pairs]]]]:
    fitted = {(path.probe_id, path.origin_id): path for path in paths}
    members: dict[int, list[tuple[PathModelFit, Pairs]]] = defaultdict(list)
    for code, (key, trials) in enumerate(by_path.items()):
        path = fitted[key]
        members[path.bucket_order].append((path, _pairs_of(trials, filters, code)))
    return sorted(members.items())


def _fit_path(trials: list[Any], filters: Filters, cc: CongestionControl, modelled: bool = True) -> PathModelFit:
    first = trials[0]
    pairs = _pairs_of(trials, filters)
    measured = paired_estimate(pairs)
    inputs = _inputs(trials, filters, cc)
    order = int(bk.rtt_index(np.asarray([inputs.min_rtt_ms * 1000.0]))[0]) if inputs else len(bk.RTT_BUCKETS) - 1
    label = bk.RTT_BUCKETS[order].label
    too_small = measured.too_small
    reason = measured.reason if too_small else None
    if inputs is None:
        reason = "no RTT estimate for this path"
    elif not modelled and not too_small:
        reason = f"not modelled: more than {MAX_MODELLED_PATHS} paths match (the model runs for those with most trials)"
    prediction = None if too_small or inputs is None or not modelled else _predict(inputs, pairs, filters)
    arms = _arms(trials, filters, prediction)
    predicted_ms = predicted_ci = predicted_pct = residual = predicted_base = None
    agrees: bool | None = None
    odd = False
    explanations: list[str] = []
    if prediction is not None and measured.estimate_ms is not None:
        predicted_ms, half, base_ms = prediction.improvement_ms, prediction.half_width_ms, prediction.base_ms[0]
        predicted_ci = (predicted_ms - half, predicted_ms + half)
        predicted_pct = 100.0 * predicted_ms / base_ms if base_ms > 0 else None
        predicted_base = base_ms
        residual = measured.estimate_ms - predicted_ms
        agrees = _agrees(measured.estimate_ms, _ms(measured.interval), predicted_ms, half, base_ms)
        arm_off = any(_arm_off(arm) for arm in arms)
        odd = not agrees or arm_off
        if odd:
            explanations = _explanations(trials, filters, inputs, arms, prediction) if inputs else []
    return PathModelFit(
        probe_id=first[0],
        probe_name=first[1],
        region=first[2],
        origin_id=first[3],
        bucket=label,
        bucket_order=order,
        inputs=inputs,
        n_pairs=measured.n_pairs,
        measured_ms=measured.estimate_ms,
        measured_ci_ms=_ms(measured.interval),
        measured_pct=measured.pct,
        predicted_ms=predicted_ms,
        predicted_ci_ms=predicted_ci,
        predicted_pct=predicted_pct,
        predicted_baseline_ms=predicted_base,
        residual_ms=residual,
        arms=arms,
        too_small=too_small or inputs is None or not modelled,
        reason=reason,
        agrees=agrees,
        odd=odd,
        explanations=explanations,
    )


def _agrees(measured_ms: float, interval: Interval | None, predicted_ms: float, half_ms: float, base_ms: float) -> bool:
    """The one verdict of a path and of a bucket: the measured interval, widened by the
    prediction's own half-width, holds the prediction, or the residual is within ODD_SHARE of
    the predicted baseline latency (no interval: the measured value stands for it)."""
    low, high = interval or (measured_ms, measured_ms)
    return low - half_ms <= predicted_ms <= high + half_ms or abs(measured_ms - predicted_ms) <= ODD_SHARE * base_ms


def _ms(interval: StatsInterval | None) -> Interval | None:
    return None if interval is None else (interval.abs_low, interval.abs_high)


def _arm_off(arm: ArmFit) -> bool:
    if arm.gap is None or arm.measured_ci_ms is None or arm.predicted_mean_ms is None or arm.measured_mean_ms is None:
        return False
    low, high = arm.measured_ci_ms
    off_ms = abs(arm.measured_mean_ms - arm.predicted_mean_ms)
    return abs(arm.gap) > ODD_SHARE and off_ms > ODD_FLOOR_MS and not low <= arm.predicted_mean_ms <= high


def _inputs(trials: Sequence[Any], filters: Filters, cc: CongestionControl) -> PathInputs | None:
    estimated_rtt_us = trials[0][17]
    if estimated_rtt_us is None:
        client_rtts = [row[11] for row in trials if row[11]]
        estimated_rtt_us = min(client_rtts) if client_rtts else None
    if not estimated_rtt_us:
        return None
    baseline = [row for row in trials if row[6] == filters.baseline_iw and row[10]]
    sent = sum(row[10] for row in baseline)
    loss = min(0.5, sum(row[9] or 0 for row in baseline) / sent) if sent else 0.0
    mss_values = [row[12] for row in trials if row[12]]
    mss = int(statistics.median(mss_values)) if mss_values else DEFAULT_MSS
    rwnds = [row[14] for row in trials if row[14]]
    rwnd_segments = max(1, int(statistics.median(rwnds)) // mss) if rwnds else None
    bps = trials[0][18]
    return PathInputs(
        min_rtt_ms=estimated_rtt_us / 1000.0,
        bottleneck_bps=float(bps) if bps else None,
        loss=loss,
        rwnd_segments=rwnd_segments,
        mss=mss,
        cc=cc,
    )


@dataclass(frozen=True)
class _Prediction:
    improvement_ms: float
    half_width_ms: float
    #: Mean latency (ms) and retransmitting share of the baseline, then the treatment.
    base_ms: tuple[float, float]
    treat_ms: tuple[float, float]


def _model_sizes(pair_sizes: Sequence[int]) -> tuple[int, ...]:
    ordered = sorted(int(size) for size in pair_sizes)
    if len(ordered) <= MODEL_SIZES:
        return tuple(ordered)
    step = len(ordered) / MODEL_SIZES
    return tuple(ordered[int((index + 0.5) * step)] for index in range(MODEL_SIZES))


def _predict(inputs: PathInputs, pairs: Pairs, filters: Filters) -> _Prediction:
    sizes = _model_sizes(pairs.size.tolist())
    # Rounded so that paths alike share one evaluation (the cache): 0.1 ms, 3 digits, 0.01 %.
    key = (
        round(inputs.min_rtt_ms, 1),
        None if inputs.bottleneck_bps is None else float(f"{inputs.bottleneck_bps:.3g}"),
        round(inputs.loss, 4),
        inputs.rwnd_segments,
        inputs.mss,
        inputs.cc,
        sizes,
        filters.metric,
    )
    return _evaluate(*key, filters.baseline_iw, filters.treatment_iw)


@lru_cache(maxsize=4096)
def _evaluate(
    rtt_ms: float,
    bps: float | None,
    loss: float,
    rwnd_segments: int | None,
    mss: int,
    cc: str,
    sizes: tuple[int, ...],
    metric: str,
    base_iw: int,
    treat_iw: int,
) -> _Prediction:
    samples = max(MODEL_SAMPLES, len(sizes))
    results = []
    for iw in (base_iw, treat_iw):
        results.append(
            predict_with_loss(
                list(sizes),
                iw,
                rtt_ms / 1000.0,
                bps,
                loss,
                mss=mss,
                rwnd_segments=rwnd_segments,
                cc=congestion_control(cc),
                samples=samples,
                seed=0,
                keep_samples=True,
            )
        )
    values = [
        np.asarray([(t.server_latency_s if metric == "server" else t.client_total_s) * 1000.0 for t in result.trials])
        for result in results
    ]
    diff = values[0] - values[1]
    half = 1.96 * float(diff.std(ddof=1)) / math.sqrt(diff.size) if diff.size > 1 else 0.0
    return _Prediction(
        improvement_ms=float(diff.mean()),
        half_width_ms=half,
        base_ms=(float(values[0].mean()), results[0].p_server_retrans),
        treat_ms=(float(values[1].mean()), results[1].p_server_retrans),
    )


def _arms(trials: Sequence[Any], filters: Filters, prediction: _Prediction | None) -> list[ArmFit]:
    arms = []
    for iw, predicted in (
        (filters.baseline_iw, prediction and prediction.base_ms),
        (filters.treatment_iw, prediction and prediction.treat_ms),
    ):
        of_arm = [row for row in trials if row[6] == iw]
        latencies = [row[7] / 1000.0 for row in of_arm]
        mean = statistics.fmean(latencies) if latencies else None
        retrans = sum(row[8] > 0 for row in of_arm)
        arms.append(
            ArmFit(
                iw=iw,
                n=len(of_arm),
                measured_mean_ms=mean,
                measured_ci_ms=mean_interval(latencies),
                predicted_mean_ms=predicted[0] if predicted else None,
                gap=mean / predicted[0] - 1.0 if predicted and mean is not None and predicted[0] > 0 else None,
                retrans_share=retrans / len(of_arm) if of_arm else None,
                retrans_ci=proportion_interval(retrans, len(of_arm)) if of_arm else None,
                predicted_retrans_share=predicted[1] if predicted else None,
            )
        )
    return arms


def _explanations(
    trials: Sequence[Any], filters: Filters, inputs: PathInputs, arms: list[ArmFit], prediction: _Prediction
) -> list[str]:
    """What the odd path's own trials show that the model leaves out (module docstring)."""
    found = []
    if inputs.rwnd_segments is not None and inputs.rwnd_segments < filters.treatment_iw:
        found.append(f"receive window: the client advertised {inputs.rwnd_segments} segments, below IW {filters.treatment_iw}")
    limited = sum(bool(row[13]) for row in trials) / len(trials)
    if limited >= RWND_LIMITED_SHARE:
        found.append(f"receive window: the origin found {limited:.0%} of trials limited by the client's window")
    origin_rtts = [row[15] for row in trials if row[15]]
    client_rtts = [row[11] for row in trials if row[11]]
    if origin_rtts and client_rtts and min(origin_rtts) < PROXY_RTT_SHARE * min(client_rtts):
        found.append(
            f"proxy: the origin's min RTT {min(origin_rtts) / 1000:.1f} ms is far below the probe's "
            f"{min(client_rtts) / 1000:.1f} ms (something between terminates TCP)"
        )
    base, treat = arms
    if base.retrans_ci and treat.retrans_ci and treat.retrans_ci[0] > base.retrans_ci[1]:
        ratios = [row[16] / row[15] for row in trials if row[6] == filters.treatment_iw and row[8] > 0 and row[15] and row[16]]
        queued = statistics.median(ratios) if ratios else None
        if queued is not None and queued >= QUEUEING_RATIO:
            found.append(
                f"shallow buffer: IW {treat.iw} retransmits in {treat.retrans_share:.0%} of trials against "
                f"{base.retrans_share:.0%} at IW {base.iw}, after queueing (smoothed RTT {queued:.2f} x min RTT)"
            )
        else:
            shown = "" if queued is None else f" (smoothed RTT {queued:.2f} x min RTT)"
            found.append(
                f"policer: IW {treat.iw} retransmits in {treat.retrans_share:.0%} of trials against "
                f"{base.retrans_share:.0%} at IW {base.iw}, without queueing first{shown}"
            )
    for arm in arms:
        retransmitting = round((arm.retrans_share or 0.0) * arm.n)
        if (
            retransmitting >= MIN_RETRANS_TRIALS
            and arm.retrans_ci
            and arm.predicted_retrans_share is not None
            and arm.retrans_ci[0] > arm.predicted_retrans_share
        ):
            found.append(
                f"more loss than random: IW {arm.iw} retransmits in {arm.retrans_share:.0%} of trials, the model "
                f"with {inputs.loss:.2%} random loss in {arm.predicted_retrans_share:.0%}"
            )
    if inputs.bottleneck_bps is None:
        found.append("no bandwidth estimate: the model had no rate limit")
    return found or ["unexplained: inspect a trial's packets (Trials page)"]


def _fit_bucket(order: int, paths: list[PathModelFit], pairs: list[Pairs]) -> BucketModelFit:
    joined = Pairs(
        path=np.concatenate([item.path for item in pairs]),
        round_=np.concatenate([item.round_ for item in pairs]),
        size=np.concatenate([item.size for item in pairs]),
        baseline_ms=np.concatenate([item.baseline_ms for item in pairs]),
        treatment_ms=np.concatenate([item.treatment_ms for item in pairs]),
    )
    measured = paired_estimate(joined)
    predicted = [
        (path.n_pairs, path.predicted_ms, path.predicted_baseline_ms, path.predicted_ci_ms)
        for path in paths
        if path.predicted_ms is not None and path.predicted_baseline_ms is not None
    ]
    weights = [float(n) for n, *_ in predicted]
    predicted_ms = predicted_base = None
    predicted_ci: Interval | None = None
    if sum(weights) > 0:
        intervals = [ci for *_, ci in predicted]
        predicted_ms, combined = weighted_mean_interval([ms for _, ms, _, _ in predicted], intervals, weights)
        predicted_ci = combined if all(ci is not None for ci in intervals) else None
        predicted_base = sum(n * base for n, _, base, _ in predicted) / sum(weights)
    predicted_pct = 100.0 * predicted_ms / predicted_base if predicted_ms is not None and predicted_base else None
    residual = agrees = None
    if predicted_ms is not None and predicted_base is not None and measured.estimate_ms is not None and not measured.too_small:
        residual = measured.estimate_ms - predicted_ms
        agrees = _agrees(measured.estimate_ms, _ms(measured.interval), predicted_ms, 0.0, predicted_base)
    return BucketModelFit(
        bucket=bk.RTT_BUCKETS[order].label,
        order=order,
        n_paths=len(paths),
        n_pairs=measured.n_pairs,
        measured_ms=measured.estimate_ms,
        measured_ci_ms=_ms(measured.interval),
        measured_pct=measured.pct,
        predicted_ms=predicted_ms,
        predicted_ci_ms=predicted_ci,
        predicted_pct=predicted_pct,
        predicted_baseline_ms=predicted_base,
        residual_ms=residual,
        agrees=agrees,
        too_small=measured.too_small,
        caveat=measured.caveat,
    )
