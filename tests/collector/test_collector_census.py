"""Wire v5: trials' client-side IW inference and census records -- validated, stored, replayed,
scheduled, analysed (``/analysis/census``, ``/analysis/iw-check``)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import httpx
import jsonschema
import pytest
from sqlalchemy import Engine, text
from testkit import (
    Enrolled,
    bearer,
    census_record,
    enroll_origin,
    enroll_probe,
    make_batch,
    make_observation,
    make_trial,
    wait_for,
)

from iwprobe import wire


def v5_batch(probe_id: str, trials: list[dict[str, Any]], census: list[dict[str, Any]]) -> dict[str, Any]:
    batch = make_batch(probe_id, trials)
    batch["wire_version"] = 5
    batch["census"] = census
    return batch


def census_campaign(client: httpx.Client, admin_token: str, urls: list[str], **extra: Any) -> httpx.Response:
    now = dt.datetime.now(dt.UTC)
    return client.post(
        "/api/v1/campaigns",
        headers=bearer(admin_token),
        json={
            "name": "census",
            "census_urls": urls,
            "repetitions": 2,
            "interval_s": 60,
            "starts_at": (now - dt.timedelta(minutes=1)).isoformat(),
            "ends_at": (now + dt.timedelta(hours=1)).isoformat(),
            **extra,
        },
    )


def test_client_iw_and_census_records_are_stored_once_and_checked(
    client: httpx.Client, enroll_token: str, origin_token: str, db_engine: Engine
) -> None:
    probe = enroll_probe(client, enroll_token)
    origin = enroll_origin(client, origin_token)
    inferred = make_trial(
        probe.id, origin.id, arm_iw=10, client_iw={"status": "ok", "segments": 10, "bytes": 14_480, "mss": 1448, "reason": ""}
    )
    bounded = make_trial(
        probe.id,
        origin.id,
        arm_iw=10,
        client_iw={"status": "lower_bound", "segments": 4, "bytes": 5_000, "mss": 1448, "reason": "object_ended"},
    )
    plain = make_trial(probe.id, origin.id, arm_iw=3)
    records = [
        census_record(probe.id),
        census_record(probe.id, status="undetermined", iw_segments=None, iw_bytes=None, reason="bottleneck", connections_ok=0),
    ]
    batch = v5_batch(probe.id, [inferred, bounded, plain], records)

    # Each bad record refuses the whole batch, naming it; nothing is stored.
    def refused(change: Any, status: int, needle: str) -> None:
        bad = v5_batch(probe.id, [make_trial(probe.id, origin.id)], [census_record(probe.id)])
        change(bad)
        answer = client.post(wire.TRIALS_BATCH_PATH, json=bad, headers=probe.headers)
        assert answer.status_code == status and needle in answer.text, answer.text

    refused(lambda b: b["census"][0].update(iw_segments=None), 422, "needs a segment count")
    refused(lambda b: b["census"][0].update(status="undetermined", reason="loss"), 422, "no segment count")
    refused(lambda b: b["census"][0].update(url="https:///no-host"), 422, "with a host")
    refused(lambda b: b["census"][0].update(url="ftp://example.org/x"), 422, "url")
    refused(lambda b: b["census"][0].update(connections_ok=4), 422, "connections_ok")
    refused(lambda b: b["census"][0].update(reason="Not A Word"), 422, "reason")
    refused(lambda b: b["census"][0].update(campaign_id=987_654_321), 422, "unknown campaign")
    refused(lambda b: b["census"][0].update(probe_id=str(uuid.uuid4())), 403, "census")
    refused(
        lambda b: b["trials"][0].update(client_iw={"status": "ok", "segments": None, "bytes": None, "mss": None, "reason": ""}),
        422,
        "client_iw",
    )
    refused(
        lambda b: b["trials"][0].update(client_iw={"status": "maybe", "segments": 3, "bytes": None, "mss": None, "reason": ""}),
        422,
        "status",
    )
    with db_engine.connect() as connection:
        assert (
            connection.execute(text("SELECT count(*) FROM census_records WHERE probe_id = :p"), {"p": probe.id}).scalar_one() == 0
        )

    first = client.post(wire.TRIALS_BATCH_PATH, json=batch, headers=probe.headers)
    assert first.status_code == 200, first.text
    assert (first.json()["accepted"], first.json()["duplicates"]) == (5, 0)
    again = client.post(wire.TRIALS_BATCH_PATH, json={**batch, "batch_id": wire.new_id()}, headers=probe.headers)
    assert (again.json()["accepted"], again.json()["duplicates"]) == (0, 5)
    with db_engine.connect() as connection:
        rows = {
            row[0]: tuple(row[1:])
            for row in connection.execute(
                text(
                    "SELECT trial_id::text, client_iw_status, client_iw_segments, client_iw_bytes, client_iw_mss, "
                    "client_iw_reason FROM trials WHERE probe_id = :p"
                ),
                {"p": probe.id},
            )
        }
        stored = connection.execute(
            text(
                "SELECT url, host, status, iw_segments, reason, family, tls_version, http_status FROM census_records "
                "WHERE probe_id = :p ORDER BY status"
            ),
            {"p": probe.id},
        ).all()
    assert rows[inferred["trial_id"]] == ("ok", 10, 14_480, 1448, None)
    assert rows[bounded["trial_id"]] == ("lower_bound", 4, 5_000, 1448, "object_ended")
    assert rows[plain["trial_id"]] == (None, None, None, None, None)
    assert [tuple(row) for row in stored] == [
        ("https://example.org/big", "example.org", "ok", 10, "", "ipv4", "TLSv1.3", 206),
        ("https://example.org/big", "example.org", "undetermined", None, "bottleneck", "ipv4", "TLSv1.3", 206),
    ]


def test_census_campaigns_are_validated_and_scheduled_to_wire_v5_probes_only(
    client: httpx.Client, enroll_token: str, origin_token: str, admin_token: str
) -> None:
    region = f"census-{uuid.uuid4().hex[:6]}"
    probe = enroll_probe(client, enroll_token, region=region)
    origin = enroll_origin(client, origin_token)
    urls = ["https://example.org/big", "http://192.0.2.7:8080/large.bin"]
    for extra, needle in (
        ({"origin_ids": [origin.id]}, "no origin_ids"),
        ({"arms": [3, 10]}, "no origin_ids"),
        ({"sizes": [1000]}, "does not take sizes"),
        ({"target_ci_ms": 5}, "target_ci_ms"),
    ):
        answer = census_campaign(client, admin_token, urls, **extra)
        assert answer.status_code == 422 and needle in answer.text, answer.text
    for bad_urls, needle in (
        (["ftp://example.org/x"], "census_urls"),
        (["https://user:pw@example.org/x"], "credentials"),
        ([urls[0], urls[0]], "repeat"),
        ([], "census_urls"),
        (["https://"], "host"),
    ):
        answer = census_campaign(client, admin_token, bad_urls)
        assert answer.status_code == 422 and needle in answer.text, (bad_urls, answer.text)
    ordinary = client.post(
        "/api/v1/campaigns",
        headers=bearer(admin_token),
        json={"name": "no origins", "arms": [3], "sizes": [1], "starts_at": wire.utc_timestamp()},
    )
    assert ordinary.status_code == 422 and "origin" in ordinary.text

    created = census_campaign(client, admin_token, urls, probe_regions=[region], family="ipv4")
    assert created.status_code == 201, created.text
    body = created.json()
    assert (body["census_urls"], body["origin_ids"], body["arms"], body["sizes"]) == (urls, [], [], None)

    def schedule(version: int) -> dict[int, dict[str, Any]]:
        answer = client.get(
            wire.PROBE_SCHEDULE_PATH.format(probe_id=probe.id) + f"?wire_version={version}", headers=probe.headers
        )
        assert answer.status_code == 200, answer.text
        return {entry["campaign_id"]: entry for entry in answer.json()["campaigns"]}

    entry = schedule(5)[body["id"]]
    assert (entry["census_urls"], entry["targets"], entry["family"]) == (urls, [], "ipv4")
    for version in (4, 3, 2):
        assert body["id"] not in schedule(version)


def _upload(client: httpx.Client, probe: Enrolled, trials: list[dict[str, Any]], census: list[dict[str, Any]]) -> None:
    answer = client.post(wire.TRIALS_BATCH_PATH, json=v5_batch(probe.id, trials, census), headers=probe.headers)
    assert answer.status_code == 200, answer.text


def test_census_and_iw_check_analysis(
    client: httpx.Client, enroll_token: str, origin_token: str, admin_token: str, celery_worker: Any
) -> None:
    created = census_campaign(client, admin_token, ["https://a.example/big", "https://b.example/big"])
    campaign_id = created.json()["id"]
    europe_region, asia_region = f"eu-{uuid.uuid4().hex[:4]}", f"as-{uuid.uuid4().hex[:4]}"
    europe = enroll_probe(client, enroll_token, region=europe_region)
    asia = enroll_probe(client, enroll_token, region=asia_region)
    # a.example: IW 10 everywhere (one odd 16); b.example: only lower bounds and 2 determined: n too small.
    _upload(
        client,
        europe,
        [],
        [census_record(europe.id, "https://a.example/big", campaign_id, round=r) for r in range(4)]
        + [
            census_record(
                europe.id,
                "https://b.example/big",
                campaign_id,
                status="lower_bound",
                iw_segments=7,
                reason="client_data",
                connections_ok=0,
            ),
            census_record(europe.id, "https://b.example/big", campaign_id, iw_segments=32),
        ],
    )
    _upload(
        client,
        asia,
        [],
        [
            census_record(asia.id, "https://a.example/big", campaign_id, round=r, iw_segments=16 if r == 0 else 10)
            for r in range(3)
        ]
        + [census_record(asia.id, "https://b.example/big", campaign_id, iw_segments=32)],
    )
    answer = client.get(f"/api/v1/analysis/census?campaign={campaign_id}")
    assert answer.status_code == 200, answer.text
    validate_against_openapi(client, "/api/v1/analysis/census", answer.json())
    targets = {target["url"]: target for target in answer.json()["data"]}
    a, b = targets["https://a.example/big"]["overall"], targets["https://b.example/big"]["overall"]
    assert (a["iw_segments"], a["ok"], a["records"], a["values"]) == (10, 7, 7, {"10": 6, "16": 1})
    assert a["share"] == pytest.approx(6 / 7) and 0 < a["share_ci_low"] < 6 / 7 < a["share_ci_high"] <= 1
    assert (b["iw_segments"], b["too_small"], b["max_lower_bound"], b["ok"]) == (None, True, 32, 2)
    assert targets["https://a.example/big"]["probes"] == 2
    assert targets["https://a.example/big"]["by_region"][asia_region]["too_small"] is False
    assert targets["https://b.example/big"]["by_region"][asia_region]["too_small"] is True
    series = client.get(f"/api/v1/analysis/census/series?campaign={campaign_id}").json()["data"]
    assert {(day["url"], day["answer"]["iw_segments"]) for day in series} == {
        ("https://a.example/big", 10),
        ("https://b.example/big", None),
    }
    assert client.get(f"/api/v1/analysis/census?campaign={campaign_id}&region={asia_region}").json()["data"][0]["probes"] == 1

    # The client-side check: a path behind a "proxy" (the probe saw 10 where the origin used 3), a clean one.
    origin = enroll_origin(client, origin_token, arms=(3, 10))
    ordinary = client.post(
        "/api/v1/campaigns",
        headers=bearer(admin_token),
        json={"name": "check", "origin_ids": [origin.id], "arms": [3, 10], "sizes": [100_000], "starts_at": wire.utc_timestamp()},
    ).json()["id"]

    def trial(probe: Enrolled, arm: int, seen: int, status: str = "ok", reason: str = "object_ended") -> dict[str, Any]:
        return make_trial(
            probe.id,
            origin.id,
            ordinary,
            arm_iw=arm,
            client_iw={
                "status": status,
                "segments": seen,
                "bytes": seen * 1448,
                "mss": 1448,
                "reason": "" if status == "ok" else reason,
            },
        )

    proxied = [trial(europe, 3, 10) for _ in range(4)] + [trial(europe, 10, 10) for _ in range(4)]
    # ... the last: the origin's SYN-ACK was retransmitted, so it started from 1 (and the probe saw 1)
    # ... and one IW 10 first flight cut by the probe's own receive window (a lower bound of 6)
    clean = [trial(asia, 3, 3) for _ in range(3)] + [
        trial(asia, 10, 10),
        trial(asia, 10, 6, "lower_bound", "receive_window"),
        trial(asia, 16, 1),
    ]
    _upload(client, europe, proxied, [])
    _upload(client, asia, clean, [])
    observations = {
        "wire_version": 5,
        "batch_id": wire.new_id(),
        "origin_id": origin.id,
        "sent_at": wire.utc_timestamp(),
        "observations": [make_observation(t, origin.id) for t in proxied + clean[:-1]]
        + [make_observation(clean[-1], origin.id, snd_cwnd_at_accept=1)],
    }
    assert client.post(wire.OBSERVATIONS_BATCH_PATH, json=observations, headers=origin.headers).status_code == 200

    def checks() -> dict[str, dict[str, Any]] | None:
        rows = client.get(f"/api/v1/analysis/iw-check?campaign={ordinary}").json()["data"]
        found = {row["probe_id"]: row for row in rows}
        joined = found.get(europe.id, {}).get("disagree_origin_had_arm") == 4
        return found if len(found) == 2 and joined else None

    found = wait_for(checks, what="both paths checked with the origin's windows joined")
    validate_against_openapi(client, "/api/v1/analysis/iw-check", {"data": list(found.values())})
    suspect, fine = found[europe.id], found[asia.id]
    assert (suspect["agree"], suspect["disagree"], suspect["seen_instead"], suspect["suspect"]) == (4, 4, 10, True)
    assert suspect["by_arm"] == {"3": [4, 4], "10": [4, 0]}
    assert suspect["receive_window_by_arm"] == {"3": [4, 0], "10": [4, 0]}
    assert fine["receive_window_by_arm"] == {"3": [3, 0], "10": [2, 1], "16": [1, 0]}
    assert (fine["agree"], fine["disagree"], fine["lower_bound"], fine["suspect"]) == (6, 0, 1, False)
    assert (fine["origin_not_arm"], suspect["origin_not_arm"]) == (1, 0)
    assert fine["disagree_share"] == 0 and fine["disagree_ci_high"] > 0


def test_every_json_read_route_has_a_typed_schema(client: httpx.Client) -> None:
    """Every GET answering JSON under /api/v1 publishes a ``$ref`` schema (or an array of one):
    OpenAPI clients and the docs show real fields (the data-for-researchers work)."""
    document = client.get("/openapi.json").json()
    untyped = []
    for path, operations in document["paths"].items():
        answer = operations.get("get", {}).get("responses", {}).get("200", {}).get("content", {})
        if not path.startswith("/api/v1/") or "application/json" not in answer:
            continue
        schema = answer["application/json"]["schema"]
        if not ("$ref" in schema or "$ref" in schema.get("items", {})):
            untyped.append(path)
    assert untyped == []
    analysis = [path for path in document["paths"] if path.startswith("/api/v1/analysis/") and not path.endswith(".csv")]
    assert len(analysis) >= 17
    fields = document["components"]["schemas"]["PathIwCheck"]["properties"]
    assert {"disagree_share", "disagree_ci_low", "suspect", "seen_instead"} <= set(fields)


def validate_against_openapi(client: httpx.Client, path: str, answer: Any) -> None:
    """``answer`` validates against the 200 schema ``path`` publishes (OpenAPI 3.1 = JSON Schema)."""
    document = client.get("/openapi.json").json()
    schema = document["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    jsonschema.Draft202012Validator({**schema, "components": document["components"]}).validate(answer)
