"""``/api/v1/analysis/passive/...`` on a real API process: a passive study seeded through the real
ingest (``POST /api/v1/passive/batch`` with an enrolled server's credential, a share change in
between), then every route read anonymously (401), with a read token and with an admin token
(200, answers valid against the published OpenAPI), and the numbers compared with a hand
computation on the seeded records (tests/realusers_seed.py)."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import jsonschema
import pytest
from realusers_seed import ARMS_PHASE1, Days, connections, days, hand, study
from sqlalchemy import text
from sqlalchemy.engine import Engine
from testkit import bearer

from iwprobe import wire
from iwscope.analysis.buckets import HIST_CENTER_US, hist_bin

IWSCOPE = [sys.executable, "-m", "iwscope.cli"]
ROUTES = ("campaigns", "summary", "buckets", "regions", "days", "share-sweep", "load")
BASE = "/api/v1/analysis/passive"


def create_token(service_env: dict[str, str], kind: str) -> str:
    completed = subprocess.run(
        [*IWSCOPE, "token", "create", "--kind", kind, "--label", "pytest passive analysis"],
        env=service_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.strip()


@dataclass(frozen=True)
class Seeded:
    url: str
    campaign_id: int
    server_id: str
    server_credential: str
    read_token: str
    admin_token: str
    when: Days
    phase0: list[dict[str, Any]]
    phase1: list[dict[str, Any]]
    raw_records: int


def enroll_server(client: httpx.Client, server_token: str) -> tuple[str, str]:
    response = client.post(
        wire.SERVER_ENROLL_PATH,
        headers=bearer(server_token),
        json={
            "name": f"web-{uuid.uuid4().hex[:6]}",
            "region": "eu-central",
            "ports": [80, 443],
            "version": "0.6.0",
            "kernel": "6.1.0-13-amd64",
        },
    )
    assert response.status_code == 201, response.text
    return response.json()["id"], response.json()["credential"]


def upload(
    client: httpx.Client,
    server_id: str,
    credential: str,
    aggregates: list[dict[str, Any]],
    raw: list[dict[str, Any]] | None = None,
) -> None:
    batch = {
        "wire_version": wire.WIRE_VERSION,
        "batch_id": wire.new_id(),
        "server_id": server_id,
        "sent_at": wire.utc_timestamp(),
        "aggregates": aggregates,
        "connections": raw or [],
    }
    response = client.post(wire.PASSIVE_BATCH_PATH, json=batch, headers=bearer(credential))
    assert response.status_code == 200, response.text
    assert response.json()["accepted"] == len(aggregates) + len(raw or [])


@pytest.fixture(scope="module")
def seeded(_api_server_process: Any, admin_token: str, service_env: dict[str, str], db_engine: Engine) -> Iterator[Seeded]:
    api = _api_server_process
    api.start()
    server_token, read_token = create_token(service_env, "server"), create_token(service_env, "read")
    when = days()
    with httpx.Client(base_url=api.url, timeout=60) as client:
        server_id, credential = enroll_server(client, server_token)
        created = client.post(
            "/api/v1/campaigns",
            headers=bearer(admin_token),
            json={
                "name": "real users (analysis test)",
                "server_ids": [server_id],
                "passive_arms": [
                    {"arm": "default", "share_bp": 9000},
                    {"arm": "16", "share_bp": 500},
                    {"arm": "32", "share_bp": 500},
                ],
                "starts_at": (when.day1 - dt.timedelta(hours=2)).isoformat(),
                "ends_at": (dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)).isoformat(),
            },
        )
        assert created.status_code == 201, created.text
        campaign_id = int(created.json()["id"])
        phase0, phase1 = study(server_id, campaign_id, when)
        raw = connections(server_id, campaign_id, when)
        upload(client, server_id, credential, phase0, raw)
        swept = client.patch(f"/api/v1/campaigns/{campaign_id}", headers=bearer(admin_token), json={"passive_arms": ARMS_PHASE1})
        assert swept.status_code == 200 and swept.json()["phase"] == 1, swept.text
        upload(client, server_id, credential, phase1)
    yield Seeded(api.url, campaign_id, server_id, credential, read_token, admin_token, when, phase0, phase1, len(raw))


def get(seeded: Seeded, route: str, token: str | None = None, **params: Any) -> httpx.Response:
    headers = bearer(token) if token else {}
    return httpx.get(
        f"{seeded.url}{BASE}/{route}", params={"campaign_id": seeded.campaign_id, **params}, headers=headers, timeout=60
    )


def valid(seeded: Seeded, route: str, answer: Any) -> None:
    """``answer`` validates against the 200 schema the route publishes."""
    document = httpx.get(f"{seeded.url}/openapi.json", timeout=30).json()
    schema = document["paths"][f"{BASE}/{route}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    jsonschema.Draft202012Validator({**schema, "components": document["components"]}).validate(answer)


# ---- access ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_needs_a_read_or_admin_token(seeded: Seeded, route: str) -> None:
    anonymous = get(seeded, route)
    assert anonymous.status_code == 401 and anonymous.headers["WWW-Authenticate"] == "Bearer"
    refused = [get(seeded, route, token).json() for token in ("garbage", seeded.server_credential, seeded.read_token + "x")]
    assert refused == [{"detail": "invalid credentials"}] * 3
    for token in (seeded.read_token, seeded.admin_token):
        answer = get(seeded, route, token)
        assert answer.status_code == 200, answer.text
        valid(seeded, route, answer.json())


def test_the_routes_are_typed_and_secured_in_the_openapi(seeded: Seeded) -> None:
    document = httpx.get(f"{seeded.url}/openapi.json", timeout=30).json()
    for route in ROUTES:
        operation = document["paths"][f"{BASE}/{route}"]["get"]
        assert operation["security"] == [{"HTTPBearer": []}], route
        assert "$ref" in operation["responses"]["200"]["content"]["application/json"]["schema"], route
    assert "401" in document["paths"][f"{BASE}/summary"]["get"]["responses"]


def test_a_revoked_read_token_is_refused(seeded: Seeded, service_env: dict[str, str]) -> None:
    token = create_token(service_env, "read")
    assert get(seeded, "summary", token).status_code == 200
    revoked = subprocess.run(
        [*IWSCOPE, "token", "revoke"],
        env={**service_env, "IWSCOPE_REVOKE_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert revoked.returncode == 0, revoked.stderr
    assert get(seeded, "summary", token).json() == {"detail": "invalid credentials"}


# ---- numbers -----------------------------------------------------------------------------------------


def close(value: float | None, expected: float | None, tolerance: float = 1e-9) -> bool:
    return (value is None) == (expected is None) and (value is None or abs(value - expected) <= tolerance * max(1, abs(expected)))  # type: ignore[operator]


def test_summary_equals_the_hand_computation(seeded: Seeded) -> None:
    summary = get(seeded, "summary", seeded.read_token, phase=0).json()["data"]
    expected = hand(seeded.phase0)
    assert (summary["campaign_id"], summary["baseline_arm"]) == (seeded.campaign_id, "default")
    arms = {row["arm"]: row for row in summary["overall"]["arms"]}
    assert list(arms) == ["default", "16", "32"]
    for arm in ("default", "16"):
        row, truth = arms[arm], expected[arm]
        assert (row["connections"], row["responses"], row["clusters"]) == (truth.connections, truth.responses, truth.clusters)
        assert row["iw"] == {"default": 10, "16": 16}[arm] and not row["too_small"]
        assert close(row["latency_ms"]["avg"]["value"], truth.avg_ms)
        for key in ("p50", "p75", "p90", "p99"):
            assert close(row["latency_ms"][key]["value"], truth.percentiles_ms[key]), (arm, key)
        for key in ("avg", "p50", "p75", "p90", "p99"):
            cell = row["latency_ms"][key]
            assert cell["low"] is not None and cell["low"] <= cell["value"] <= cell["high"], (arm, key, cell)
            assert cell["low"] > 0  # no latency below zero
    # the sums of cluster 1's two uploads add up: 20 + 4 responses of day 1, 20 of day 2
    assert expected["16"].responses == 12 * 40 + 4 + 5
    # Impr. = baseline - treatment, % Impr. over the baseline, intervals around them
    treated = arms["16"]
    for key in ("avg", "p50", "p90"):
        base = arms["default"]["latency_ms"][key]["value"]
        gain = treated["improvement_ms"][key]
        assert close(gain["value"], base - treated["latency_ms"][key]["value"])
        assert close(treated["improvement_pct"][key]["value"], 100.0 * gain["value"] / base)
        assert gain["low"] <= gain["value"] <= gain["high"]
    # 20 ms faster in every cluster; the clusters themselves spread over 55 ms and the arms are
    # resampled independently (different prefixes), so the interval is wide but holds the 20 ms
    assert 15 < treated["improvement_ms"]["p50"]["value"] < 25
    assert treated["improvement_ms"]["p50"]["low"] < 20 < treated["improvement_ms"]["p50"]["high"]
    assert arms["default"]["improvement_ms"] is None
    # IW32: 3 clusters < 5 -> n too small, counts but no number
    small = arms["32"]
    assert small["too_small"] and small["clusters"] == 3 and small["responses"] == expected["32"].responses
    assert small["latency_ms"]["p50"]["value"] is None and small["improvement_ms"]["avg"]["value"] is None
    # retransmissions: exact rates, the increase over the baseline in percentage points
    retrans = {row["arm"]: row for row in summary["retransmissions"]}
    for arm in ("default", "16"):
        assert close(retrans[arm]["retrans_rate"]["value"], expected[arm].retrans_rate)
        assert close(retrans[arm]["retrans_conn_share"]["value"], expected[arm].retrans_conn_share)
    increase = retrans["16"]["rate_increase_pp"]
    assert close(increase["value"], 100.0 * ((expected["16"].retrans_rate or 0) - (expected["default"].retrans_rate or 0)))
    assert increase["low"] <= increase["value"] <= increase["high"]
    assert retrans["32"]["too_small"] and retrans["32"]["retrans_rate"]["value"] is None
    # biased shares (every connection, whatever include_biased says)
    bias = {row["arm"]: row for row in summary["biased"]}
    assert bias["16"]["syn_retrans"] == 5 and bias["16"]["biased_connections"] == 5
    assert close(bias["16"]["syn_retrans_share"]["value"], expected["16"].syn_retrans_share)
    assert bias["default"]["syn_retrans_share"]["value"] == 0.0 and bias["default"]["syn_retrans_share"]["high"] > 0
    method = summary["method"]
    assert (method["replicates"], method["min_responses"], method["min_clusters"]) == (2000, 30, 5)
    assert method["hist_resolution_pct"] == pytest.approx(0.995, abs=0.001)


def test_biased_connections_can_be_left_out(seeded: Seeded) -> None:
    unbiased = get(seeded, "summary", seeded.read_token, phase=0, include_biased="false").json()["data"]
    arms = {row["arm"]: row for row in unbiased["overall"]["arms"]}
    truth = hand(seeded.phase0, lambda record: not record["biased"])
    assert arms["16"]["responses"] == truth["16"].responses == 12 * 40 + 4
    assert close(arms["16"]["latency_ms"]["avg"]["value"], truth["16"].avg_ms)
    assert not unbiased["method"]["include_biased"]
    # the biased shares still count the biased connections
    assert {row["arm"]: row for row in unbiased["biased"]}["16"]["biased_connections"] == 5


def test_filters_region_day_and_the_default_campaign(
    seeded: Seeded, db_engine: Engine, admin_token: str, service_env: dict[str, str]
) -> None:
    region = get(seeded, "summary", seeded.read_token, phase=0, region="BR").json()["data"]
    truth = hand(seeded.phase0, lambda record: record["region"] == "BR")
    assert {row["arm"]: row["responses"] for row in region["overall"]["arms"]} == {
        "default": truth["default"].responses,
        "16": truth["16"].responses,
        "32": 0,
    }
    day2 = get(seeded, "summary", seeded.read_token, phase=0, since=seeded.when.day2.isoformat()).json()["data"]
    assert {row["arm"]: row["responses"] for row in day2["overall"]["arms"]}["default"] == 12 * 20
    # both phases together: the baseline's n counts phase 1 too
    both = get(seeded, "summary", seeded.read_token).json()["data"]
    assert {row["arm"]: row["responses"] for row in both["overall"]["arms"]}["default"] == 12 * 20 * 3
    # without campaign_id: the passive campaign that started last (one made to start last here)
    with httpx.Client(base_url=seeded.url, timeout=60) as client:
        other_server, _ = enroll_server(client, create_token(service_env, "server"))
        later = client.post(
            "/api/v1/campaigns",
            headers=bearer(admin_token),
            json={
                "name": "real users later",
                "server_ids": [other_server],
                "passive_arms": ARMS_PHASE1,
                "starts_at": "2090-01-01T00:00:00+00:00",
                "ends_at": "2090-01-02T00:00:00+00:00",
            },
        )
        assert later.status_code == 201, later.text
    try:
        latest = httpx.get(f"{seeded.url}{BASE}/summary", headers=bearer(seeded.read_token), timeout=60).json()["data"]
        assert latest["campaign_id"] == later.json()["id"] and latest["overall"]["arms"][0]["responses"] == 0
        listed = get(seeded, "campaigns", seeded.read_token).json()["data"]
        assert listed[0]["campaign_id"] == later.json()["id"]
        mine = next(entry for entry in listed if entry["campaign_id"] == seeded.campaign_id)
        assert mine["aggregate_rows"] == len(seeded.phase0) + len(seeded.phase1) and mine["phase"] == 1
        assert mine["raw_records"] == seeded.raw_records
        assert mine["connections"] == sum(record["connections"] for record in seeded.phase0 + seeded.phase1)
    finally:
        with db_engine.begin() as connection:
            connection.execute(text("DELETE FROM campaigns WHERE id = :c"), {"c": later.json()["id"]})
    # a campaign that is not passive: nothing, not an error
    nothing = httpx.get(
        f"{seeded.url}{BASE}/summary", params={"campaign_id": 999_999_999}, headers=bearer(seeded.read_token), timeout=60
    ).json()["data"]
    assert nothing["campaign_name"] is None and nothing["overall"]["arms"] == []


def test_bad_parameters_are_422_not_500(seeded: Seeded) -> None:
    for params in (
        {"campaign_id": "0"},
        {"campaign_id": str(2**63)},
        {"region": "a\x00b"},
        {"family": "ipx"},
        {"baseline": "IW10"},
        {"treated_share_bp": "10001"},
        {"since": "yesterday"},
    ):
        answer = httpx.get(f"{seeded.url}{BASE}/summary", params=params, headers=bearer(seeded.read_token), timeout=60)
        assert answer.status_code == 422, (params, answer.text)
    odd = httpx.get(
        f"{seeded.url}{BASE}/summary",
        params={"since": "0001-01-01T00:00:00+05:00"},
        headers=bearer(seeded.read_token),
        timeout=60,
    )
    assert odd.status_code == 200, odd.text


def test_buckets_regions_and_days(seeded: Seeded) -> None:
    rtt = get(seeded, "buckets", seeded.read_token, phase=0, dimension="rtt").json()["data"]
    assert [row["group"] for row in rtt["rows"]] == ["<=100 ms", "<=500 ms"]
    assert rtt["unknown_connections"] == 4  # the default arm's row without a bucket
    even = {arm["arm"]: arm for arm in rtt["rows"][0]["arms"]}
    truth = hand(seeded.phase0, lambda record: record["rtt_bucket"] == 2)
    assert even["16"]["responses"] == truth["16"].responses
    assert close(even["16"]["mean_ms"]["value"], truth["16"].avg_ms)
    assert close(even["default"]["median_ms"]["value"], truth["default"].percentiles_ms["p50"])
    gain = even["16"]["mean_improvement_ms"]
    assert close(gain["value"], (truth["default"].avg_ms or 0) - (truth["16"].avg_ms or 0))
    assert gain["low"] <= gain["value"] <= gain["high"]
    assert even["32"]["too_small"] and even["32"]["mean_improvement_ms"]["value"] is None
    bandwidth = get(seeded, "buckets", seeded.read_token, phase=0, dimension="bandwidth").json()["data"]
    assert [row["group"] for row in bandwidth["rows"]] == ["<=5Mbit/s"]
    assert get(seeded, "buckets", seeded.read_token, dimension="colour").status_code == 422
    regions = {table["group"]: table for table in get(seeded, "regions", seeded.read_token, phase=0).json()["data"]}
    assert set(regions) == {"BR", "DE"}
    de = hand(seeded.phase0, lambda record: record["region"] == "DE")
    de_arms = {row["arm"]: row for row in regions["DE"]["arms"]}
    assert de_arms["default"]["responses"] == de["default"].responses
    assert close(de_arms["default"]["latency_ms"]["p90"]["value"], de["default"].percentiles_ms["p90"])
    assert de_arms["16"]["improvement_pct"]["avg"]["value"] > 0
    series = get(seeded, "days", seeded.read_token, phase=0).json()["data"]
    assert [row["group"] for row in series] == [seeded.when.day1.date().isoformat(), seeded.when.day2.date().isoformat()]
    first = {arm["arm"]: arm for arm in series[0]["arms"]}
    day1 = hand(seeded.phase0, lambda record: record["hour"].startswith(seeded.when.day1.date().isoformat()))
    assert close(first["default"]["mean_ms"]["value"], day1["default"].avg_ms)
    assert close(
        first["16"]["median_improvement_ms"]["value"],
        (day1["default"].percentiles_ms["p50"] or 0) - (day1["16"].percentiles_ms["p50"] or 0),
    )


def test_share_sweep_shows_the_default_arm_per_treated_share(seeded: Seeded) -> None:
    sweep = get(seeded, "share-sweep", seeded.read_token, phase=0).json()["data"]  # the phase filter does not apply
    assert (sweep["arm"], sweep["reference_share_bp"]) == ("default", 1000)
    points = {point["treated_share_bp"]: point for point in sweep["points"]}
    assert sorted(points) == [1000, 5000] and points[1000]["phases"] == [0] and points[5000]["phases"] == [1]
    before = hand(seeded.phase0, lambda record: record["arm"] == "default")["default"]
    after = hand(seeded.phase1)["default"]
    assert points[1000]["responses"] == before.responses and points[5000]["responses"] == after.responses
    assert close(points[5000]["mean_ms"]["value"], after.avg_ms) and close(points[1000]["mean_ms"]["value"], before.avg_ms)
    change = points[5000]["mean_change_ms"]
    assert close(change["value"], (after.avg_ms or 0) - (before.avg_ms or 0))
    assert 0 < change["low"] <= change["value"] <= change["high"]  # 9 ms slower, in every cluster
    median = points[5000]["median_change_ms"]
    assert close(median["value"], (after.percentiles_ms["p50"] or 0) - (before.percentiles_ms["p50"] or 0))
    assert points[1000]["mean_change_ms"] is None
    assert close(points[5000]["retrans_rate"]["value"], after.retrans_rate)


def test_collector_load_per_server_and_day(seeded: Seeded) -> None:
    load = get(seeded, "load", seeded.read_token).json()["data"]
    assert {row["server_id"] for row in load} == {seeded.server_id}
    by_day = {row["day"]: row for row in load}
    day1, day2 = seeded.when.day1.date().isoformat(), seeded.when.day2.date().isoformat()
    records = seeded.phase0 + seeded.phase1
    assert by_day[day1]["aggregate_rows"] == sum(record["hour"].startswith(day1) for record in records)
    assert by_day[day2]["aggregate_rows"] == sum(record["hour"].startswith(day2) for record in records)
    assert by_day[day1]["raw_rows"] == seeded.raw_records and by_day[day2]["raw_rows"] == 0
    assert by_day[day1]["connections"] == sum(record["connections"] for record in records if record["hour"].startswith(day1))
    assert by_day[day1]["aggregate_bytes"] > 100 * by_day[day1]["aggregate_rows"] > 0
    assert by_day[day1]["raw_bytes"] > 0 and by_day[day1]["raw_bytes_per_record"] > 100
    assert by_day[day1]["raw_share"] == pytest.approx(seeded.raw_records / by_day[day1]["connections"])


def test_histogram_reading_is_the_bin_centre(seeded: Seeded) -> None:
    """One bin, read at its centre: within +-1 % of the latency uploaded."""
    region = get(seeded, "summary", seeded.read_token, phase=0, region="DE", until=seeded.when.day1.isoformat()).json()["data"]
    arm = {row["arm"]: row for row in region["overall"]["arms"]}["default"]
    expected = HIST_CENTER_US[hist_bin(100_000 + 5_000 * 2)] / 1000.0  # clusters 0..5 at 100..125 ms: median 110
    assert arm["latency_ms"]["p50"]["value"] == pytest.approx(expected)
    assert abs(arm["latency_ms"]["p50"]["value"] / 110.0 - 1) <= 0.01
