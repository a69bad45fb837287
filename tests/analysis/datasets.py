"""Small fixed data sets for the analysis tests, inserted through the collector's models.

Every data set uses its own random campaign id, so concurrent or committed trials of other
tests in the same database never enter the numbers (all queries filter on that campaign).
"""

from __future__ import annotations

import datetime as dt
import random
import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from iwscope.models import Campaign, OriginObservation, PathEstimate, Probe, Trial, TrialId

UTC = dt.UTC
DAY = dt.datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
RECEIVED = dt.datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
JOINED = dt.datetime(2026, 1, 5, 12, 1, tzinfo=UTC)
MS = 1000
#: Where :func:`add_random_trials` starts by default.
RANDOM_START = dt.datetime(2026, 2, 1, tzinfo=UTC)


def new_campaign_id() -> int:
    return random.randint(10**9, 2 * 10**9)


def add_campaign(session: Session, campaign_id: int, name: str) -> None:
    session.add(
        Campaign(
            id=campaign_id,
            name=name,
            origin_ids=[],
            probe_regions=None,
            arms=[3, 10],
            sizes=[9000],
            size_dist=None,
            sizes_per_round=1,
            repetitions=1,
            interval_s=60.0,
            starts_at=DAY,
            ends_at=None,
            calibrate=False,
        )
    )


def add_probe(
    session: Session,
    region: str,
    name: str | None = None,
    country: str | None = None,
    backlog: int | None = None,
    probe_id: uuid.UUID | None = None,
) -> uuid.UUID:
    probe_id = probe_id or uuid.uuid4()
    session.add(
        Probe(
            id=probe_id,
            name=name or f"probe-{region}-{probe_id.hex[:6]}",
            region=region,
            country=country,
            asn=None,
            labels={},
            version="1.0.0",
            secret_hash="x",
            last_seen_at=RECEIVED,
            last_heartbeat=None if backlog is None else {"spool_backlog": backlog},
        )
    )
    return probe_id


def add_path(session: Session, probe_id: uuid.UUID, origin_id: uuid.UUID, rtt_ms: float, bps: int, loss: float) -> None:
    session.add(
        PathEstimate(
            probe_id=probe_id,
            origin_id=origin_id,
            min_rtt_us=int(rtt_ms * MS),
            bottleneck_bps=bps,
            bdp_bytes=int(bps / 8 * rtt_ms / 1000),
            loss_rate=loss,
            sample_count=10,
            updated_at=RECEIVED,
        )
    )


def add_trial(
    session: Session,
    *,
    campaign_id: int | None,
    probe_id: uuid.UUID,
    origin_id: uuid.UUID | None,
    iw: int,
    server_ms: float | None,
    size: int = 9000,
    client_extra_ms: float = 10.0,
    retrans: int | None = 0,
    bytes_retrans: int = 0,
    bytes_sent: int = 10000,
    error: str | None = None,
    started_at: dt.datetime = DAY,
    received_at: dt.datetime = RECEIVED,
    joined_at: dt.datetime | None = JOINED,
    round_: int = 0,
) -> uuid.UUID:
    """One trial; ``server_ms`` None with ``error`` = a failed fetch; ``joined_at`` None = not joined yet."""
    trial_id = uuid.uuid4()
    joined = joined_at is not None
    total_us = None if error or server_ms is None else int(round((server_ms + client_extra_ms) * MS))
    session.add(TrialId(trial_id=trial_id, started_at=started_at))
    session.add(
        Trial(
            trial_id=trial_id,
            started_at=started_at,
            probe_id=probe_id,
            campaign_id=campaign_id,
            origin_id=origin_id,
            round=round_,
            arm_iw=iw,
            object_size=size,
            url=f"http://origin/{size}",
            dns_us=None,
            connect_us=None,
            ttfb_us=None,
            total_us=total_us,
            bytes_received=0 if error else size,
            http_status=None if error else 200,
            error_kind=error,
            error_detail=None,
            syn_retrans=0,
            tcp_info={},
            received_at=received_at,
            server_latency_us=int(round(server_ms * MS)) if joined and server_ms is not None and not error else None,
            server_total_retrans=retrans if joined else None,
            server_bytes_retrans=bytes_retrans if joined and retrans is not None else None,
            server_bytes_sent=bytes_sent if joined and retrans is not None else None,
            joined_at=joined_at,
        )
    )
    return trial_id


def add_slow_start_pairs(
    session: Session,
    rng: random.Random,
    *,
    campaign_id: int | None,
    probe_id: uuid.UUID,
    origin_id: uuid.UUID,
    rtt_ms: float,
    pairs: int,
    **trial: Any,
) -> None:
    """``pairs`` IW 3 / IW 10 trials on one path: three and two round trips of ``rtt_ms`` (the
    default 9 KB object's slow start from each window), each x U(0.9, 1.3); ``trial``: more of
    :func:`add_trial`'s arguments."""
    for _ in range(pairs):
        for iw, rounds in ((3, 3), (10, 2)):
            add_trial(
                session,
                campaign_id=campaign_id,
                probe_id=probe_id,
                origin_id=origin_id,
                iw=iw,
                server_ms=rounds * rtt_ms * rng.uniform(0.9, 1.3),
                **trial,
            )


def add_observation(
    session: Session,
    trial_id: uuid.UUID,
    origin_id: uuid.UUID,
    iw: int,
    size: int,
    *,
    peer_rwnd: int | None = None,
    min_rtt_us: int | None = None,
    rtt_us: int | None = None,
    rwnd_limited: bool = False,
) -> None:
    """The origin's observation of a trial (what the join reads beside the trial's own columns)."""
    session.add(
        OriginObservation(
            trial_id=trial_id,
            origin_id=origin_id,
            arm_iw=iw,
            arm=None,
            port=8000 + iw,
            client_addr="192.0.2.0/24",
            object_size=size,
            request_at=DAY,
            first_byte_us=1000,
            response_latency_us=None,
            snd_cwnd_at_accept=iw,
            cwnd_mismatch=False,
            rwnd_limited=rwnd_limited,
            peer_rwnd=peer_rwnd,
            http_status=200,
            error_kind=None,
            tcpi_total_retrans=None,
            tcpi_bytes_retrans=None,
            tcpi_rtt_us=rtt_us,
            tcpi_min_rtt_us=min_rtt_us,
            tcpi_delivery_rate=None,
            tcpi_segs_out=None,
            tcpi_bytes_sent=None,
            tcpi_snd_cwnd=None,
            tcpi_snd_ssthresh=None,
            tcpi_busy_time_us=None,
            tcpi_rwnd_limited_us=None,
            tcpi_sndbuf_limited_us=None,
            tcp_info={},
            tls_version=None,
            tls_handshake_us=None,
            tls_first_flight_bytes=None,
            tls_flight_acked_us=None,
            family=None,
        )
    )


def add_random_trials(
    session: Session,
    rng: random.Random,
    campaign_id: int,
    probes: list[uuid.UUID],
    origin: uuid.UUID,
    count: int,
    received_at: dt.datetime,
    joined: bool,
    without_campaign: float = 0.1,
    join_delay: dt.timedelta = dt.timedelta(seconds=30),
    start: dt.datetime = RANDOM_START,
    span_hours: float = 72.0,
) -> list[uuid.UUID]:
    """``count`` random trials (arms 3, 10, 16; five sizes; 5 % failed; some without a
    campaign or an origin) started in ``span_hours`` from ``start``, received at ``received_at``
    and joined ``join_delay`` later when ``joined``."""
    ids = []
    for _ in range(count):
        error = "reset" if rng.random() < 0.05 else None
        retrans = rng.choice([0, 0, 0, 1, 3])
        ids.append(
            add_trial(
                session,
                campaign_id=None if rng.random() < without_campaign else campaign_id,
                probe_id=rng.choice(probes),
                origin_id=origin if rng.random() < 0.95 else None,
                iw=rng.choice([3, 10, 16]),
                server_ms=None if error else rng.lognormvariate(5.5, 0.6),
                size=rng.choice([1_000, 9_000, 15_000, 60_000, 300_000]),
                error=error,
                retrans=retrans,
                bytes_retrans=1448 * retrans,
                bytes_sent=rng.randint(1_000, 400_000),
                started_at=start + dt.timedelta(hours=rng.uniform(0, span_hours)),
                received_at=received_at,
                joined_at=received_at + join_delay if joined else None,
            )
        )
    session.flush()
    return ids


def delete_committed(engine: Engine, campaign_id: int, probes: list[uuid.UUID]) -> None:
    """Removes what a test committed: the campaign's trials and roll-ups, and ``probes``."""
    with Session(engine) as session, session.begin():
        session.execute(
            text("DELETE FROM trial_ids WHERE trial_id IN (SELECT trial_id FROM trials WHERE campaign_id = :c)"),
            {"c": campaign_id},
        )
        session.execute(text("DELETE FROM trials WHERE campaign_id = :c"), {"c": campaign_id})
        session.execute(text("DELETE FROM analysis_rollups WHERE campaign_id = :c"), {"c": campaign_id})
        session.execute(text("DELETE FROM analysis_bucket_rollups WHERE campaign_id = :c"), {"c": campaign_id})
        session.execute(text("DELETE FROM probes WHERE id = ANY(:p)"), {"p": probes})


@dataclass
class Fixed:
    """The hand-computed data set (see test_queries.py for the expected numbers)."""

    campaign_id: int
    origin_id: uuid.UUID
    africa: uuid.UUID
    europe: uuid.UUID
    south_america: uuid.UUID
    trial_ids: list[uuid.UUID] = field(default_factory=list)


def insert_fixed(session: Session) -> Fixed:
    """Three probes, one origin:

    * africa (RTT 300 ms, 1 Mbit/s, loss 2 %): IW3 900/1000/1100 ms (one with 2 retransmissions,
      2896 bytes), IW10 600/700/800 ms (two with retransmissions, 1448 bytes each), IW16 550 ms,
      plus one failed IW3 fetch;
    * europe (RTT 30 ms, 10 Mbit/s, loss 0): IW3 100/120 ms, IW10 80 ms (a bucket with one trial);
    * south-america (no path estimate): IW10 500 ms only (an arm with no data).

    All objects are 9000 bytes; probe-side total time = server latency + 10 ms.
    """
    campaign_id = new_campaign_id()
    add_campaign(session, campaign_id, f"fixed-{campaign_id}")
    origin_id = uuid.uuid4()
    fixed = Fixed(
        campaign_id,
        origin_id,
        add_probe(session, "africa", country="UG", backlog=3),
        add_probe(session, "europe"),
        add_probe(session, "south-america"),
    )
    add_path(session, fixed.africa, origin_id, 300, 1_000_000, 0.02)
    add_path(session, fixed.europe, origin_id, 30, 10_000_000, 0.0)

    def trial(probe: uuid.UUID, iw: int, server_ms: float | None, **extra: object) -> None:
        fixed.trial_ids.append(
            add_trial(session, campaign_id=campaign_id, probe_id=probe, origin_id=origin_id, iw=iw, server_ms=server_ms, **extra)
        )  # type: ignore[arg-type]

    trial(fixed.africa, 3, 900, retrans=2, bytes_retrans=2896)
    trial(fixed.africa, 3, 1000)
    trial(fixed.africa, 3, 1100)
    trial(fixed.africa, 3, None, error="timeout", retrans=None)
    trial(fixed.africa, 10, 600, retrans=1, bytes_retrans=1448)
    trial(fixed.africa, 10, 700, retrans=1, bytes_retrans=1448)
    trial(fixed.africa, 10, 800)
    trial(fixed.africa, 16, 550)
    trial(fixed.europe, 3, 100)
    trial(fixed.europe, 3, 120)
    trial(fixed.europe, 10, 80)
    trial(fixed.south_america, 10, 500)
    session.flush()
    return fixed


@dataclass
class CostPhase:
    """A cost experiment's phase (:func:`insert_cost_phase`): its campaign and bottleneck probe."""

    campaign_id: int
    probe_id: uuid.UUID
    region: str
    n_trials: int


def insert_cost_phase(session: Session, origin_id: uuid.UUID, region: str | None = None) -> CostPhase:
    """A competing-flow phase like ``make demo``'s: a campaign with Poisson arrivals and a background
    flow (a cost experiment), one probe behind the bottleneck in a region of its own (default
    ``fairness-<id>``, unique), short flows of IW3 and IW10 under load (3,000-3,350 ms: slow, as
    flows queueing behind a bulk flow are), 8 per arm of 15 and 50 KB, joined.  Roll-ups not refreshed."""
    campaign_id = new_campaign_id()
    session.add(
        Campaign(
            id=campaign_id,
            name=f"fairness IW3+10 load 0.7 ({campaign_id})",
            origin_ids=[origin_id],
            probe_regions=None,
            arms=[3, 10],
            sizes=[15_000, 50_000],
            size_dist=None,
            sizes_per_round=2,
            repetitions=1,
            interval_s=0.0,
            starts_at=DAY,
            ends_at=None,
            calibrate=True,
            arrival_rate_per_s=10.8,
            background_bytes=2_000_000,
            background_iw=3,
        )
    )
    region = region or f"fairness-{campaign_id}"
    probe_id = add_probe(session, region)
    add_path(session, probe_id, origin_id, 100, 4_000_000, 0.01)
    n = 0
    for iw in (3, 10):
        for index in range(8):
            add_trial(
                session,
                campaign_id=campaign_id,
                probe_id=probe_id,
                origin_id=origin_id,
                iw=iw,
                server_ms=3000.0 + 50 * index,
                size=(15_000, 50_000)[index % 2],
            )
            n += 1
    session.flush()
    return CostPhase(campaign_id, probe_id, region, n)
