"""``iwscope lab twin``: a calibrated lab twin of each measured path, for what-if IWs (plain,
paced or learned arms: ``--what-if 16,32,32p,learned``).

After Pantheon (Yan et al., USENIX ATC 2018), which fits one emulated link per real path so that
the measured runs are reproduced: for every probe x origin path of a campaign, one emulated
access link fitted from what the campaign measured on that path --

* **propagation** (``rtt_ms``): ``path_estimates.min_rtt_us``, the probe's smallest RTT sample
  (the smallest client ``tcpi_min_rtt_us`` of the campaign's trials when the path has none);
* **rate** (``rate_bps``): ``path_estimates.bottleneck_bps``, the 90th percentile of the path's
  recent delivery-rate samples; the same both ways (nothing measures the uplink; a slow uplink
  delays ACKs, which the fit then leaves out);
* **random loss** (``loss``): the *baseline* arm's retransmitted bytes / bytes sent on that path
  (``server_bytes_retrans`` / ``server_bytes_sent`` of the joined trials), both directions;
* **buffer** (``buffer_bytes``): the queue the path showed -- the 95th percentile over the
  baseline and treatment arms' trials of (the origin's smoothed RTT at the end of the transfer - the path's min RTT) x rate --
  where the treatment arm retransmitted in more trials than the baseline (Wilson intervals
  apart: its burst overflowed something) and that queue delayed it less than the initial RTO
  (1 s; a longer queue makes the sender time out and retransmit what still waits in it, so the
  extra retransmissions say nothing of the buffer: "timeouts, not overflow"); else no limit (the
  path never overflowed, so the queue seen is only a lower bound).  A what-if arm whose burst is larger than that queue plus one
  bandwidth-delay product is marked ``beyond_fit``: its prediction assumes the buffer holds it.

The twins run the campaign's arms on the same size mix (the fit check: per path, the twin's
paired improvement of the treatment over the baseline against the measured one, 95 % intervals
overlapping), together with arms the campaign did not measure (the what-ifs), whose paired
improvement over the baseline per path and per RTT bucket is a **prediction** and is marked as
one in every output.  ``--compare-arm`` sets a prediction beside an arm the campaign did
measure (a held-out check: fit on the baseline and treatment, predict the third).

The twins run on a stack of their own (database ``iwscope_twin``): their trials never mix with
measured ones.  Outputs: ``DIR/twin.json`` and ``DIR/twin.md``.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from rich.console import Console
from sqlalchemy import create_engine, pool, text
from sqlalchemy.orm import Session

from iwprobe import wire
from iwscope.analysis import buckets as bk
from iwscope.analysis.paired import PairedEstimate, make_pairs, paired_estimate
from iwscope.analysis.stats import proportion_interval, weighted_mean_interval
from iwscope_lab.campaign import CampaignPlan, LabCampaign
from iwscope_lab.links import DirectionSpec, LinkSpec
from iwscope_lab.reproduce import json_default
from iwscope_lab.stack import Stack
from iwscope_lab.topology import Host, Topology

#: The twins' stack: a database, Redis db, queue and API port of their own.
TWIN_DATABASE = "iwscope_twin"
TWIN_REDIS_DB = 2
TWIN_QUEUE = "iwscope-twin"
TWIN_API_PORT = 8702
#: The smallest buffer a twin gets (two full-size packets).
MIN_BUFFER_BYTES = 2 * 1514
#: Fewest joined trials of a path for a twin.
MIN_TRIALS = 20
#: Linux's initial retransmission timeout (RFC 6298's 1 s; ``TCP_TIMEOUT_INIT``), in µs.
INITIAL_RTO_US = 1_000_000

Interval = tuple[float, float]
#: An arm: a plain IW (the campaign's baseline and treatment) or a label (``32p``, ``learned``).
Arm = int | str


@dataclass(frozen=True)
class TwinPath:
    """One measured path and the link fitted to it (module docstring: from which fields)."""

    probe_id: str
    probe_name: str
    region: str
    origin_id: str
    trials: int
    rtt_ms: float
    rate_bps: float | None
    loss: float
    #: ``None``: no limit (no overflow seen).
    buffer_bytes: int | None
    #: ``queue seen`` (the treatment's bursts overflowed: the queue the path showed),
    #: ``timeouts, not overflow`` (its extra retransmissions came with a queue longer than the
    #: initial RTO: no limit) or ``no overflow seen`` (no limit; the queue seen is a lower bound).
    buffer_fit: str
    queue_seen_bytes: int

    def beyond_fit(self, arm: Arm) -> bool:
        """An IW burst larger than the queue seen plus one BDP: the fit says nothing of it
        (a paced arm's IW counts whole: pacing spreads it over the first round trip only)."""
        if self.buffer_bytes is not None or not self.rate_bps:
            return False
        bdp = self.rate_bps / 8 * self.rtt_ms / 1000
        return wire.arm_label_iw(str(arm)) * 1514 > self.queue_seen_bytes + bdp

    def link(self) -> LinkSpec:
        direction = DirectionSpec(
            rate_bps=self.rate_bps, delay_ms=self.rtt_ms / 2.0, loss=self.loss, buffer_bytes=self.buffer_bytes
        )
        return LinkSpec(down=direction, up=direction)


@dataclass
class Estimate:
    """A paired improvement (ms, positive: the arm is faster than the baseline) with its 95 %
    interval; ``None`` values under 20 pairs ("n too small")."""

    n_pairs: int
    ms: float | None
    ci_ms: Interval | None
    pct: float | None

    @classmethod
    def of(cls, estimate: PairedEstimate) -> Estimate:
        if estimate.too_small or estimate.estimate_ms is None:
            return cls(estimate.n_pairs, None, None, None)
        interval = estimate.interval
        return cls(
            estimate.n_pairs,
            estimate.estimate_ms,
            None if interval is None else (interval.abs_low, interval.abs_high),
            estimate.pct,
        )


def overlaps(a: Interval | None, b: Interval | None) -> bool | None:
    """Whether two intervals share a point (``None`` when either is missing)."""
    if a is None or b is None:
        return None
    return a[0] <= b[1] and b[0] <= a[1]


@dataclass
class TwinResult:
    """Per path: the fitted link, the fit check and the predictions; per RTT bucket the same."""

    campaign_id: int
    baseline_iw: int
    treatment_iw: int
    #: Arms by label (``32``, ``32p``, ``learned``).
    what_if: list[str]
    compare_arm: str | None
    twin_campaign_id: int | None = None
    paths: list[dict[str, Any]] = field(default_factory=list)
    buckets: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_PATH_ROWS = """
    SELECT t.probe_id::text, p.name, p.region, t.origin_id::text, coalesce(t.arm, t.arm_iw::text), t.round, t.object_size,
           t.server_latency_us, coalesce(t.server_total_retrans, 0), t.server_bytes_retrans, t.server_bytes_sent,
           t.tcpi_min_rtt_us, o.tcpi_rtt_us, e.min_rtt_us, e.bottleneck_bps
      FROM trials t JOIN probes p ON p.id = t.probe_id
      LEFT JOIN origin_observations o ON o.trial_id = t.trial_id
      LEFT JOIN path_estimates e ON e.probe_id = t.probe_id AND e.origin_id = t.origin_id
     WHERE t.campaign_id = :campaign AND t.error_kind IS NULL AND t.role = 'short'
       AND t.origin_id IS NOT NULL AND t.server_latency_us IS NOT NULL"""


def read_paths(session: Session, campaign_id: int) -> dict[tuple[str, str], list[Any]]:
    """A campaign's joined trials, per probe x origin path; each row's arm (column 4) by its
    label: ``10``, ``32p`` (paced), ``learned``."""
    paths: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for row in session.execute(text(_PATH_ROWS), {"campaign": campaign_id}):
        paths[(row[0], row[3])].append(row)
    return paths


def _retrans_interval(rows: Sequence[Any]) -> Interval | None:
    return proportion_interval(sum(row[8] > 0 for row in rows), len(rows)) if rows else None


def fit_path(rows: Sequence[Any], baseline_iw: int, treatment_iw: int) -> TwinPath | None:
    """The link fitted to one path's trials (module docstring), ``None`` without an RTT."""
    first = rows[0]
    rtt_us = first[13] or min((row[11] for row in rows if row[11]), default=None)
    if not rtt_us:
        return None
    rate = float(first[14]) if first[14] else None
    base_arm, treat_arm = str(baseline_iw), str(treatment_iw)
    baseline = [row for row in rows if row[4] == base_arm]
    sent = sum(row[10] or 0 for row in baseline)
    loss = min(0.5, sum(row[9] or 0 for row in baseline) / sent) if sent else 0.0
    # only the fitted arms' trials: a held-out arm's own queueing must not leak into its twin
    queues_us = sorted(max(0, row[12] - rtt_us) for row in rows if row[12] and row[4] in (base_arm, treat_arm))
    queue_us = queues_us[min(len(queues_us) - 1, int(0.95 * len(queues_us)))] if queues_us else 0
    queue_bytes = int(queue_us * (rate or 0) / 8e6)
    base_ci, treat_ci = _retrans_interval(baseline), _retrans_interval([row for row in rows if row[4] == treat_arm])
    more_retrans = base_ci is not None and treat_ci is not None and treat_ci[0] > base_ci[1]
    # A queue that delays the burst past the initial RTO makes the sender retransmit what still
    # waits in it: the extra retransmissions are timeouts, not overflow, and the buffer holds at
    # least what was seen (eu-modem of make demo: 56 kbit/s, a 32 KB buffer, 1.3 s of queue seen)
    timeouts = more_retrans and queue_us >= INITIAL_RTO_US
    overflowed = more_retrans and not timeouts
    buffer: int | None = max(MIN_BUFFER_BYTES, queue_bytes) if overflowed else None
    how = "queue seen" if overflowed else "timeouts, not overflow" if timeouts else "no overflow seen"
    return TwinPath(
        probe_id=first[0],
        probe_name=first[1],
        region=first[2],
        origin_id=first[3],
        trials=len(rows),
        rtt_ms=rtt_us / 1000.0,
        rate_bps=rate,
        loss=round(loss, 5),
        buffer_bytes=buffer,
        buffer_fit=how,
        queue_seen_bytes=queue_bytes,
    )


def path_estimate(rows: Sequence[Any], baseline: Arm, arm: Arm) -> Estimate:
    """The paired improvement of ``arm`` over ``baseline`` on one path's trials."""
    base_label, arm_label = str(baseline), str(arm)
    chosen = [row for row in rows if row[4] in (base_label, arm_label)]
    pairs = make_pairs(
        np.zeros(len(chosen), dtype=np.int64),
        [row[5] for row in chosen],
        [row[6] for row in chosen],
        [row[4] == arm_label for row in chosen],
        [row[7] / 1000.0 for row in chosen],
    )
    return Estimate.of(paired_estimate(pairs))


def bucket_estimate(paths: Sequence[Sequence[Any]], baseline: Arm, arm: Arm) -> Estimate:
    """The paired improvement over several paths' trials (paths resampled whole from five on)."""
    base_label, arm_label = str(baseline), str(arm)
    chosen = [(code, row) for code, rows in enumerate(paths) for row in rows if row[4] in (base_label, arm_label)]
    pairs = make_pairs(
        [code for code, _ in chosen],
        [row[5] for _, row in chosen],
        [row[6] for _, row in chosen],
        [row[4] == arm_label for _, row in chosen],
        [row[7] / 1000.0 for _, row in chosen],
    )
    return Estimate.of(paired_estimate(pairs))


def rtt_bucket(rtt_ms: float) -> tuple[int, str]:
    order = int(bk.rtt_index(np.asarray([rtt_ms * 1000.0]))[0])
    return order, bk.RTT_BUCKETS[order].label


def twin_topology(fitted: Sequence[TwinPath], run_id: str | None = None) -> Topology:
    """One fast origin and one probe per fitted path behind the fitted link."""
    hosts = [Host("origin", role="origin", region="lab", link=LinkSpec.symmetric(rate_bps=1e9, rtt_ms=0))]
    for index, path in enumerate(fitted):
        hosts.append(Host(f"tw{index}", role="probe", region=path.region, link=path.link(), labels={"twin_of": path.probe_name}))
    return Topology(run_id, hosts, scenario="twin")


def run_twin(
    source_database_url: str,
    stack: Stack,
    campaign_id: int,
    *,
    baseline_iw: int,
    treatment_iw: int,
    what_if: Sequence[str],
    compare_arm: str | None,
    repetitions: int,
    console: Console,
    duration_s: float | None = None,
    show_progress: bool = True,
    twin_campaign_id: int | None = None,
) -> TwinResult:
    """Fit, run and compare (module docstring); with ``twin_campaign_id``, compare an earlier twin
    campaign in the twins' database again instead of running one (its paths named ``tw<i>``
    in the order of this fit)."""
    engine = create_engine(source_database_url, poolclass=pool.NullPool)
    with Session(engine) as session:
        plan_row = session.execute(
            text("SELECT sizes, size_dist, sizes_per_round FROM campaigns WHERE id = :id"), {"id": campaign_id}
        ).one_or_none()
        if plan_row is None:
            raise ValueError(f"campaign {campaign_id} is not in {engine.url.render_as_string(hide_password=True)}")
        measured = read_paths(session, campaign_id)
    engine.dispose()
    fitted_by_key = {
        key: fit
        for key, rows in measured.items()
        if len(rows) >= MIN_TRIALS and (fit := fit_path(rows, baseline_iw, treatment_iw)) is not None
    }
    if not fitted_by_key:
        raise ValueError(f"campaign {campaign_id} has no path with {MIN_TRIALS} joined trials and an RTT estimate")
    keys = list(fitted_by_key)
    fitted = [fitted_by_key[key] for key in keys]
    labels = tuple(dict.fromkeys([str(baseline_iw), str(treatment_iw), *what_if]))
    sizes, size_dist, sizes_per_round = plan_row
    plan = CampaignPlan(
        f"twin of campaign {campaign_id}",
        arms=tuple(wire.arm_label_iw(label) for label in labels),
        arm_labels=labels,
        sizes=tuple(sizes) if sizes else None,
        size_dist=None if sizes else size_dist,
        sizes_per_round=sizes_per_round,
        repetitions=repetitions,
        duration_s=duration_s,
        congestion_control="cubic",
    )
    if twin_campaign_id is None:
        topology = twin_topology(fitted)
        with topology:
            console.print(f"[bold]twin of campaign {campaign_id}[/]: {len(fitted)} paths, arms {', '.join(labels)}")
            twin_campaign_id = LabCampaign(topology, stack, plan, console=console).run(show_progress=show_progress).campaign_id
    twin_engine = create_engine(stack.database_url, poolclass=pool.NullPool)
    with Session(twin_engine) as session:
        twin_rows = read_paths(session, twin_campaign_id)
    twin_engine.dispose()
    twin_paths = {index: rows for rows in twin_rows.values() if (index := _twin_index(rows[0][1])) is not None}
    result = TwinResult(campaign_id, baseline_iw, treatment_iw, list(what_if), compare_arm, twin_campaign_id)
    return compare(result, fitted, [measured[key] for key in keys], [twin_paths.get(i, []) for i in range(len(fitted))])


def compare(
    result: TwinResult, fitted: Sequence[TwinPath], measured: Sequence[list[Any]], twin: Sequence[list[Any]]
) -> TwinResult:
    """Fill ``result`` per path and RTT bucket from each fitted path's measured trials and its
    twin's (``read_paths`` rows, in the order of ``fitted``): the fit check, the what-if arms
    and the held-out arm, every twin number marked ``prediction``."""
    for path, measured_rows, twin_rows in zip(fitted, measured, twin, strict=True):
        result.paths.append(_path_report(path, measured_rows, twin_rows, result))
    result.buckets = _bucket_reports(list(fitted), list(measured), list(twin), result)
    return result


def _twin_index(probe_name: str) -> int | None:
    """The fitted path a twin probe stands for: ``tw<i>`` (the lab adds its run's suffix)."""
    match = re.match(r"tw(\d+)(?:\.|$)", probe_name)
    return int(match.group(1)) if match else None


def _path_report(path: TwinPath, measured: list[Any], twin: list[Any], result: TwinResult) -> dict[str, Any]:
    base, treat = result.baseline_iw, result.treatment_iw
    fit_measured = path_estimate(measured, base, treat)
    fit_twin = path_estimate(twin, base, treat)
    report: dict[str, Any] = {
        "path": asdict(path),
        "bucket": rtt_bucket(path.rtt_ms)[1],
        "fit": {
            "measured": asdict(fit_measured),
            "twin": {**asdict(fit_twin), "prediction": True},
            "overlap": overlaps(fit_measured.ci_ms, fit_twin.ci_ms),
        },
        "predicted": {
            arm: {**asdict(path_estimate(twin, base, arm)), "prediction": True, "beyond_fit": path.beyond_fit(arm)}
            for arm in result.what_if
        },
    }
    if result.compare_arm is not None:
        held_out = path_estimate(measured, base, result.compare_arm)
        predicted = path_estimate(twin, base, result.compare_arm)
        report["held_out"] = {
            "measured": asdict(held_out),
            "predicted": {**asdict(predicted), "prediction": True},
            "overlap": overlaps(held_out.ci_ms, predicted.ci_ms),
        }
    return report


def stratified(estimates: Sequence[Estimate], weights: Sequence[float]) -> Estimate:
    """The twins' estimate for a bucket as its measured paths are weighted: each path's twin
    estimate weighted by that path's measured pairs (a twin runs as many rounds as its path allows
    in the time box, not as many as the campaign did), its interval from the paths' own standard
    errors (half an interval / 1.96).  Paths without a twin estimate are left out."""
    used = [
        (estimate, weight) for estimate, weight in zip(estimates, weights, strict=True) if estimate.ms is not None and weight > 0
    ]
    if not used:
        return Estimate(sum(estimate.n_pairs for estimate in estimates), None, None, None)
    mean, interval = weighted_mean_interval(
        [estimate.ms or 0.0 for estimate, _ in used], [estimate.ci_ms for estimate, _ in used], [weight for _, weight in used]
    )
    return Estimate(sum(estimate.n_pairs for estimate, _ in used), mean, interval, None)


def _bucket_reports(
    fitted: list[TwinPath], measured: list[list[Any]], twin: list[list[Any]], result: TwinResult
) -> list[dict[str, Any]]:
    """Per RTT bucket: the measured paired estimate over the bucket's paths that have a twin
    estimate too, beside the twins' estimates weighted as the measured paths are
    (:func:`stratified`)."""
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for index, path in enumerate(fitted):
        groups[rtt_bucket(path.rtt_ms)].append(index)
    reports = []
    base = result.baseline_iw

    def compare(members: list[int], arm: Arm) -> dict[str, Any]:
        twins = [path_estimate(twin[i], base, arm) for i in members]
        measured_paths = [path_estimate(measured[i], base, arm) for i in members]
        common = [i for i, estimate in zip(members, twins, strict=True) if estimate.ms is not None]
        held = bucket_estimate([measured[i] for i in common], base, arm)
        predicted = stratified(twins, [float(estimate.n_pairs) for estimate in measured_paths])
        return {
            "paths": len(common),
            "measured": asdict(held),
            "twin": {**asdict(predicted), "prediction": True},
            "overlap": overlaps(held.ci_ms, predicted.ci_ms),
        }

    for (order, label), members in sorted(groups.items()):
        fit_weights = [float(path_estimate(measured[i], base, result.treatment_iw).n_pairs) for i in members]
        entry: dict[str, Any] = {
            "bucket": label,
            "order": order,
            "paths": len(members),
            "fit": compare(members, result.treatment_iw),
            "predicted": {
                arm: {
                    **asdict(stratified([path_estimate(twin[i], base, arm) for i in members], fit_weights)),
                    "prediction": True,
                }
                for arm in result.what_if
            },
        }
        if result.compare_arm is not None:
            held_out = compare(members, result.compare_arm)
            held_out["predicted"] = held_out.pop("twin")
            entry["held_out"] = held_out
        reports.append(entry)
    return reports


def store_result(database_url: str, result: TwinResult) -> tuple[int, bool]:
    """Store ``result`` beside its campaign in the collector's database (``twin_predictions``),
    through the check the API's upload runs; ``(id, duplicate)``."""
    from iwscope.predictions.schemas import TwinResultIn
    from iwscope.predictions.services import store_twin_result

    checked = TwinResultIn.model_validate_json(json.dumps(result.to_dict(), default=json_default))
    engine = create_engine(database_url, poolclass=pool.NullPool)
    try:
        with Session(engine) as session, session.begin():
            stored = store_twin_result(session, checked)
    finally:
        engine.dispose()
    return stored.id, stored.duplicate
