"""Enrollment, heartbeat, schedule, batch upload semantics and credentials, against a real API process."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from testkit import Enrolled, bearer, enroll_origin, enroll_probe, make_batch, make_path_sample, make_trial

from iwprobe import wire


def count_trials(engine: Engine, probe_id: str) -> int:
    with engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM trials WHERE probe_id = :p"), {"p": probe_id}).scalar_one()


def registry_size(engine: Engine, trial_ids: list[str]) -> int:
    with engine.connect() as connection:
        return connection.execute(
            text("SELECT count(*) FROM trial_ids WHERE trial_id = ANY(CAST(:ids AS uuid[]))"), {"ids": trial_ids}
        ).scalar_one()


# --------------------------------------------------------------------------------------
# Enrollment and credentials
# --------------------------------------------------------------------------------------


def test_enrollment_stores_probe_and_only_a_hash(client: httpx.Client, enroll_token: str, db_engine: Engine) -> None:
    probe = enroll_probe(client, enroll_token, region="sa-east", name="sao-paulo-1")
    identity, _, secret = probe.credential.partition(wire.CREDENTIAL_SEPARATOR)
    assert identity == probe.id and len(secret) >= 40
    with db_engine.connect() as connection:
        row = connection.execute(
            text("SELECT name, region, country, asn, labels, secret_hash FROM probes WHERE id = :i"), {"i": probe.id}
        ).one()
    assert (row.name, row.region, row.country, row.asn, row.labels) == ("sao-paulo-1", "sa-east", "DE", 3320, {"access": "dsl"})
    assert secret not in row.secret_hash and len(row.secret_hash) == 64


def test_enrollment_needs_an_enrollment_token(client: httpx.Client, admin_token: str, origin_token: str) -> None:
    body = {"name": "x", "region": "r"}
    assert client.post(wire.PROBE_ENROLL_PATH, json=body).status_code == 401
    for wrong in (admin_token, origin_token, "iws_enroll_nonsense"):
        response = client.post(wire.PROBE_ENROLL_PATH, json=body, headers=bearer(wrong))
        assert response.status_code == 401
        assert response.json() == {"detail": "invalid credentials"}
    assert (
        client.post(
            wire.ORIGIN_ENROLL_PATH,
            json={"name": "o", "region": "r", "host": "h", "arms": [{"iw": 3, "port": 1}]},
            headers=bearer(admin_token),
        ).status_code
        == 401
    )


def test_unknown_probe_wrong_secret_and_garbage_get_the_same_401(client: httpx.Client, probe: Enrolled) -> None:
    batch = make_batch(probe.id, [make_trial(probe.id)])
    wrong_secret = f"{probe.id}.{'x' * 43}"
    unknown_probe = f"{uuid.uuid4()}.{probe.credential.split('.', 1)[1]}"
    answers = [
        client.post(wire.TRIALS_BATCH_PATH, json=batch, headers=bearer(credential))
        for credential in (wrong_secret, unknown_probe, "not-a-credential")
    ]
    assert {response.status_code for response in answers} == {401}
    assert {response.text for response in answers} == {'{"detail":"invalid credentials"}'}
    missing = client.post(wire.TRIALS_BATCH_PATH, json=batch)
    assert missing.status_code == 401


def test_heartbeat_and_fleet_listing(client: httpx.Client, probe: Enrolled, admin_token: str) -> None:
    heartbeat = {"version": "0.2.0", "spool_backlog": 17, "spool_bytes": 4096, "uptime_s": 12.5, "trials_measured": 99}
    path = wire.PROBE_HEARTBEAT_PATH.format(probe_id=probe.id)
    assert client.post(path, json=heartbeat, headers=probe.headers).status_code == 204
    assert client.post(path, json={**heartbeat, "spool_backlog": -1}, headers=probe.headers).status_code == 422
    fleet = client.get("/api/v1/probes", headers=bearer(admin_token))
    assert fleet.status_code == 200
    mine = next(entry for entry in fleet.json() if entry["id"] == probe.id)
    assert (mine["version"], mine["backlog"]) == ("0.2.0", 17)
    assert mine["last_seen_at"] is not None
    assert client.get("/api/v1/probes", headers=probe.headers).status_code == 401


def test_probe_cannot_act_for_another_probe(client: httpx.Client, probe: Enrolled, enroll_token: str, db_engine: Engine) -> None:
    other = enroll_probe(client, enroll_token)
    heartbeat = {"version": "1", "spool_backlog": 0, "spool_bytes": 0, "uptime_s": 1, "trials_measured": 0}
    assert (
        client.post(wire.PROBE_HEARTBEAT_PATH.format(probe_id=other.id), json=heartbeat, headers=probe.headers).status_code == 403
    )
    assert client.get(wire.PROBE_SCHEDULE_PATH.format(probe_id=other.id), headers=probe.headers).status_code == 403
    # A batch carrying another probe's trials: 403 naming each record, nothing stored.
    trials = [make_trial(probe.id), make_trial(other.id), make_trial(other.id)]
    response = client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, trials), headers=probe.headers)
    assert response.status_code == 403
    named = [(error["section"], error["index"], error["record_id"]) for error in response.json()["detail"]["errors"]]
    assert named == [("trials", 1, trials[1]["trial_id"]), ("trials", 2, trials[2]["trial_id"])]
    assert count_trials(db_engine, probe.id) == 0 and count_trials(db_engine, other.id) == 0
    # Another probe's envelope.
    envelope = client.post(wire.TRIALS_BATCH_PATH, json=make_batch(other.id, [make_trial(other.id)]), headers=probe.headers)
    assert envelope.status_code == 403


# --------------------------------------------------------------------------------------
# Schedule
# --------------------------------------------------------------------------------------


def test_schedule_respects_window_regions_origins_and_arms(
    client: httpx.Client, admin_token: str, enroll_token: str, origin_token: str
) -> None:
    eu_probe = enroll_probe(client, enroll_token, region="eu-test")
    us_probe = enroll_probe(client, enroll_token, region="us-test")
    origin_a = enroll_origin(client, origin_token, arms=(3, 10, 32))
    origin_b = enroll_origin(client, origin_token, arms=(1,))  # serves none of the campaign's arms
    now = dt.datetime.now(dt.UTC)
    created: set[int] = set()

    def create(name: str, **fields: Any) -> int:
        body = {
            "name": name,
            "origin_ids": [origin_a.id, origin_b.id],
            "arms": [3, 10],
            "sizes": [1000, 50_000],
            "repetitions": 5,
            "interval_s": 2.0,
            "starts_at": (now - dt.timedelta(minutes=1)).isoformat(),
            "ends_at": (now + dt.timedelta(hours=1)).isoformat(),
            "calibrate": True,
            **fields,
        }
        response = client.post("/api/v1/campaigns", json=body, headers=bearer(admin_token))
        assert response.status_code == 201, response.text
        created.add(response.json()["id"])
        return response.json()["id"]

    def ours(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """This test's campaigns among ``entries`` (other tests' campaigns open to every region show too)."""
        return [entry for entry in entries if entry["campaign_id"] in created]

    active_eu = create("active eu", probe_regions=["eu-test"])
    create(
        "future",
        starts_at=(now + dt.timedelta(days=2)).isoformat(),
        ends_at=(now + dt.timedelta(days=3)).isoformat(),
        probe_regions=["eu-test"],
    )
    create(
        "over",
        starts_at=(now - dt.timedelta(days=2)).isoformat(),
        ends_at=(now - dt.timedelta(days=1)).isoformat(),
        probe_regions=["eu-test"],
    )
    create("us only", probe_regions=["us-test"])
    dist = create("websearch sizes", sizes=None, size_dist="websearch", sizes_per_round=4, probe_regions=["eu-test", "ap-test"])

    schedule = client.get(wire.PROBE_SCHEDULE_PATH.format(probe_id=eu_probe.id), headers=eu_probe.headers)
    assert schedule.status_code == 200, schedule.text
    body = schedule.json()
    assert body["wire_version"] == wire.WIRE_VERSION and body["probe_id"] == eu_probe.id and body["poll_after_s"] > 0
    campaigns = ours(body["campaigns"])
    assert [entry["campaign_id"] for entry in campaigns] == [active_eu, dist]
    first = campaigns[0]
    assert first["arms"] == [3, 10] and first["sizes"] == [1000, 50_000] and first["size_dist"] is None
    assert first["repetitions"] == 5 and first["interval_s"] == 2.0 and first["calibrate"] is True
    assert first["targets"] == [
        {
            "origin_id": origin_a.id,
            "host": "10.0.0.1",
            "arms": [{"iw": 3, "port": 8003, "arm": "3", "paced": False}, {"iw": 10, "port": 8010, "arm": "10", "paced": False}],
            "echo_port": None,
            "tls": False,
            "host6": None,
        }
    ]
    assert campaigns[1]["sizes"] is None and campaigns[1]["size_dist"] == "websearch"

    us = client.get(wire.PROBE_SCHEDULE_PATH.format(probe_id=us_probe.id), headers=us_probe.headers).json()
    assert [entry["name"] for entry in ours(us["campaigns"])] == ["us only"]

    # Stopping a campaign (PATCH ends_at) removes it from the schedule.
    stop = client.patch(
        f"/api/v1/campaigns/{active_eu}",
        headers=bearer(admin_token),
        json={"ends_at": (now - dt.timedelta(seconds=1)).isoformat()},
    )
    assert stop.status_code == 200, stop.text
    again = client.get(wire.PROBE_SCHEDULE_PATH.format(probe_id=eu_probe.id), headers=eu_probe.headers).json()
    assert [entry["campaign_id"] for entry in ours(again["campaigns"])] == [dist]


def test_campaign_validation_and_admin_only(client: httpx.Client, admin_token: str, origin: Enrolled, probe: Enrolled) -> None:
    start = dt.datetime.now(dt.UTC).isoformat()
    base = {"name": "c", "origin_ids": [origin.id], "arms": [3], "starts_at": start}
    both = client.post("/api/v1/campaigns", headers=bearer(admin_token), json={**base, "sizes": [1], "size_dist": "websearch"})
    assert both.status_code == 422
    unknown = client.post(
        "/api/v1/campaigns", headers=bearer(admin_token), json={**base, "sizes": [1], "origin_ids": [str(uuid.uuid4())]}
    )
    assert unknown.status_code == 422 and "unknown origins" in unknown.text
    assert client.post("/api/v1/campaigns", headers=probe.headers, json={**base, "sizes": [1]}).status_code == 401
    created = client.post("/api/v1/campaigns", headers=bearer(admin_token), json={**base, "sizes": [1]})
    assert created.status_code == 201
    fetched = client.get(f"/api/v1/campaigns/{created.json()['id']}", headers=bearer(admin_token)).json()
    assert fetched["sizes"] == [1] and fetched["origin_ids"] == [origin.id]
    assert client.get("/api/v1/campaigns/999999", headers=bearer(admin_token)).status_code == 404


@pytest.mark.parametrize(
    "body, field",
    [
        ({"starts_at": None, "ends_at": "2030-01-01T00:00:00Z"}, "starts_at"),  # found by the fuzzer: was a 500
        ({"starts_at": None}, "starts_at"),
        ({"name": None}, "name"),
        ({"repetitions": None}, "repetitions"),
        ({"interval_s": None}, "interval_s"),
        ({"ends_at": "2000-01-01T00:00:00Z"}, "ends_at"),  # before starts_at
    ],
)
def test_campaign_patch_refuses_nulls_and_inverted_windows_unchanged(
    client: httpx.Client, admin_token: str, origin: Enrolled, body: dict[str, Any], field: str
) -> None:
    start = dt.datetime.now(dt.UTC).replace(microsecond=0)
    created = client.post(
        "/api/v1/campaigns",
        headers=bearer(admin_token),
        json={"name": "patched", "origin_ids": [origin.id], "arms": [3], "sizes": [1], "starts_at": start.isoformat()},
    )
    assert created.status_code == 201, created.text
    url = f"/api/v1/campaigns/{created.json()['id']}"
    refused = client.patch(url, headers=bearer(admin_token), json=body)
    assert refused.status_code == 422, refused.text
    assert field in {str(part) for error in refused.json()["detail"] for part in error["loc"]}
    assert client.get(url, headers=bearer(admin_token)).json() == created.json()
    # Explicit nulls where the column allows them are accepted: open-ended again, every region.
    reopened = client.patch(url, headers=bearer(admin_token), json={"ends_at": None, "probe_regions": None})
    assert reopened.status_code == 200 and reopened.json()["ends_at"] is None


# --------------------------------------------------------------------------------------
# Batch upload
# --------------------------------------------------------------------------------------


def test_upload_stores_every_field(
    client: httpx.Client, probe: Enrolled, origin: Enrolled, campaign: dict[str, Any], db_engine: Engine
) -> None:
    trials = [make_trial(probe.id, origin.id, campaign["id"], arm_iw=iw) for iw in (3, 10, 10)]
    trials[2].update(error_kind="timeout", error_detail="read timed out", http_status=None, total_us=None, tcp_info={})
    sample = make_path_sample(probe.id, origin.id)
    response = client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, trials, [sample]), headers=probe.headers)
    assert response.status_code == 200, response.text
    assert response.json()["accepted"] == 4 and response.json()["duplicates"] == 0
    with db_engine.connect() as connection:
        row = connection.execute(text("SELECT * FROM trials WHERE trial_id = :t"), {"t": trials[0]["trial_id"]}).mappings().one()
        failed = (
            connection.execute(text("SELECT * FROM trials WHERE trial_id = :t"), {"t": trials[2]["trial_id"]}).mappings().one()
        )
        samples = connection.execute(
            text("SELECT min_rtt_us, bottleneck_bps FROM path_samples WHERE probe_id = :p"), {"p": probe.id}
        ).all()
    expected = trials[0]
    for name in (
        "round",
        "arm_iw",
        "object_size",
        "url",
        "dns_us",
        "connect_us",
        "ttfb_us",
        "total_us",
        "bytes_received",
        "http_status",
        "error_kind",
        "syn_retrans",
        "campaign_id",
    ):
        assert row[name] == expected[name], name
    assert str(row["origin_id"]) == origin.id and str(row["probe_id"]) == probe.id
    assert row["started_at"] == wire.parse_timestamp(expected["started_at"])
    assert (row["tcpi_rtt_us"], row["tcpi_min_rtt_us"], row["tcpi_rcv_mss"]) == (20_500, 20_000, 1448)
    assert row["tcp_info"] == expected["tcp_info"]
    assert row["joined_at"] is None and row["server_latency_us"] is None
    assert (failed["error_kind"], failed["error_detail"], failed["total_us"], failed["tcpi_rtt_us"]) == (
        "timeout",
        "read timed out",
        None,
        None,
    )
    assert samples == [(19_500, 10_000_000)]


def test_duplicate_upload_changes_nothing(client: httpx.Client, probe: Enrolled, db_engine: Engine) -> None:
    trials = [make_trial(probe.id) for _ in range(20)]
    batch = make_batch(probe.id, trials)
    first = client.post(wire.TRIALS_BATCH_PATH, json=batch, headers=probe.headers)
    assert {key: first.json()[key] for key in ("batch_id", "accepted", "duplicates")} == {
        "batch_id": batch["batch_id"],
        "accepted": 20,
        "duplicates": 0,
    }
    assert set(first.json()) == {"batch_id", "accepted", "duplicates", "schedule_etag"}
    with db_engine.connect() as connection:
        before = connection.execute(
            text("SELECT trial_id, total_us, received_at FROM trials WHERE probe_id = :p ORDER BY trial_id"), {"p": probe.id}
        ).all()
    # Replay: the same batch, then the same UUIDs with changed values plus two new trials.
    replay = client.post(wire.TRIALS_BATCH_PATH, json=batch, headers=probe.headers)
    assert replay.json()["accepted"] == 0 and replay.json()["duplicates"] == 20
    changed = [{**trial, "total_us": 1} for trial in trials] + [make_trial(probe.id) for _ in range(2)]
    mixed = client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, changed), headers=probe.headers)
    assert mixed.json()["accepted"] == 2 and mixed.json()["duplicates"] == 20
    with db_engine.connect() as connection:
        after = connection.execute(
            text(
                "SELECT trial_id, total_us, received_at FROM trials WHERE probe_id = :p "
                "AND trial_id = ANY(CAST(:ids AS uuid[])) ORDER BY trial_id"
            ),
            {"p": probe.id, "ids": [t["trial_id"] for t in trials]},
        ).all()
    assert after == before
    assert count_trials(db_engine, probe.id) == 22
    # The same UUID twice inside one batch is stored once.
    twin = make_trial(probe.id)
    inside = client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, [twin, dict(twin)]), headers=probe.headers)
    assert inside.json()["accepted"] == 1 and inside.json()["duplicates"] == 1


def test_invalid_batch_is_refused_whole_and_names_each_bad_record(
    client: httpx.Client, probe: Enrolled, db_engine: Engine
) -> None:
    trials = [make_trial(probe.id) for _ in range(6)]
    trials[1]["total_us"] = -5  # negative duration
    trials[3]["started_at"] = wire.utc_timestamp(dt.datetime.now(dt.UTC) + dt.timedelta(days=3))
    trials[4]["started_at"] = "1999-12-31T23:59:59Z"
    del trials[5]["arm_iw"]
    trials[5]["bogus"] = 1
    response = client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, trials), headers=probe.headers)
    assert response.status_code == 422, response.text
    errors = response.json()["detail"]["errors"]
    named = sorted((error["index"], error["record_id"], error["field"]) for error in errors)
    # The pydantic pass reports schema errors first; the good records 0 and 2 are never named.
    assert named == sorted(
        [(1, trials[1]["trial_id"], "total_us"), (5, trials[5]["trial_id"], "arm_iw"), (5, trials[5]["trial_id"], "bogus")]
    )
    assert count_trials(db_engine, probe.id) == 0
    assert registry_size(db_engine, [trial["trial_id"] for trial in trials]) == 0
    # Once the schema errors are fixed, the time checks name the remaining bad records.
    trials[1]["total_us"] = 5
    trials[5] = make_trial(probe.id)
    response = client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, trials), headers=probe.headers)
    assert response.status_code == 422
    assert sorted((e["index"], e["field"], e["message"]) for e in response.json()["detail"]["errors"]) == [
        (3, "started_at", "timestamp is more than a day in the future"),
        (4, "started_at", "timestamp is before 2000-01-01"),
    ]
    assert count_trials(db_engine, probe.id) == 0


def test_unknown_campaign_or_origin_and_bad_json(client: httpx.Client, probe: Enrolled, db_engine: Engine) -> None:
    trials = [make_trial(probe.id), make_trial(probe.id, campaign_id=987654), make_trial(probe.id, origin_id=str(uuid.uuid4()))]
    response = client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, trials), headers=probe.headers)
    assert response.status_code == 422
    assert sorted((e["index"], e["field"]) for e in response.json()["detail"]["errors"]) == [(1, "campaign_id"), (2, "origin_id")]
    garbage = client.post(wire.TRIALS_BATCH_PATH, content=b"{not json", headers=probe.headers)
    assert garbage.status_code == 422 and garbage.json()["detail"]["errors"][0]["section"] == "batch"
    wrong_version = make_batch(probe.id, [make_trial(probe.id)])
    wrong_version["wire_version"] = wire.WIRE_VERSION + 1  # 1 to WIRE_VERSION are known
    assert client.post(wire.TRIALS_BATCH_PATH, json=wrong_version, headers=probe.headers).status_code == 422
    assert count_trials(db_engine, probe.id) == 0


def test_oversized_body_and_too_many_records_get_413(client: httpx.Client, probe: Enrolled, db_engine: Engine) -> None:
    too_big = b'{"pad":"' + b"x" * (wire.MAX_BODY_BYTES + 1) + b'"}'
    response = client.post(wire.TRIALS_BATCH_PATH, content=too_big, headers={**probe.headers, "Content-Type": "application/json"})
    assert response.status_code == 413

    def chunks():  # no Content-Length: the server must count while streaming
        for _ in range(40):
            yield b"x" * (1024 * 1024)

    streamed = client.post(wire.TRIALS_BATCH_PATH, content=chunks(), headers=probe.headers)
    assert streamed.status_code == 413
    trial = make_trial(probe.id)
    many = make_batch(
        probe.id,
        [{**trial, "trial_id": wire.new_id()} for _ in range(wire.MAX_BATCH_RECORDS)],
        [make_path_sample(probe.id, str(uuid.uuid4()))],
    )
    response = client.post(wire.TRIALS_BATCH_PATH, json=many, headers=probe.headers)
    assert response.status_code == 413, response.text[:300]
    assert count_trials(db_engine, probe.id) == 0


def test_observation_upload_idempotent_and_origin_bound(
    client: httpx.Client, origin: Enrolled, origin_token: str, probe: Enrolled, db_engine: Engine
) -> None:
    from testkit import make_observation, make_observation_batch

    trial = make_trial(probe.id, origin.id)
    batch = make_observation_batch(origin.id, [make_observation(trial, origin.id)])
    first = client.post(wire.OBSERVATIONS_BATCH_PATH, json=batch, headers=origin.headers)
    assert first.status_code == 200 and first.json()["accepted"] == 1
    again = client.post(wire.OBSERVATIONS_BATCH_PATH, json=batch, headers=origin.headers)
    assert again.json()["accepted"] == 0 and again.json()["duplicates"] == 1
    other = enroll_origin(client, origin_token)
    foreign = client.post(
        wire.OBSERVATIONS_BATCH_PATH,
        headers=other.headers,
        json=make_observation_batch(other.id, [make_observation(make_trial(probe.id), origin.id)]),
    )
    assert foreign.status_code == 403
    assert client.post(wire.OBSERVATIONS_BATCH_PATH, json=batch, headers=probe.headers).status_code == 401


def test_csv_export_streams_filtered_trials(client: httpx.Client, probe: Enrolled) -> None:
    trials = [make_trial(probe.id) for _ in range(2500)]
    assert client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, trials), headers=probe.headers).status_code == 200
    with client.stream("GET", "/api/v1/trials.csv", params={"probe_id": probe.id}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/csv")
        assert "content-length" not in response.headers  # streamed, not buffered
        chunks = list(response.iter_raw())
    rows = list(csv.DictReader(io.StringIO(b"".join(chunks).decode())))
    assert len(rows) == 2500
    assert {row["trial_id"] for row in rows} == {trial["trial_id"] for trial in trials}
    assert all(row["probe_id"] == probe.id for row in rows)
    later = client.get("/api/v1/trials.csv", params={"probe_id": probe.id, "since": "2100-01-01T00:00:00Z"})
    assert later.text.count("\n") == 1  # header only


def test_metrics_count_accepted_and_duplicates(client: httpx.Client, probe: Enrolled) -> None:
    def value(kind: str, outcome: str) -> float:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith(f'iwscope_records_total{{kind="{kind}",outcome="{outcome}"}}'):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    accepted, duplicate = value("trial", "accepted"), value("trial", "duplicate")
    batch = make_batch(probe.id, [make_trial(probe.id) for _ in range(3)])
    client.post(wire.TRIALS_BATCH_PATH, json=batch, headers=probe.headers)
    client.post(wire.TRIALS_BATCH_PATH, json=batch, headers=probe.headers)
    assert value("trial", "accepted") - accepted == 3
    assert value("trial", "duplicate") - duplicate == 3
    assert 'iwscope_http_requests_total{method="POST",route="/api/v1/trials/batch",status="200"}' in client.get("/metrics").text


def test_openapi_is_published(client: httpx.Client) -> None:
    document = client.get("/openapi.json").json()
    paths = document["paths"]
    for path in (
        wire.PROBE_ENROLL_PATH,
        wire.TRIALS_BATCH_PATH,
        wire.OBSERVATIONS_BATCH_PATH,
        wire.TRACES_BATCH_PATH,
        "/api/v1/trials/{trial_id}/traces",
        "/api/v1/campaigns",
        "/api/v1/trials.csv",
        "/readyz",
    ):
        assert path in paths
    # Self-contained: every $ref points into the document (no external wire-schema URL).
    schemas = document["components"]["schemas"]
    refs = set(re.findall(r'"\$ref":\s*"([^"]*)"', json.dumps(document)))
    assert refs and all(ref.startswith("#/components/schemas/") for ref in refs), refs
    assert all(ref.removeprefix("#/components/schemas/") in schemas for ref in refs)
    # The batch bodies are the wire schema's own records, constraints and all.
    body = paths[wire.TRIALS_BATCH_PATH]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/wire.TrialBatch"}
    traces = paths[wire.TRACES_BATCH_PATH]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert traces == {"$ref": "#/components/schemas/wire.TraceBatch"}
    wire_defs = wire.load_schema()["$defs"]
    record = json.loads(json.dumps(schemas["wire.TrialRecord"]).replace("#/components/schemas/wire.", "#/$defs/"))
    assert record == wire_defs["TrialRecord"] and schemas["wire.TrialRecord"]["required"]
    assert document["info"]["x-wire-version"] == wire.WIRE_VERSION
