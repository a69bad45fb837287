"""A small, deterministic study for the dashboard and export tests, written through the collector's
models (``study_db`` in tests/conftest.py holds it in a database of its own).

Eight probes in five regions measure one origin with arms IW3, IW10 and IW16 over three days,
in two campaigns. Latency follows slow start: ``rounds(size, iw) * rtt + size / bandwidth``,
with multiplicative noise, and a retransmission (one extra RTT) with a probability that grows
with the path's loss rate and with the initial window. About 2% of trials fail (timeout).
Path estimates give every probe a different RTT / bandwidth / BDP / loss bucket.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import insert
from sqlalchemy.orm import Session

from iwscope.analysis import buckets as bk
from iwscope.models import Campaign, CensusRecord, Origin, PathEstimate, Probe, Trial, TrialId
from iwscope.predictions.schemas import TwinResultIn
from iwscope.predictions.services import store_twin_result

MSS = 1448
SIZES = (2_000, 8_000, 15_000, 30_000, 60_000, 120_000)
#: The probe behind a "split-TCP proxy": its client-side inference sees IW 10 whatever the arm.
PROXIED_PROBE = "mumbai-1"
#: Census targets (ad hoc records, no campaign) and the IW each region's probes find; the last
#: target has only two determined records ("n too small") beside a lower bound.
CENSUS_TARGETS = {"https://cdn-a.example/big.bin": 10, "https://cdn-b.example/big.bin": 32, "https://small.example/": None}


@dataclass(frozen=True)
class PathSpec:
    name: str
    region: str
    country: str
    rtt_ms: float
    bandwidth_mbps: float
    loss_rate: float


PATHS: tuple[PathSpec, ...] = (
    PathSpec("kampala-1", "africa", "UG", 310.0, 1.0, 0.040),
    PathSpec("lagos-1", "africa", "NG", 220.0, 2.0, 0.020),
    PathSpec("saopaulo-1", "south-america", "BR", 150.0, 5.0, 0.010),
    PathSpec("lima-1", "south-america", "PE", 180.0, 3.0, 0.015),
    PathSpec("frankfurt-1", "europe", "DE", 25.0, 50.0, 0.0005),
    PathSpec("paris-1", "europe", "FR", 40.0, 20.0, 0.002),
    PathSpec("chicago-1", "north-america", "US", 70.0, 10.0, 0.005),
    PathSpec("mumbai-1", "asia", "IN", 110.0, 8.0, 0.008),
)


@dataclass(frozen=True)
class SeededDatabase:
    """The study's database (migrated, seeded, roll-ups refreshed) and what was seeded."""

    url: str
    summary: SeedSummary


@dataclass(frozen=True)
class SeedSummary:
    campaign_ids: dict[str, int]
    probe_ids: dict[str, uuid.UUID]
    n_trials: int
    n_trials_by_campaign: dict[str, int]
    first_day: dt.date
    last_day: dt.date


def slow_start_rounds(size: int, iw: int) -> int:
    segments = math.ceil(size / MSS)
    return max(1, math.ceil(math.log2(segments / iw + 1)))


def seed_study(session: Session, now: dt.datetime, *, repetitions: int = 4, seed: int = 7) -> SeedSummary:
    """Write the study; the caller commits and refreshes the roll-ups."""
    rng = np.random.default_rng(seed)
    stamped = now - dt.timedelta(minutes=5)  # received/joined well before the roll-up bound
    origin = Origin(
        id=uuid.uuid4(),
        name="origin-eu",
        region="europe",
        host="origin.example",
        version="1.0",
        arms=[{"iw": 3, "port": 8003}, {"iw": 10, "port": 8010}, {"iw": 16, "port": 8016}],
        secret_hash="x",
        last_seen_at=now,
    )
    session.add(origin)
    probes: dict[str, Probe] = {}
    for index, path in enumerate(PATHS):
        probe = Probe(
            id=uuid.uuid4(),
            name=path.name,
            region=path.region,
            country=path.country,
            asn=64500 + index,
            labels={},
            version="1.0.0",
            secret_hash="x",
            last_seen_at=now - dt.timedelta(minutes=3 + 17 * index),
            last_heartbeat={
                "version": "1.0.0",
                "spool_backlog": index * 3,
                "spool_bytes": index * 900,
                "uptime_s": 86400.0,
                "trials_measured": 500,
            },
        )
        probes[path.name] = probe
        session.add(probe)
    day0 = (now - dt.timedelta(days=3)).replace(hour=0, minute=0, second=0, microsecond=0)
    pilot = Campaign(
        name="pilot",
        origin_ids=[origin.id],
        probe_regions=None,
        arms=[3, 10],
        sizes=list(SIZES),
        size_dist=None,
        sizes_per_round=len(SIZES),
        repetitions=repetitions,
        interval_s=60.0,
        starts_at=day0,
        ends_at=None,
        calibrate=False,
    )
    higher = Campaign(
        name="higher-iw",
        origin_ids=[origin.id],
        probe_regions=None,
        arms=[3, 10, 16],
        sizes=list(SIZES),
        size_dist=None,
        sizes_per_round=len(SIZES),
        repetitions=repetitions,
        interval_s=60.0,
        starts_at=day0,
        ends_at=None,
        calibrate=False,
    )
    session.add_all([pilot, higher])
    session.flush()
    for path in PATHS:
        rtt_us = int(path.rtt_ms * 1000)
        bps = int(path.bandwidth_mbps * 1e6)
        session.add(
            PathEstimate(
                probe_id=probes[path.name].id,
                origin_id=origin.id,
                min_rtt_us=rtt_us,
                bottleneck_bps=bps,
                bdp_bytes=int(bps / 8 * rtt_us / 1e6),
                loss_rate=path.loss_rate,
                sample_count=50,
                updated_at=stamped,
            )
        )

    trials: list[dict[str, object]] = []
    for campaign in (pilot, higher):
        for path in PATHS:
            probe = probes[path.name]
            for round_number in range(repetitions * 3):
                day = round_number % 3
                for iw in campaign.arms:
                    for size in SIZES:
                        started = day0 + dt.timedelta(
                            days=day,
                            hours=int(rng.integers(0, 24)),
                            minutes=int(rng.integers(0, 60)),
                            seconds=float(rng.uniform(0, 60)),
                        )
                        trials.append(
                            _trial(rng, campaign.id, origin.id, probe.id, path, iw, size, round_number, started, stamped)
                        )
    session.execute(insert(TrialId), [{"trial_id": t["trial_id"], "started_at": t["started_at"]} for t in trials])
    session.execute(insert(Trial), trials)
    session.execute(insert(CensusRecord), _census(probes, day0, stamped))
    probe_ids = {name: probe.id for name, probe in probes.items()}
    store_twin_result(session, TwinResultIn.model_validate(twin_document(pilot.id, probe_ids, origin.id)))
    return SeedSummary(
        campaign_ids={"pilot": pilot.id, "higher-iw": higher.id},
        probe_ids={name: probe.id for name, probe in probes.items()},
        n_trials=len(trials),
        n_trials_by_campaign={c.name: sum(1 for t in trials if t["campaign_id"] == c.id) for c in (pilot, higher)},
        first_day=day0.date(),
        last_day=(day0 + dt.timedelta(days=2)).date(),
    )


def _mean_saving_ms(path: PathSpec, baseline_iw: int, iw: int) -> float:
    return sum((slow_start_rounds(size, baseline_iw) - slow_start_rounds(size, iw)) * path.rtt_ms for size in SIZES) / len(SIZES)


def _estimate(ms: float, n_pairs: int, *, prediction: bool = False) -> dict[str, object]:
    half = 0.08 * ms + 2.0
    return {"n_pairs": n_pairs, "ms": ms, "ci_ms": [ms - half, ms + half], "pct": None} | (
        {"prediction": True} if prediction else {}
    )


def twin_document(campaign_id: int, probe_ids: dict[str, uuid.UUID], origin_id: uuid.UUID) -> dict[str, Any]:
    """A lab twin's result for the pilot campaign as ``iwscope lab twin`` stores it: per path and
    RTT bucket the fit (IW10 over IW3: measured = slow start's saving, twin 5 % below it), IW16
    held out and IW32 predicted from slow start (the seed's own latency model).  Also the API
    tests' valid document (tests/predictions)."""
    paths, groups = [], {}
    for path in PATHS:
        order = int(bk.rtt_index(np.asarray([path.rtt_ms * 1000.0]))[0])
        label = bk.RTT_BUCKETS[order].label
        fit, held, wide = (_mean_saving_ms(path, 3, iw) for iw in (10, 16, 32))
        paths.append(
            {
                "path": {
                    "probe_id": str(probe_ids[path.name]),
                    "probe_name": path.name,
                    "region": path.region,
                    "origin_id": str(origin_id),
                    "trials": 216,
                    "rtt_ms": path.rtt_ms,
                    "rate_bps": path.bandwidth_mbps * 1e6,
                    "loss": path.loss_rate,
                    "buffer_bytes": None,
                    "buffer_fit": "no overflow seen",
                    "queue_seen_bytes": 3000,
                },
                "bucket": label,
                "fit": {"measured": _estimate(fit, 72), "twin": _estimate(0.95 * fit, 40, prediction=True), "overlap": True},
                "predicted": {
                    "32": _estimate(wide, 40, prediction=True) | {"beyond_fit": False},
                    "16": _estimate(held, 40, prediction=True) | {"beyond_fit": False},
                    "32p": _estimate(wide, 40, prediction=True) | {"beyond_fit": False},
                },
                "held_out": {"measured": _estimate(held, 72), "predicted": _estimate(held, 40, prediction=True), "overlap": True},
            }
        )
        groups.setdefault((order, label), []).append((fit, held, wide))
    buckets = []
    for (order, label), members in sorted(groups.items()):
        fit, held, wide = (sum(values) / len(members) for values in zip(*members, strict=True))
        n = 72 * len(members)
        buckets.append(
            {
                "bucket": label,
                "order": order,
                "paths": len(members),
                "fit": {
                    "paths": len(members),
                    "measured": _estimate(fit, n),
                    "twin": _estimate(0.95 * fit, n, prediction=True),
                    "overlap": True,
                },
                "predicted": {
                    "32": _estimate(wide, n, prediction=True),
                    "16": _estimate(held, n, prediction=True),
                    "32p": _estimate(wide, n, prediction=True),
                },
                "held_out": {
                    "paths": len(members),
                    "measured": _estimate(held, n),
                    "predicted": _estimate(held, n, prediction=True),
                    "overlap": True,
                },
            }
        )
    return {
        "campaign_id": campaign_id,
        "baseline_iw": 3,
        "treatment_iw": 10,
        # integers as results stored before arm labels were (read as "32", "16"), and a paced arm
        "what_if": [32, 16, "32p"],
        "compare_arm": 16,
        "twin_campaign_id": 1,
        "paths": paths,
        "buckets": buckets,
    }


def _census(probes: dict[str, Probe], day0: dt.datetime, stamped: dt.datetime) -> list[dict[str, object]]:
    """Every probe measured each census target once a day (records of no campaign)."""
    records: list[dict[str, object]] = []
    for url, iw in CENSUS_TARGETS.items():
        host = url.split("/")[2]
        for index, probe in enumerate(probes.values()):
            for day in range(3):
                if iw is None and (day > 0 or index > 2):
                    continue  # small.example: three records only
                determined = iw is not None or index < 2
                status = "ok" if determined else "lower_bound"
                segments = iw if iw is not None else (4 if determined else 7)
                records.append(
                    {
                        "census_id": uuid.uuid4(),
                        "probe_id": probe.id,
                        "campaign_id": None,
                        "round": day,
                        "url": url,
                        "host": host,
                        "measured_at": day0 + dt.timedelta(days=day, hours=index),
                        "status": status,
                        "iw_segments": segments,
                        "iw_bytes": segments * MSS,
                        "mss": MSS,
                        "reason": "" if determined else "object_ended",
                        "connections": 3,
                        "connections_ok": 3 if determined else 0,
                        "announced_mss": None,
                        "rtt_us": 50_000,
                        "family": "ipv4",
                        "tls_version": "TLSv1.3",
                        "http_status": 206,
                        "error_detail": None,
                        "received_at": stamped,
                    }
                )
    return records


def _client_iw(probe_name: str, iw: int, size: int) -> dict[str, object]:
    """What the probe's capture inferred: the arm's window (a lower bound when the object ended
    inside it), or 10 behind the proxy of :data:`PROXIED_PROBE`."""
    window = 10 if probe_name == PROXIED_PROBE else iw
    segments = math.ceil(size / MSS) + 1  # the head's own segment
    if segments <= window:
        return {
            "client_iw_status": "lower_bound",
            "client_iw_segments": segments,
            "client_iw_bytes": size,
            "client_iw_mss": MSS,
            "client_iw_reason": "object_ended",
        }
    return {
        "client_iw_status": "ok",
        "client_iw_segments": window,
        "client_iw_bytes": window * MSS,
        "client_iw_mss": MSS,
        "client_iw_reason": None,
    }


def _trial(
    rng: np.random.Generator,
    campaign_id: int,
    origin_id: uuid.UUID,
    probe_id: uuid.UUID,
    path: PathSpec,
    iw: int,
    size: int,
    round_number: int,
    started: dt.datetime,
    stamped: dt.datetime,
) -> dict[str, object]:
    rtt_us = path.rtt_ms * 1000
    segments = math.ceil(size / MSS)
    transfer_us = size * 8 / (path.bandwidth_mbps * 1e6) * 1e6
    latency_us = (slow_start_rounds(size, iw) * rtt_us + transfer_us) * float(rng.lognormal(0.0, 0.08))
    retrans_probability = min(0.6, path.loss_rate * segments * (1.0 + 0.02 * iw))
    retransmitted = bool(rng.random() < retrans_probability)
    if retransmitted:
        latency_us += rtt_us * float(rng.uniform(1.0, 2.0))
    failed = bool(rng.random() < 0.02)
    connect_us = rtt_us * float(rng.uniform(1.0, 1.1))
    base: dict[str, object] = {
        "trial_id": uuid.uuid4(),
        "started_at": started,
        "probe_id": probe_id,
        "campaign_id": campaign_id,
        "origin_id": origin_id,
        "round": round_number,
        "arm_iw": iw,
        "object_size": size,
        "url": f"http://origin.example:{8000 + iw}/bytes/{size}",
        "dns_us": 0,
        "syn_retrans": 0,
        "tcp_info": {},
        "received_at": stamped,
    }
    if failed:
        return base | {
            "connect_us": None,
            "ttfb_us": None,
            "total_us": None,
            "bytes_received": 0,
            "http_status": None,
            "error_kind": "timeout",
            "error_detail": "read timed out",
        }
    total_us = connect_us + 0.5 * rtt_us + latency_us
    # HTTPS on every other path: a 16 KB first flight (three rounds from IW3, two from IW10, one
    # from IW16) or a 2.4 KB one (one round from any IW)
    flight = 16_400 if path.rtt_ms >= 100 else 2_400
    handshake_us = slow_start_rounds(flight, iw) * rtt_us * float(rng.lognormal(0.0, 0.03))
    tls = {
        "tls_version": "TLSv1.3",
        "tls_handshake_us": int(handshake_us),
        "family": "ipv4",
        "server_tls_handshake_us": int(handshake_us - 0.5 * rtt_us),
        "server_tls_first_flight_bytes": flight,
        "server_tls_flight_acked_us": int(handshake_us - 0.5 * rtt_us),
    }
    return (
        base
        | tls
        | {
            "connect_us": int(connect_us),
            "ttfb_us": int(connect_us + rtt_us),
            "total_us": int(total_us),
            **_client_iw(path.name, iw, size),
            "bytes_received": size,
            "http_status": 200,
            "error_kind": None,
            "error_detail": None,
            "tcpi_rtt_us": int(rtt_us),
            "tcpi_min_rtt_us": int(rtt_us),
            "tcpi_total_retrans": 0,
            "server_latency_us": int(latency_us),
            "server_first_byte_us": int(0.2 * rtt_us),
            "server_total_retrans": 1 if retransmitted else 0,
            "server_bytes_retrans": MSS if retransmitted else 0,
            "server_bytes_sent": size + (MSS if retransmitted else 0),
            "server_snd_cwnd_at_accept": iw,
            "cwnd_mismatch": False,
            "rwnd_limited": False,
            "joined_at": stamped,
        }
    )
