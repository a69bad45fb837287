"""The IETF 78 latency testbed point beside the model with loss (issue 38).

The IW10 authors' testbed ("Why does latency improve in Africa?", IETF 78 slides, seed 003): a
20 Mbit/s bottleneck, 300 ms RTT, a drop-tail buffer of one bandwidth-delay product, Poisson
arrivals of 50 KB responses at offered load 0.95; IW10 is faster than IW3 although it
retransmits more.  Here: the same bottleneck in the lab (``iwemu``), one campaign through the
product with IW3 and IW10 flows mixed half and half on the same queue (the fairness
experiment's Poisson arrivals, no background flow), then per arm the measured mean response
latency (server side, 95 % interval) beside the model with loss.

Its losses are the queue's, not random: they come in bursts when the queue is full and fall on
the flows that arrive then.  The model is given what a path's estimates would give it:

* ``min RTT`` -- the 300 ms propagation delay, the bottleneck rate and the arm's own
  retransmitted share of bytes as random loss on the data direction (the Model page's inputs);
* ``queue RTT`` -- the same with the RTT the arm's flows saw, the mean of the origin's smoothed
  RTT at the end of each transfer (the queue included): the measurement that explains why the
  first lands short, if it does.

A point more than ``flag_threshold`` off (``reproduce.LOSS_FLAG_THRESHOLD``, passed in: this
module is run by ``reproduce``) is flagged with what the trials measured (queueing delay,
retransmitting flows against the model's).  Tables: :mod:`iwscope_lab.testbed_report`.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from sqlalchemy import text

from iwscope.analysis.stats import difference_interval, mean_interval
from iwscope.model import congestion_control, predict_with_loss
from iwscope_lab.fairness import Bottleneck, run_fairness
from iwscope_lab.stack import Stack

#: Key of this experiment in ``iwscope lab reproduce --only`` and in ``summary.json``.
TESTBED_KEY = "testbed"
#: The slides' bottleneck (a BDP buffer) and workload.
BOTTLENECK = Bottleneck(rate_bps=20e6, rtt_ms=300.0, buffer_bdp=1.0)
LOAD = 0.95
SIZE = 50_000
ARMS = (3, 10)
#: The origin's connection cap and worker pool: the fairness experiment's 300 shed (reset) 74 of
#: the 500 flows in 2 of 4 runs (at load 0.95 behind 300 ms flows queue for seconds); 1,000 shed
#: none in 2 of 2.
ORIGIN_CONNECTIONS = 1000

_ROWS = """
    SELECT t.arm_iw, t.server_latency_us, coalesce(t.server_bytes_retrans, 0), t.server_bytes_sent,
           coalesce(t.server_total_retrans, 0), o.tcpi_rtt_us
      FROM trials t LEFT JOIN origin_observations o ON o.trial_id = t.trial_id
     WHERE t.campaign_id = :campaign AND t.role = 'short' AND t.error_kind IS NULL
       AND t.server_latency_us IS NOT NULL"""
#: The flows that failed, per arm and kind: left out of the means, so reported beside them (a
#: shed connection removes load the others would have met).
_ERRORS = """
    SELECT arm_iw, error_kind, count(*) FROM trials
     WHERE campaign_id = :campaign AND role = 'short' AND error_kind IS NOT NULL
     GROUP BY arm_iw, error_kind"""


def _model(iw: int, rtt_ms: float, loss: float, samples: int) -> dict[str, Any]:
    model = predict_with_loss(
        SIZE,
        iw,
        rtt_ms / 1000,
        BOTTLENECK.rate_bps,
        loss,
        up_loss=0.0,
        cc=congestion_control("cubic"),
        samples=samples,
        seed=78,
        keep_samples=True,
    )
    simulated = [trial.server_latency_s * 1000 for trial in model.trials]
    return {
        "rtt_ms": rtt_ms,
        "loss": loss,
        "mean_ms": model.server.mean_s * 1000,
        "ci_ms": mean_interval(simulated),
        "retrans_share": model.p_server_retrans,
        "prediction": True,
    }


def arm_point(iw: int, rows: list[Any], *, flag_threshold: float, samples: int) -> dict[str, Any]:
    """One arm's measured latency beside the model with loss from its own estimates (``samples``
    simulated connections at least, ten per trial)."""
    samples = max(samples, 10 * len(rows))
    latency = [row[1] / 1000 for row in rows]
    sent = sum(row[3] or 0 for row in rows)
    loss = min(0.5, sum(row[2] for row in rows) / sent) if sent else 0.0
    srtt = [row[5] / 1000 for row in rows if row[5]]
    queue_rtt = statistics.fmean(srtt) if srtt else BOTTLENECK.rtt_ms
    point: dict[str, Any] = {
        "iw": iw,
        "n": len(rows),
        "mean_ms": statistics.fmean(latency) if latency else None,
        "ci_ms": mean_interval(latency),
        "retrans_share": sum(row[4] > 0 for row in rows) / len(rows) if rows else 0.0,
        "bytes_retrans_share": loss,
        "queue_delay_ms": queue_rtt - BOTTLENECK.rtt_ms,
        "models": {
            "min RTT": _model(iw, BOTTLENECK.rtt_ms, loss, samples),
            "queue RTT": _model(iw, queue_rtt, loss, samples),
        },
    }
    for model in point["models"].values():
        model["gap"] = None if point["mean_ms"] is None else (point["mean_ms"] - model["mean_ms"]) / model["mean_ms"]
        model["within"] = model["gap"] is not None and abs(model["gap"]) <= flag_threshold
    first = point["models"]["min RTT"]
    if not first["within"] and point["mean_ms"] is not None:
        point["flag"] = (
            f"{first['gap']:+.0%} off the min-RTT model: the flows' smoothed RTT was "
            f"{point['queue_delay_ms']:.0f} ms above the propagation delay (the queue at load {LOAD:g}); "
            f"retransmitting flows {point['retrans_share']:.0%} (model {first['retrans_share']:.0%})"
        )
    return point


def reproduce_testbed(
    stack: Stack, *, quick: bool, flag_threshold: float, samples: int, show_progress: bool = True
) -> dict[str, Any]:
    """Run the testbed point (``quick``: 200 flows, else 500: a campaign lists at most 256 sizes
    an arm) and compare it with the model."""
    flows = 200 if quick else 500
    (phase,) = run_fairness(
        stack,
        bottleneck=BOTTLENECK,
        loads=(LOAD,),
        mixes=(ARMS,),
        flows=flows,
        sizes=(SIZE,),
        timeout_s=600 if quick else 1200,
        show_progress=show_progress,
        background=False,
        origin_connections=ORIGIN_CONNECTIONS,
    )
    with stack.session() as session:
        rows = list(session.execute(text(_ROWS), {"campaign": phase.campaign.campaign_id}))
        failed = list(session.execute(text(_ERRORS), {"campaign": phase.campaign.campaign_id}))
    arms = [arm_point(iw, [row for row in rows if row[0] == iw], flag_threshold=flag_threshold, samples=samples) for iw in ARMS]
    for arm in arms:
        arm["errors"] = {kind: count for iw, kind, count in failed if iw == arm["iw"]}
    base, treat = arms
    improvement = improvement_ci = None
    if base["mean_ms"] is not None and treat["mean_ms"] is not None:
        improvement = base["mean_ms"] - treat["mean_ms"]
        # the arms' flows arrived at random, not in rounds: an unpaired difference
        improvement_ci = difference_interval(base["mean_ms"], base["ci_ms"], treat["mean_ms"], treat["ci_ms"])
    return {
        "title": "IETF 78 latency testbed (20 Mbit/s, 300 ms, BDP buffer, load 0.95, 50 KB) beside the model with loss",
        "bottleneck": dataclasses.asdict(BOTTLENECK),
        "load": LOAD,
        "size": SIZE,
        "campaign_id": phase.campaign.campaign_id,
        "arrival_rate_per_s": phase.plan.arrival_rate_per_s,
        "seconds": round(phase.campaign.seconds, 1),
        "flag_threshold": flag_threshold,
        "arms": arms,
        "improvement_ms": improvement,
        "improvement_ci_ms": improvement_ci,
        # each model's IW3 - IW10 with its Monte-Carlo interval (the arms' simulations taken as independent)
        "model_improvement_ms": {
            name: (
                base["models"][name]["mean_ms"] - treat["models"][name]["mean_ms"],
                difference_interval(
                    base["models"][name]["mean_ms"],
                    base["models"][name]["ci_ms"],
                    treat["models"][name]["mean_ms"],
                    treat["models"][name]["ci_ms"],
                ),
            )
            for name in base["models"]
        },
    }
