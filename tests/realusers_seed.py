"""A passive (real-user) study small enough to compute by hand: what the analysis routes' and the
Real users page's tests seed, and the hand computation they compare with.

Three arms -- ``default`` (IW 10), ``16`` and ``32`` -- on one server, two client regions, two
UTC days, two phases (treated share 10 %, then 50 %):

* phase 0: ``default`` and ``16`` in clusters 0..11 (DE: 0..5, BR: 6..11; RTT bucket 2 for even
  clusters, 4 for odd), one row per cluster and day (day 1: 100 + 5c ms for ``default``, 80 + 5c
  ms for ``16``; day 2: 2 ms more); cluster 1's day-1 row of ``16`` arrives in two uploads (the
  sums add); ``32`` only in clusters 0..2 -- n too small (3 clusters < 5); a biased row of ``16``
  (cluster 0, 5 connections at 900 ms, SYN retransmitted); a row of ``default`` with an unknown
  RTT bucket and no measured response;
* phase 1 (after the share change): ``default`` in clusters 0..11 on day 2, 10 ms slower than
  its phase-0 day-1 rows (the interference the sweep should show).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from iwprobe import wire
from iwscope.analysis.buckets import HIST_CENTER_US, hist_bin

ARMS_PHASE0 = [{"arm": "default", "share_bp": 9000}, {"arm": "16", "share_bp": 500}, {"arm": "32", "share_bp": 500}]
ARMS_PHASE1 = [{"arm": "default", "share_bp": 5000}, {"arm": "16", "share_bp": 2500}, {"arm": "32", "share_bp": 2500}]
IW = {"default": 10, "16": 16, "32": 32}


@dataclass(frozen=True)
class Days:
    day1: dt.datetime
    day2: dt.datetime


def days(now: dt.datetime | None = None) -> Days:
    """Two whole UTC hours on the two days before today (10:00)."""
    today = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC).replace(hour=10, minute=0, second=0, microsecond=0)
    return Days(today - dt.timedelta(days=2), today - dt.timedelta(days=1))


def aggregate(
    server_id: str,
    campaign_id: int,
    *,
    phase: int,
    hour: dt.datetime,
    arm: str,
    cluster: int,
    latency_ms: float,
    responses: int = 20,
    connections: int = 25,
    region: str = "DE",
    rtt_bucket: int = 2,
    biased: bool = False,
    total_retrans: int = 10,
    **extra: Any,
) -> dict[str, Any]:
    """One wire ``PassiveAggregate``: ``responses`` first responses all at ``latency_ms``."""
    latency_us = int(round(latency_ms * 1000))
    record: dict[str, Any] = {
        "aggregate_id": wire.new_id(),
        "server_id": server_id,
        "campaign_id": campaign_id,
        "phase": phase,
        "hour": wire.utc_timestamp(hour),
        "arm": arm,
        "arm_iw": IW[arm],
        "treated_share_bp": 1000 if phase == 0 else 5000,
        "family": "ipv4",
        "port_kind": "user",
        "region": region,
        "cluster": cluster,
        "rtt_bucket": rtt_bucket,
        "bandwidth_bucket": 5,
        "bdp_bucket": 3,
        "size_octave": 14,
        "biased": biased,
        "connections": connections,
        "responses": responses,
        "latency_sum_us": responses * latency_us,
        "latency_hist": [[hist_bin(latency_us), responses]] if responses else [],
        "retrans_connections": min(3, connections),
        "data_segs_out": 500,
        "total_retrans": total_retrans,
        "bytes_acked": 700_000,
        "bytes_retrans": 14_400,
        "syn_retrans": 0,
        "rwnd_limited": 0,
        "reused_after_idle": 1,
        "tls": min(20, connections),
    }
    record.update(extra)
    return record


def study(server_id: str, campaign_id: int, when: Days) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(phase-0 aggregates, phase-1 aggregates) of the study in the module docstring."""
    phase0: list[dict[str, Any]] = []
    for cluster in range(12):
        region = "DE" if cluster < 6 else "BR"
        bucket = 2 if cluster % 2 == 0 else 4
        for hour, extra_ms in ((when.day1, 0.0), (when.day2, 2.0)):
            common = {"phase": 0, "hour": hour, "cluster": cluster, "region": region, "rtt_bucket": bucket}
            phase0.append(aggregate(server_id, campaign_id, arm="default", latency_ms=100 + 5 * cluster + extra_ms, **common))
            phase0.append(
                aggregate(server_id, campaign_id, arm="16", latency_ms=80 + 5 * cluster + extra_ms, total_retrans=15, **common)
            )
            if cluster < 3:
                phase0.append(
                    aggregate(
                        server_id, campaign_id, arm="32", latency_ms=70 + 5 * cluster + extra_ms, total_retrans=20, **common
                    )
                )
    # the same key again (a second upload interval): its sums add to the first's
    phase0.append(
        aggregate(server_id, campaign_id, phase=0, hour=when.day1, arm="16", cluster=1, latency_ms=85, responses=4, connections=5)
    )
    phase0.append(
        aggregate(
            server_id,
            campaign_id,
            phase=0,
            hour=when.day1,
            arm="16",
            cluster=0,
            latency_ms=900,
            responses=5,
            connections=5,
            biased=True,
            syn_retrans=5,
            rwnd_limited=1,
            retrans_connections=5,
            total_retrans=30,
        )
    )
    phase0.append(
        aggregate(
            server_id,
            campaign_id,
            phase=0,
            hour=when.day1,
            arm="default",
            cluster=0,
            latency_ms=0,
            responses=0,
            connections=4,
            rtt_bucket=-1,
            retrans_connections=0,
            total_retrans=0,
            data_segs_out=40,
            tls=0,
            reused_after_idle=0,
        )
    )
    phase1 = [
        aggregate(
            server_id,
            campaign_id,
            phase=1,
            hour=when.day2 + dt.timedelta(hours=4),
            arm="default",
            cluster=cluster,
            latency_ms=110 + 5 * cluster,
            region="DE" if cluster < 6 else "BR",
            rtt_bucket=2 if cluster % 2 == 0 else 4,
        )
        for cluster in range(12)
    ]
    return phase0, phase1


def connections(server_id: str, campaign_id: int, when: Days, count: int = 3) -> list[dict[str, Any]]:
    """A few sampled raw connection records (the load's raw side)."""
    return [
        {
            "record_id": wire.new_id(),
            "server_id": server_id,
            "campaign_id": campaign_id,
            "phase": 0,
            "closed_at": wire.utc_timestamp(when.day1 + dt.timedelta(minutes=index)),
            "arm": "16",
            "arm_iw": 16,
            "treated_share_bp": 1000,
            "family": "ipv4",
            "port_kind": "user",
            "port": 443,
            "region": "DE",
            "country": "DE",
            "client_prefix": f"{index + 1:016x}",
            "cluster": index,
            "tcp_info": {"min_rtt": 41_000, "data_segs_out": 36, "total_retrans": 0},
            "captured": True,
            "tls": True,
            "response_latency_us": 90_000,
            "response_bytes": 40_000,
            "first_flight_segments": 16,
        }
        for index in range(count)
    ]


# ---- the hand computation -------------------------------------------------------------------------


@dataclass(frozen=True)
class HandArm:
    connections: int
    responses: int
    clusters: int
    avg_ms: float | None
    percentiles_ms: dict[str, float | None]
    retrans_rate: float | None
    retrans_conn_share: float | None
    syn_retrans_share: float | None


def nearest_rank_ms(values_us: list[float], q: float) -> float:
    """The ``ceil(q n)``-th smallest value, read at its histogram bin's centre."""
    ordered = sorted(values_us)
    return float(HIST_CENTER_US[hist_bin(ordered[max(1, math.ceil(q * len(ordered) - 1e-9)) - 1])]) / 1000.0


def hand(records: Iterable[dict[str, Any]], keep: Callable[[dict[str, Any]], bool] = lambda record: True) -> dict[str, HandArm]:
    """Per arm, the numbers the summary must show, computed plainly from the wire records."""
    by_arm: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        if keep(record):
            by_arm[record["arm"]].append(record)
    out = {}
    for arm, rows in by_arm.items():
        values: list[float] = []
        for row in rows:
            for _bin, count in row["latency_hist"]:
                values += [row["latency_sum_us"] / row["responses"]] * count
        responses = sum(row["responses"] for row in rows)
        connections_ = sum(row["connections"] for row in rows)
        segments = sum(row["data_segs_out"] for row in rows)
        out[arm] = HandArm(
            connections=connections_,
            responses=responses,
            clusters=len({row["cluster"] for row in rows if row["responses"]}),
            avg_ms=sum(row["latency_sum_us"] for row in rows) / responses / 1000.0 if responses else None,
            percentiles_ms={
                key: nearest_rank_ms(values, q) if values else None
                for key, q in (("p50", 0.5), ("p75", 0.75), ("p90", 0.9), ("p99", 0.99))
            },
            retrans_rate=sum(row["total_retrans"] for row in rows) / segments if segments else None,
            retrans_conn_share=sum(row["retrans_connections"] for row in rows) / connections_,
            syn_retrans_share=sum(row["syn_retrans"] for row in rows) / connections_,
        )
    return out


# ---- straight into a database (the dashboard's own) ---------------------------------------------------


def insert_study(engine: Engine, when: Days | None = None) -> tuple[int, str, list[dict[str, Any]], list[dict[str, Any]]]:
    """Insert a server, the passive campaign (now at phase 1) and the study's aggregates, as the
    ingest would have stored them; returns (campaign id, server id, phase-0, phase-1 records)."""
    when = when or days()
    server_id = str(uuid.uuid4())
    with engine.begin() as connection:
        connection.execute(
            text("""
            INSERT INTO servers (id, name, region, ports, version, kernel, secret_hash)
            VALUES (:id, 'web-seed', 'eu-central', '{80,443}', '0.6.0', '6.1.0', 'x')"""),
            {"id": server_id},
        )
        campaign_id = int(
            connection.execute(
                text("""
            INSERT INTO campaigns (name, origin_ids, arms, sizes_per_round, repetitions, interval_s, starts_at, ends_at,
                                   calibrate, server_ids, passive_arms, prefix_v4, prefix_v6, assignment_seed,
                                   sample_share, flush_interval_s, phase)
            VALUES ('real users seed', '{}', '{}', 1, 1, 0, :starts, :ends, false, ARRAY[CAST(:server AS uuid)],
                    CAST(:arms AS jsonb), 24, 48, 12345, 0.01, 60, 1)
            RETURNING id"""),
                {
                    "starts": when.day1 - dt.timedelta(hours=2),
                    "ends": when.day2 + dt.timedelta(days=3),
                    "server": server_id,
                    "arms": json.dumps(ARMS_PHASE1),
                },
            ).scalar_one()
        )
        phase0, phase1 = study(server_id, campaign_id, when)
        for record in phase0 + phase1:
            row = {key: value for key, value in record.items() if key != "latency_hist"}
            row["hour"] = dt.datetime.fromisoformat(record["hour"].replace("Z", "+00:00"))
            row["latency_bins"] = [pair[0] for pair in record["latency_hist"]]
            row["latency_counts"] = [pair[1] for pair in record["latency_hist"]]
            columns = ", ".join(row)
            connection.execute(
                text(f"INSERT INTO passive_aggregates ({columns}) VALUES ({', '.join(':' + name for name in row)})"), row
            )
    return campaign_id, server_id, phase0, phase1
