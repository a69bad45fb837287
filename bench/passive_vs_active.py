"""Passive agrees with active (the real-users work's second must-show): the same emulated paths measured both ways.

1. **Passive**: the ``passive`` scenario (six regional links, 70 ms to 1.2 s, four loss-free),
   Debian's nginx on the server host, ``iwprobe tap`` splitting the users' /24s 50/50 between
   IW 3 and IW 10 (a passive campaign through the API), the user population for
   ``--duration`` seconds (HTTP/1.1 by default, ``--mix``: the slow-start model below is
   TLS-free); the Real users analysis (``passive_buckets``) gives per RTT bucket the mean
   first-response latency improvement of IW 10 over IW 3 with its cluster-bootstrap 95 % interval.
2. **Active**: a topology with the same links (the server's link for an ``iwprobe origin``, one
   probe per user host's link), a time-boxed paired campaign (IW 3 and IW 10, web-search
   sizes, the demo's plan) for as long; ``compare_by(rtt)`` gives the paired mean improvement
   with its path-bootstrap 95 % interval.
3. Per RTT bucket from 50 ms up: do the two intervals overlap?  Per loss-free path: the slow-start
   model's improvement for the very responses measured (:func:`iwscope.model.predict`,
   server-side latency for the passive responses, client-side for the trials; sizes as
   measured), and each estimate's distance from it.

Run as root with the lab's stack (the demo's, or one started for the run):
``.venv/bin/python bench/passive_vs_active.py [--duration 300]``; writes
``bench/results/passive-vs-active-<date>[-<n>].json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from iwscope.model import predict
from iwscope_lab.campaign import CampaignPlan, LabCampaign
from iwscope_lab.passive import AB_ARMS, LabPassive, PassivePlan
from iwscope_lab.scenarios import load_scenario
from iwscope_lab.stack import Stack, local_stack
from iwscope_lab.topology import Host, Topology
from iwscope_lab.users import PopulationConfig

RESULTS = Path(__file__).resolve().parent / "results"
SCENARIO = "passive"


def _mix(text_value: str) -> dict[str, float]:
    pairs = [part.split("=") for part in text_value.split(",")]
    return {name: float(share) for name, share in pairs}


def active_hosts() -> list[Host]:
    """The passive scenario's links as an origin and one probe per user host."""
    hosts = []
    for host in load_scenario(SCENARIO).hosts():
        role = "origin" if host.role == "server" else "probe"
        hosts.append(Host(host.name, role=role, region=host.region, link=host.link, labels=dict(host.labels)))
    return hosts


def run_passive(stack: Stack, duration_s: float, mix: dict[str, float]) -> dict[str, Any]:
    plan = PassivePlan(
        name="passive vs active: passive", arms=AB_ARMS, duration_s=duration_s, population=PopulationConfig(mix=mix)
    )
    with Topology.from_scenario(SCENARIO) as topology:
        result = LabPassive(topology, stack, plan).run(timeout_s=duration_s + 600)
    return result.to_dict()


def run_active(stack: Stack, duration_s: float) -> dict[str, Any]:
    plan = CampaignPlan(
        name="passive vs active: active",
        arms=(3, 10),
        sizes=None,
        size_dist="websearch",
        sizes_per_round=4,
        repetitions=100_000,
        duration_s=duration_s,
    )
    with Topology(hosts=active_hosts()) as topology:
        result = LabCampaign(topology, stack, plan).run(timeout_s=duration_s + 600, show_progress=False)
    return result.to_dict()


def _links() -> dict[str, Any]:
    return {host.region: host.link for host in load_scenario(SCENARIO).hosts() if host.role == "users"}


def _value(value: Any) -> dict[str, float | None] | None:
    return None if value is None else {"value": value.value, "low": value.low, "high": value.high}


def compare(stack: Stack, passive_id: int, active_id: int) -> dict[str, Any]:
    from iwscope.analysis import Filters, compare_by
    from iwscope.analysis.passive import passive_buckets
    from iwscope.analysis.passive_frames import PassiveFilters

    with stack.session() as session:
        passive = passive_buckets(session, PassiveFilters(campaign_id=passive_id, baseline="3"), "rtt")
        active = compare_by(session, Filters(campaign_ids=(active_id,), baseline_iw=3, treatment_iw=10), "rtt")
        records = session.execute(
            text(
                "SELECT region, arm_iw, response_bytes, response_latency_us FROM passive_connections "
                "WHERE campaign_id = :c AND response_latency_us IS NOT NULL AND NOT syn_retrans AND NOT tls"
            ),
            {"c": passive_id},
        ).all()
        trials = session.execute(
            text(
                "SELECT p.region, t.arm_iw, t.object_size, t.total_us FROM trials t JOIN probes p ON p.id = t.probe_id "
                "WHERE t.campaign_id = :c AND t.error_kind IS NULL AND t.syn_retrans = 0"
            ),
            {"c": active_id},
        ).all()
    rows = []
    active_by_bucket = {row.bucket: row for row in active}
    for row in passive.rows:
        if row.upper is not None and row.upper <= 50:
            continue
        ten = next((arm for arm in row.arms if arm.arm == "10"), None)
        other = active_by_bucket.get(row.group)
        improvement = ten.mean_improvement_ms if ten is not None else None
        entry: dict[str, Any] = {
            "bucket": row.group,
            "passive_ms": _value(improvement),
            "passive_responses": {arm.arm: arm.responses for arm in row.arms},
            "active_ms": None,
            "active_pairs": None,
            "overlap": None,
        }
        if other is not None and not other.too_small:
            entry["active_ms"] = {"value": other.abs_ms, "low": other.abs_ci_low, "high": other.abs_ci_high}
            entry["active_pairs"] = other.n_pairs
        if (
            improvement is not None
            and improvement.low is not None
            and entry["active_ms"]
            and entry["active_ms"]["low"] is not None
        ):
            entry["overlap"] = improvement.low <= entry["active_ms"]["high"] and entry["active_ms"]["low"] <= improvement.high
        rows.append(entry)
    return {
        "buckets": rows,
        "overlapping_buckets": sum(1 for row in rows if row["overlap"]),
        "model": model_check(records, trials),
    }


def _modelled(link: Any, rtt_s: float, iw: int, size: int, server_side: bool) -> float:
    """The model's latency (ms): server-side for a passive response (its size includes the
    header), client-side for a trial (the body, plus the origin's header)."""
    prediction = predict(
        size, iw, rtt_s, link.down.rate_bps, up_rate_bps=link.up.rate_bps, header_bytes=0 if server_side else 150
    )
    return 1000 * (prediction.server_latency_s if server_side else prediction.client_total_s)


def model_check(records: list[Any], trials: list[Any]) -> list[dict[str, Any]]:
    """Per loss-free path: measured mean improvement (IW 3 minus IW 10) and the model's for the
    same responses (its mean over each arm's measured sizes)."""
    checks = []
    for region, link in _links().items():
        if link.down.loss or link.up.loss:
            continue
        rtt_s = link.rtt_ms / 1000
        entry: dict[str, Any] = {"region": region, "rtt_ms": link.rtt_ms, "rate_bps": link.down.rate_bps}
        for name, rows, server_side in (("passive", records, True), ("active", trials, False)):
            by_arm: dict[int, list[tuple[int, float]]] = {3: [], 10: []}
            for row in rows:
                if row[0] == region and row[1] in by_arm and row[2]:
                    by_arm[row[1]].append((int(row[2]), row[3] / 1000))
            if min(len(values) for values in by_arm.values()) < 30:
                entry[name] = "n too small"
                continue
            measured = statistics.fmean(v for _, v in by_arm[3]) - statistics.fmean(v for _, v in by_arm[10])
            model = statistics.fmean(_modelled(link, rtt_s, 3, size, server_side) for size, _ in by_arm[3]) - statistics.fmean(
                _modelled(link, rtt_s, 10, size, server_side) for size, _ in by_arm[10]
            )
            entry[name] = {
                "n": {arm: len(values) for arm, values in by_arm.items()},
                "measured_ms": round(measured, 1),
                "model_ms": round(model, 1),
                "off_pct": round(100 * (measured - model) / model, 1) if model else None,
            }
        checks.append(entry)
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--mix", type=_mix, default={"h1": 1.0})
    parser.add_argument("--passive-campaign", type=int, help="compare this finished passive campaign (no new one)")
    parser.add_argument("--active-campaign", type=int, help="compare this finished active campaign (no new one)")
    args = parser.parse_args()
    stack = Stack.attach()
    started = None
    if stack is None:
        stack = started = local_stack(api_port=8702, dashboard_port=None).start()
    try:
        report: dict[str, Any] = {
            "bench": "passive-vs-active",
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "duration_s": args.duration,
            "mix": args.mix,
        }
        report["passive"] = (
            {"campaign_id": args.passive_campaign} if args.passive_campaign else run_passive(stack, args.duration, args.mix)
        )
        print(json.dumps(report["passive"], indent=1, default=str), flush=True)
        report["active"] = {"campaign_id": args.active_campaign} if args.active_campaign else run_active(stack, args.duration)
        report["comparison"] = compare(stack, report["passive"]["campaign_id"], report["active"]["campaign_id"])
        print(json.dumps(report["comparison"], indent=1), flush=True)
    finally:
        stack.close_sessions()
        if started is not None:
            started.stop()
    RESULTS.mkdir(exist_ok=True)
    stem = f"passive-vs-active-{time.strftime('%Y%m%d')}"
    path = RESULTS / f"{stem}.json"
    index = 2
    while path.exists():
        path = RESULTS / f"{stem}-{index}.json"
        index += 1
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
