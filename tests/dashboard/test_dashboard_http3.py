"""HTTP/3 (wire v9) from the analysis to the page: an HTTP/3 campaign beside the seeded study
(``tests/http3_seed.py``: TCP arms 3 and 10 with their QUIC arms in the same rounds, Caddy-like
census records) -- the paired TCP-vs-QUIC estimate is the seed's saving, the HTTP/3 page draws it
in headless Chromium, the IW-in-the-wild page names each protocol's window, the protocol filter
keeps one protocol on the Trials page and the roll-up figures stay TCP's."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from http3_seed import CENSUS_URL, HTTP3_PATHS, HTTP3_ROUNDS, Http3Seed, remove_http3, seed_http3
from sqlalchemy import create_engine, pool
from sqlalchemy.orm import Session
from test_dashboard_browser import TIMEOUT_MS, traces, wait_for_status

from iwscope.analysis import Filters, headline, trials_page
from iwscope.analysis.protocols import QUIC_ARMS, TCP_VS_QUIC, protocol_comparisons
from iwscope_dashboard.pagecheck import PAGES, check_page


@pytest.fixture(scope="module")
def http3(study_db: Any) -> Iterator[Http3Seed]:
    engine = create_engine(study_db.url, poolclass=pool.NullPool)
    try:
        with Session(engine) as session:
            seeded = seed_http3(session, dt.datetime.now(dt.UTC))
            session.commit()
        yield seeded
        with Session(engine) as session:
            remove_http3(session, seeded)
            session.commit()
    finally:
        engine.dispose()


def _filters(seeded: Http3Seed, **fields: Any) -> Filters:
    return Filters(campaign_ids=(seeded.campaign_id,), baseline_iw=3, treatment_iw=10, metric="client", **fields)


def test_tcp_against_quic_is_paired_per_round_and_size(http3: Http3Seed, study_session: Session) -> None:
    rows = protocol_comparisons(study_session, _filters(http3))
    tcp_quic = {(row.baseline.iw, row.lower): row for row in rows if row.dimension == TCP_VS_QUIC}
    assert sorted(tcp_quic) == [(3, 1024.0), (3, 16384.0), (10, 1024.0), (10, 16384.0)]
    pairs = len(HTTP3_PATHS) * HTTP3_ROUNDS
    for (iw, lower), row in tcp_quic.items():
        size = 2_000 if lower == 1024.0 else 30_000
        expected = http3.mean_saving_ms[(iw, size)]
        assert row.n_pairs == pairs and row.n_paths == len(HTTP3_PATHS) and not row.too_small, row
        assert row.baseline.n == row.treatment.n == pairs and row.baseline.iw == row.treatment.iw == iw
        # one trial per arm and cell: the paired estimate is the mean of the seeded savings
        assert row.abs_ms == pytest.approx(expected, abs=0.01), (iw, size)
        assert row.abs_ci_low is not None and row.abs_ci_high is not None
        assert row.abs_ci_low <= expected <= row.abs_ci_high
    # QUIC's smaller packets: 30 KB from IW 3 takes a round more than over TCP, so no saving there
    assert tcp_quic[(10, 1024.0)].abs_ms > 20 and abs(tcp_quic[(3, 16384.0)].abs_ms or 0.0) < 1.0  # type: ignore[operator]
    quic_arms = [row for row in rows if row.dimension == QUIC_ARMS]
    assert [(row.baseline.iw, row.treatment.iw, row.n_pairs) for row in quic_arms] == [(3, 10, pairs), (3, 10, pairs)]
    # one IW chosen twice: TCP against QUIC at it, no QUIC arm compared with itself
    same = protocol_comparisons(study_session, dataclasses.replace(_filters(http3), baseline_iw=10))
    assert {(row.dimension, row.baseline.iw) for row in same} == {(TCP_VS_QUIC, 10)}


def test_too_few_pairs_say_so(http3: Http3Seed, study_session: Session) -> None:
    """One path's trials (Europe's): 12 pairs per bucket, under MIN_PAIRS: counts, no number."""
    first_rounds = _filters(http3, regions=("europe",))
    rows = [row for row in protocol_comparisons(study_session, first_rounds) if row.dimension == TCP_VS_QUIC]
    assert rows and all(row.too_small and row.abs_ms is None and row.n_pairs == HTTP3_ROUNDS for row in rows), rows


def test_the_protocol_filter_keeps_one_protocol_and_rollups_stay_tcps(http3: Http3Seed, study_session: Session) -> None:
    quic, n_quic = trials_page(study_session, _filters(http3, protocol="quic"), limit=1000)
    tcp, n_tcp = trials_page(study_session, _filters(http3, protocol="tcp"), limit=1000)
    assert n_quic == len(quic) == http3.n_quic_trials and {row["protocol"] for row in quic} == {"quic"}
    assert n_tcp == len(tcp) == http3.n_trials - http3.n_quic_trials and {row["protocol"] for row in tcp} == {"tcp"}
    # the roll-ups hold TCP's plain arms only: for HTTP/3 they answer nothing rather than TCP
    assert headline(study_session, dataclasses.replace(Filters(), protocol="quic")).n_trials == 0
    assert (
        headline(study_session, dataclasses.replace(Filters(), protocol="tcp")).n_trials
        == headline(study_session, Filters()).n_trials
    )


def test_the_http3_page_draws_both_comparisons(
    page: Any, dashboard_server: Any, http3: Http3Seed, study_session: Session
) -> None:
    spec = next(spec for spec in PAGES if spec.path == "/http3")
    query = f"campaign={http3.campaign_id}&base=3&treat=10&metric=client"
    counts = check_page(page, dashboard_server.url, spec, query=query, empty_allowed=frozenset(), timeout_s=TIMEOUT_MS / 1000)
    assert all(count.ok and count.points > 0 for count in counts), counts
    message = wait_for_status(page, "http3")
    assert f"{2 * 2 * len(HTTP3_PATHS) * HTTP3_ROUNDS:,} TCP and HTTP/3 trials at IW10" in message, message
    assert page.text_content("#http3-tcp-heading") == "TCP IW10 against HTTP/3 IW10"
    assert page.text_content("#http3-arms-heading") == "HTTP/3: IW3 against IW10"
    expected = {
        row.bucket: row.abs_ms
        for row in protocol_comparisons(study_session, _filters(http3))
        if row.dimension == TCP_VS_QUIC and row.baseline.iw == 10
    }
    bars = traces(page, "http3-improvement-graph")[0]
    assert dict(zip(bars["x"], bars["y"], strict=True)) == pytest.approx(expected)
    names = {trace["name"] for trace in traces(page, "http3-means-graph")}
    assert names == {"TCP IW10 median", "HTTP/3 IW10 median"}


def test_the_wild_page_names_each_protocols_window(page: Any, dashboard_server: Any, http3: Http3Seed) -> None:
    page.goto(f"{dashboard_server.url}/wild?campaign={http3.campaign_id}")
    page.wait_for_selector("#wild-census-table td", timeout=TIMEOUT_MS)
    rows = page.eval_on_selector_all(
        "#wild-census-table tbody tr:has(td)",
        "rows => rows.map(r => Array.from(r.querySelectorAll('td')).slice(0, 3).map(c => c.innerText.trim()))",
    )
    assert sorted(rows) == [[CENSUS_URL, "HTTP/3", "32"], [CENSUS_URL, "TCP", "10"]], rows
    page.goto(f"{dashboard_server.url}/wild?campaign={http3.campaign_id}&proto=quic")
    page.wait_for_selector("#wild-census-table td", timeout=TIMEOUT_MS)
    protocols = page.eval_on_selector_all(
        "#wild-census-table tbody tr:has(td) td:nth-child(2)", "cells => cells.map(c => c.innerText.trim())"
    )
    assert protocols == ["HTTP/3"], protocols
