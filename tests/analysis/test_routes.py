"""The /api/v1/analysis endpoints on a real API process, over the fixed data set (committed)."""

from __future__ import annotations

import csv
import datetime as dt
import io
import time
from collections.abc import Iterator
from typing import Protocol

import httpx
import pytest
from sqlalchemy import create_engine, pool, text
from sqlalchemy.orm import Session

from iwscope.analysis import refresh_rollups

from .datasets import DAY, Fixed, insert_cost_phase, insert_fixed


@pytest.fixture
def committed_fixed(database_url: str) -> Iterator[Fixed]:
    engine = create_engine(database_url, poolclass=pool.NullPool)
    with Session(engine) as session, session.begin():
        fixed = insert_fixed(session)
        # stamp them as the ingest path would (received now) so the watermark cannot have passed them
        session.execute(
            text("UPDATE trials SET received_at = now(), joined_at = now() WHERE campaign_id = :c"), {"c": fixed.campaign_id}
        )
    time.sleep(1.1)  # past the refresh's safety margin
    with Session(engine) as session, session.begin():
        refresh_rollups(session)
    try:
        yield fixed
    finally:
        with Session(engine) as session, session.begin():
            session.execute(text("DELETE FROM trial_ids WHERE trial_id = ANY(:ids)"), {"ids": fixed.trial_ids})
            session.execute(text("DELETE FROM trials WHERE campaign_id = :c"), {"c": fixed.campaign_id})
            session.execute(text("DELETE FROM analysis_rollups WHERE campaign_id = :c"), {"c": fixed.campaign_id})
            session.execute(text("DELETE FROM analysis_bucket_rollups WHERE campaign_id = :c"), {"c": fixed.campaign_id})
            session.execute(text("DELETE FROM path_estimates WHERE origin_id = :o"), {"o": fixed.origin_id})
            session.execute(text("DELETE FROM campaigns WHERE id = :c"), {"c": fixed.campaign_id})
            session.execute(
                text("DELETE FROM probes WHERE id = ANY(:p)"), {"p": [fixed.africa, fixed.europe, fixed.south_america]}
            )
        engine.dispose()


def test_analysis_endpoints(api_server, committed_fixed: Fixed) -> None:
    base = f"{api_server.url}/api/v1/analysis"
    campaign = str(committed_fixed.campaign_id)
    with httpx.Client(timeout=30) as client:
        compare = client.get(f"{base}/compare", params={"campaign": campaign, "dimension": "rtt"})
        assert compare.status_code == 200, compare.text
        buckets = {row["bucket"]: row for row in compare.json()["data"]}
        assert buckets["<=500 ms"]["baseline"]["mean_ms"] == pytest.approx(1000.0)
        assert (buckets["<=500 ms"]["n_pairs"], buckets["<=500 ms"]["too_small"], buckets["<=500 ms"]["abs_ms"]) == (
            3,
            True,
            None,
        )
        assert buckets["<=50 ms"]["treatment"]["n"] == 1
        table = client.get(f"{base}/percentiles", params={"campaign": campaign}).json()["data"][0]
        assert table["retrans_increase_pp"] == pytest.approx(20.0)
        top = client.get(f"{base}/headline", params={"campaign": campaign, "metric": "client"}).json()["data"]
        assert (top["n_pairs"], top["too_small"], top["pct"]) == (4, True, None)
        cdf = client.get(f"{base}/cdf", params={"campaign": campaign}).json()["data"]
        assert sorted(cdf) == ["10", "16", "3"]
        assert client.get(f"{base}/fairness", params={"campaign": campaign}).json() == {"data": []}
        # malformed filters fall back to defaults; a bad dimension is a clear 422
        parsed = client.get(f"{base}/filters", params={"campaign": "x", "base": "-1", "metric": "?"}).json()
        assert parsed["query"] == {"base": "3", "treat": "10", "metric": "server"}
        bad = client.get(f"{base}/compare", params={"dimension": "colour"})
        assert bad.status_code == 422 and "dimension" in bad.text
        page = client.get(f"{base}/trials", params={"campaign": campaign, "limit": 5}).json()
        assert page["total"] == 12 and len(page["data"]) == 5
        csv_text = client.get(f"{base}/trials.csv", params={"campaign": campaign, "region": "europe"}).text
        assert csv_text.count("\n") == 1 + 3
        fit = client.get(f"{base}/model-fit", params={"campaign": campaign, "cc": "bbr"})
        assert fit.status_code == 200, fit.text
        assert (fit.json()["data"]["cc"], fit.json()["data"]["treatment_iw"]) == ("bbr", 10)
        assert {path["region"] for path in fit.json()["data"]["paths"]} == {"africa", "europe", "south-america"}
        assert all(path["too_small"] and path["predicted_ms"] is None for path in fit.json()["data"]["paths"])
        bad_cc = client.get(f"{base}/model-fit", params={"cc": "vegas"})
        assert bad_cc.status_code == 422 and "cc" in bad_cc.text
        fleet = {row["probe_id"]: row for row in client.get(f"{base}/fleet").json()["data"]}
        assert fleet[str(committed_fixed.africa)]["trials_total"] == 8


def test_the_read_api_leaves_cost_trials_out_unless_cost_1(api_server, database_url: str, committed_fixed: Fixed) -> None:
    """``cost=1`` in the query puts a cost experiment's trials into the benefit figures; without
    it they stay out, also when the cost campaign is named."""
    engine = create_engine(database_url, poolclass=pool.NullPool)
    with Session(engine) as session, session.begin():
        phase = insert_cost_phase(session, committed_fixed.origin_id)
        session.execute(
            text("UPDATE trials SET received_at = now(), joined_at = now() WHERE campaign_id = :c"), {"c": phase.campaign_id}
        )
    time.sleep(1.1)  # past the refresh's safety margin
    try:
        with Session(engine) as session, session.begin():
            refresh_rollups(session)
        campaigns = f"{committed_fixed.campaign_id},{phase.campaign_id}"
        with httpx.Client(timeout=30) as client:

            def n_trials(**query: str) -> int:
                answer = client.get(f"{api_server.url}/api/v1/analysis/headline", params=query)
                assert answer.status_code == 200, answer.text
                return int(answer.json()["data"]["n_trials"])

            assert n_trials(campaign=campaigns) == 12  # the fixed set's trials only
            assert n_trials(campaign=campaigns, cost="1") == 12 + phase.n_trials
            assert n_trials(campaign=str(phase.campaign_id)) == 0
            assert n_trials(campaign=str(phase.campaign_id), cost="1") == phase.n_trials
    finally:
        with Session(engine) as session, session.begin():
            chosen = {"c": phase.campaign_id}
            session.execute(
                text("DELETE FROM trial_ids WHERE trial_id IN (SELECT trial_id FROM trials WHERE campaign_id = :c)"), chosen
            )
            for table in ("trials", "analysis_rollups", "analysis_bucket_rollups"):
                session.execute(text(f"DELETE FROM {table} WHERE campaign_id = :c"), chosen)
            session.execute(text("DELETE FROM campaigns WHERE id = :c"), chosen)
            session.execute(text("DELETE FROM path_estimates WHERE probe_id = :p"), {"p": phase.probe_id})
            session.execute(text("DELETE FROM probes WHERE id = :p"), {"p": phase.probe_id})
        engine.dispose()


class Served(Protocol):
    """What these tests use of the session's API process (``api_server``, tests/conftest.py)."""

    url: str


def test_both_csv_exports_include_a_trial_started_at_until(api_server: Served, committed_fixed: Fixed) -> None:
    """``since`` and ``until`` are inclusive in ``/api/v1/trials.csv`` and ``/api/v1/analysis/trials.csv``
    alike (every trial of the fixed set started at ``DAY``)."""
    campaign = str(committed_fixed.campaign_id)
    just_before = (DAY - dt.timedelta(microseconds=1)).isoformat()
    exports = (
        (f"{api_server.url}/api/v1/trials.csv", {"campaign_id": campaign}),
        (f"{api_server.url}/api/v1/analysis/trials.csv", {"campaign": campaign}),
    )
    with httpx.Client(timeout=30) as client:
        for url, query in exports:
            answer = client.get(url, params={**query, "since": DAY.isoformat(), "until": DAY.isoformat()})
            assert answer.status_code == 200, answer.text
            rows = list(csv.DictReader(io.StringIO(answer.text)))
            assert {row["trial_id"] for row in rows} == {str(trial_id) for trial_id in committed_fixed.trial_ids}, url
            assert client.get(url, params={**query, "until": just_before}).text.count("\n") == 1, url  # header only
