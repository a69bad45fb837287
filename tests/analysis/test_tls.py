"""TLS handshakes by first-flight size: hand-computed data in a rolled-back transaction."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.analysis import Filters, headline, latency_vs_iw, rebuild_rollups, tls_by_flight
from iwscope.analysis.filters import NO_CAMPAIGN_MATCH, resolve_family
from iwscope.analysis.models import NO_CAMPAIGN
from iwscope.analysis.tls import flight_bucket

from .datasets import DAY, add_campaign, add_probe, add_trial, new_campaign_id


def _https(
    session: Session,
    *,
    campaign_id: int,
    probe_id: uuid.UUID,
    origin_id: uuid.UUID,
    iw: int,
    handshake_ms: float,
    flight: int | None,
    arm: str | None = None,
    error: str | None = None,
    tls: bool = True,
) -> None:
    trial_id = add_trial(
        session,
        campaign_id=campaign_id,
        probe_id=probe_id,
        origin_id=origin_id,
        iw=iw,
        server_ms=None if error else 50.0,
        error=error,
    )
    session.flush()
    session.execute(
        text(
            "UPDATE trials SET tls_version = :version, tls_handshake_us = :client, server_tls_handshake_us = :server, "
            "server_tls_first_flight_bytes = :flight, family = 'ipv6', arm = :arm WHERE trial_id = :id"
        ),
        {
            "version": "TLSv1.3" if tls else None,
            "client": int(handshake_ms * 1000) if tls else None,
            "server": int((handshake_ms - 2) * 1000) if tls else None,
            "flight": flight,
            "arm": arm,
            "id": trial_id,
        },
    )


def test_handshakes_are_compared_per_first_flight_bucket_on_the_paired_design(db_session: Session) -> None:
    campaign_id = new_campaign_id()
    add_campaign(db_session, campaign_id, "tls")
    origin = uuid.uuid4()
    paths = [add_probe(db_session, "tls-region"), add_probe(db_session, "tls-region")]
    db_session.flush()
    for offset, probe in zip((0, 20), paths, strict=True):
        for i in range(12):  # a 16 KB flight: three rounds from IW3, two from IW10 (one RTT of 200 ms)
            _https(
                db_session,
                campaign_id=campaign_id,
                probe_id=probe,
                origin_id=origin,
                iw=3,
                handshake_ms=600 + offset + i,
                flight=16_400,
            )
            _https(
                db_session,
                campaign_id=campaign_id,
                probe_id=probe,
                origin_id=origin,
                iw=10,
                handshake_ms=400 + offset + i,
                flight=16_400,
            )
    for i in range(12):  # a 2.4 KB flight fits both: a tie
        for iw in (3, 10):
            _https(
                db_session,
                campaign_id=campaign_id,
                probe_id=paths[0],
                origin_id=origin,
                iw=iw,
                handshake_ms=200 + 0.1 * i,
                flight=2_400,
            )
    # none of these count: a failed fetch, a paced arm, plain HTTP, no joined observation
    _https(
        db_session,
        campaign_id=campaign_id,
        probe_id=paths[0],
        origin_id=origin,
        iw=3,
        handshake_ms=9e3,
        flight=16_400,
        error="reset",
    )
    _https(
        db_session,
        campaign_id=campaign_id,
        probe_id=paths[0],
        origin_id=origin,
        iw=10,
        handshake_ms=9e3,
        flight=16_400,
        arm="10p",
    )
    _https(
        db_session, campaign_id=campaign_id, probe_id=paths[0], origin_id=origin, iw=3, handshake_ms=9e3, flight=16_400, tls=False
    )
    _https(db_session, campaign_id=campaign_id, probe_id=paths[0], origin_id=origin, iw=3, handshake_ms=9e3, flight=None)

    result = {row.bucket: row for row in tls_by_flight(db_session, Filters(campaign_ids=(campaign_id,), metric="client"))}
    assert set(result) == {"<=3 KB", "<=20 KB"}
    large = result["<=20 KB"]
    assert (large.baseline.n, large.treatment.n, large.n_pairs, large.n_paths) == (24, 24, 24, 2)
    assert large.baseline.mean_ms == pytest.approx(615.5) and large.treatment.mean_ms == pytest.approx(415.5)
    assert large.abs_ms == pytest.approx(200.0) and large.pct == pytest.approx(100 * 200 / 615.5)
    assert large.method == "within-path" and large.abs_ci_low <= 200.0 <= large.abs_ci_high
    assert large.abs_ci_high - large.abs_ci_low < 10.0
    tie = result["<=3 KB"]
    # 12 pairs: "n too small", no improvement claimed; the arms' own numbers tie
    assert tie.n_pairs == 12 and tie.too_small and tie.abs_ms is None and tie.abs_ci_low is None
    assert tie.baseline.mean_ms == pytest.approx(tie.treatment.mean_ms)
    # the origin's side: the same differences from its own clock (2 ms less each)
    server = {row.bucket: row for row in tls_by_flight(db_session, Filters(campaign_ids=(campaign_id,)))}
    assert server["<=20 KB"].baseline.mean_ms == pytest.approx(613.5) and server["<=20 KB"].abs_ms == pytest.approx(200.0)
    # filters apply: another region, another arm pair, a window after the trials
    assert tls_by_flight(db_session, Filters(campaign_ids=(campaign_id,), regions=("elsewhere",))) == []
    assert tls_by_flight(db_session, Filters(campaign_ids=(campaign_id,), treatment_iw=32))[0].treatment.n == 0
    assert tls_by_flight(db_session, Filters(campaign_ids=(campaign_id,), since=DAY + dt.timedelta(days=1))) == []


def test_flight_buckets_put_iw10s_first_window_on_an_edge() -> None:
    assert flight_bucket(14_480) == flight_bucket(10_001) and flight_bucket(14_481) == flight_bucket(20_000)
    assert flight_bucket(2_999) == 0 and flight_bucket(10**6) == 8


def test_the_family_filter_keeps_the_campaigns_measured_over_it(db_session: Session) -> None:
    ipv6, ipv4, either = new_campaign_id(), new_campaign_id(), new_campaign_id()
    for campaign_id, family in ((ipv6, "ipv6"), (ipv4, "ipv4"), (either, None)):
        add_campaign(db_session, campaign_id, f"family-{family}")
        db_session.flush()
        db_session.execute(text("UPDATE campaigns SET family = :f WHERE id = :c"), {"f": family, "c": campaign_id})
    assert resolve_family(db_session, Filters()) == Filters()
    over_ipv6 = resolve_family(db_session, Filters(family="ipv6"))
    assert ipv6 in over_ipv6.campaign_ids and not {ipv4, either} & set(over_ipv6.campaign_ids)
    # with campaigns chosen as well: their intersection; none left: no campaign at all, not every one
    assert resolve_family(db_session, Filters(campaign_ids=(ipv6, ipv4), family="ipv4")).campaign_ids == (ipv4,)
    # (not the roll-ups' trials of no campaign either: their key is 0)
    loose = add_probe(db_session, f"family-none-{either}")
    for iw in (3, 10):
        add_trial(db_session, campaign_id=None, probe_id=loose, origin_id=None, iw=iw, server_ms=50.0)
    db_session.flush()
    rebuild_rollups(db_session)
    assert latency_vs_iw(db_session, Filters(campaign_ids=(NO_CAMPAIGN,))) != []  # they are in the roll-ups
    nothing = resolve_family(db_session, Filters(campaign_ids=(either,), family="ipv6"))
    assert latency_vs_iw(db_session, nothing) == [] and headline(db_session, nothing).n_trials == 0
    assert nothing.campaign_ids == (NO_CAMPAIGN_MATCH,)
    assert Filters.from_query({"family": "ipv6"}).family == "ipv6" and Filters.from_query({"family": "x"}).family == ""
