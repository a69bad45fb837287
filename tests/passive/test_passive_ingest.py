"""``POST /api/v1/passive/batch``: every field stored, duplicates change nothing, every bad record
and field named with nothing stored, another server's records 403, records of a campaign that is
not a passive campaign of this server 422, the limits of the other batch routes."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import httpx
import pytest
from passive_kit import (
    count_rows,
    enroll_server,
    make_aggregate,
    make_connection,
    make_heartbeat,
    make_passive_batch,
    running_campaign,
)
from sqlalchemy import text
from sqlalchemy.engine import Engine
from testkit import Enrolled, bearer, make_batch, make_trial

from iwprobe import wire


def post(client: httpx.Client, server: Enrolled, batch: dict[str, Any]) -> httpx.Response:
    return client.post(wire.PASSIVE_BATCH_PATH, json=batch, headers=server.headers)


def named(response: httpx.Response) -> list[tuple[str, int | None, str | None, str]]:
    return sorted(
        (error["section"], error["index"], error["record_id"], error["field"]) for error in response.json()["detail"]["errors"]
    )


@pytest.fixture
def campaign(client: httpx.Client, admin_token: str, server: Enrolled) -> dict[str, Any]:
    return running_campaign(client, admin_token, [server.id])


def test_every_field_is_stored(client: httpx.Client, server: Enrolled, campaign: dict[str, Any], db_engine: Engine) -> None:
    an_hour_ago = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=1)
    aggregate = make_aggregate(server.id, campaign["id"], latency_hist=[[470, 10], [12, 20]])
    default = make_aggregate(
        server.id,
        campaign["id"],
        arm="default",
        arm_iw=None,
        connections=5,
        responses=0,
        latency_sum_us=0,
        latency_hist=[],
        retrans_connections=0,
        syn_retrans=0,
        rwnd_limited=0,
        tls=0,
        family="ipv6",
        biased=True,
        rtt_bucket=-1,
    )
    connection = make_connection(server.id, campaign["id"])
    uncaptured = make_connection(
        server.id,
        campaign["id"],
        captured=False,
        tls=None,
        response_latency_us=None,
        response_bytes=None,
        handshake_us=None,
        first_flight_segments=None,
        first_flight_bytes=None,
        handshake_rtt_us=None,
        client_rwnd_bytes=None,
        exchanges=None,
        tcp_info={},
        country="",
        region="",
        syn_retrans=True,
        closed_at=(an_hour_ago + dt.timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S.25+02:00"),
    )
    answer = post(client, server, make_passive_batch(server.id, [aggregate, default], [connection, uncaptured]))
    assert answer.status_code == 200, answer.text
    assert (answer.json()["accepted"], answer.json()["duplicates"]) == (4, 0)
    with db_engine.connect() as db:
        stored = (
            db.execute(text("SELECT * FROM passive_aggregates WHERE aggregate_id = :i"), {"i": aggregate["aggregate_id"]})
            .mappings()
            .one()
        )
        other = db.execute(
            text(
                "SELECT arm, arm_iw, family, biased, rtt_bucket, latency_bins, latency_counts "
                "FROM passive_aggregates WHERE aggregate_id = :i"
            ),
            {"i": default["aggregate_id"]},
        ).one()
        row = (
            db.execute(text("SELECT * FROM passive_connections WHERE record_id = :i"), {"i": connection["record_id"]})
            .mappings()
            .one()
        )
        bare = db.execute(
            text(
                "SELECT closed_at, captured, tls, response_latency_us, tcpi_min_rtt_us, tcp_info, "
                "country, syn_retrans FROM passive_connections WHERE record_id = :i"
            ),
            {"i": uncaptured["record_id"]},
        ).one()
    for name, value in aggregate.items():
        if name == "latency_hist":
            continue
        got = stored[name]
        got = wire.utc_timestamp(got) if isinstance(got, dt.datetime) else str(got) if isinstance(got, uuid.UUID) else got
        assert got == value, name
    # The histogram as two parallel arrays, sorted by bin (what SQL merges with unnest).
    assert (stored["latency_bins"], stored["latency_counts"]) == ([12, 470], [20, 10])
    assert stored["received_at"] is not None
    assert tuple(other) == ("default", None, "ipv6", True, -1, [], [])
    for name, value in connection.items():
        got = row[name]
        got = wire.utc_timestamp(got) if isinstance(got, dt.datetime) else str(got) if isinstance(got, uuid.UUID) else got
        assert got == value, name
    tcp = connection["tcp_info"]
    assert (
        row["tcpi_min_rtt_us"],
        row["tcpi_rtt_us"],
        row["tcpi_delivery_rate"],
        row["tcpi_bytes_acked"],
        row["tcpi_data_segs_out"],
        row["tcpi_total_retrans"],
        row["tcpi_bytes_retrans"],
        row["tcpi_snd_cwnd"],
    ) == (
        tcp["min_rtt"],
        tcp["rtt"],
        tcp["delivery_rate"],
        tcp["bytes_acked"],
        tcp["data_segs_out"],
        tcp["total_retrans"],
        tcp["bytes_retrans"],
        tcp["snd_cwnd"],
    )
    assert bare.closed_at == an_hour_ago + dt.timedelta(microseconds=250_000)  # +02:00 read as such
    assert tuple(bare)[1:] == (False, None, None, None, {}, "", True)


def test_duplicates_change_nothing(client: httpx.Client, server: Enrolled, campaign: dict[str, Any], db_engine: Engine) -> None:
    aggregate, connection = make_aggregate(server.id, campaign["id"]), make_connection(server.id, campaign["id"])
    first = post(client, server, make_passive_batch(server.id, [aggregate], [connection]))
    assert first.json() | {"batch_id": None} == {"batch_id": None, "accepted": 2, "duplicates": 0}

    def snapshot() -> list[Any]:
        with db_engine.connect() as db:
            return [
                tuple(
                    db.execute(
                        text("SELECT a::text FROM passive_aggregates a WHERE server_id = :s ORDER BY 1"), {"s": server.id}
                    ).scalars()
                ),
                tuple(
                    db.execute(
                        text("SELECT c::text FROM passive_connections c WHERE server_id = :s ORDER BY 1"), {"s": server.id}
                    ).scalars()
                ),
            ]

    before = snapshot()
    # A replay with other values (a changed count, a changed latency) is a duplicate: nothing changes.
    changed = [{**aggregate, "connections": 99, "responses": 0, "latency_sum_us": 0, "latency_hist": []}]
    replay = post(client, server, make_passive_batch(server.id, changed, [{**connection, "response_latency_us": 1}]))
    assert (replay.status_code, replay.json()["accepted"], replay.json()["duplicates"]) == (200, 0, 2)
    assert snapshot() == before
    # The same record twice in one batch: stored once.
    twin = make_connection(server.id, campaign["id"])
    inside = post(client, server, make_passive_batch(server.id, [], [twin, dict(twin)]))
    assert (inside.json()["accepted"], inside.json()["duplicates"]) == (1, 1)
    assert count_rows(db_engine, server.id) == (1, 2)


def test_a_bad_field_is_named_and_nothing_is_stored(
    client: httpx.Client, server: Enrolled, campaign: dict[str, Any], db_engine: Engine
) -> None:
    aggregates = [make_aggregate(server.id, campaign["id"]) for _ in range(3)]
    connections = [make_connection(server.id, campaign["id"]) for _ in range(3)]
    aggregates[1]["cluster"] = 32  # 32 clusters: 0..31
    aggregates[2]["latency_hist"] = [[1000, 1]]  # 1000 bins: 0..999
    connections[0]["client_prefix"] = "c000020a"  # not 16 hex digits
    connections[2]["tcp_info"] = {"rtt": -1}
    del connections[2]["port"]
    response = post(client, server, make_passive_batch(server.id, aggregates, connections))
    assert response.status_code == 422, response.text
    assert response.json()["detail"]["message"] == "invalid batch: nothing was stored"
    assert named(response) == sorted(
        [
            ("aggregates", 1, aggregates[1]["aggregate_id"], "cluster"),
            ("aggregates", 2, aggregates[2]["aggregate_id"], "latency_hist.0.0"),
            ("connections", 0, connections[0]["record_id"], "client_prefix"),
            ("connections", 2, connections[2]["record_id"], "port"),
            ("connections", 2, connections[2]["record_id"], "tcp_info.rtt"),
        ]
    )
    assert count_rows(db_engine, server.id) == (0, 0)
    # Garbage and an older wire version: the envelope is named.
    garbage = client.post(wire.PASSIVE_BATCH_PATH, content=b"{nope", headers=server.headers)
    assert garbage.status_code == 422 and garbage.json()["detail"]["errors"][0]["section"] == "batch"
    old = make_passive_batch(server.id, [make_aggregate(server.id, campaign["id"])])
    old["wire_version"] = 5
    assert named(post(client, server, old)) == [("batch", None, None, "wire_version")]
    assert count_rows(db_engine, server.id) == (0, 0)


@pytest.mark.parametrize(
    ("section", "change", "field", "needle"),
    [
        ("aggregates", {"hour": "2026-11-26T14:30:00Z"}, "hour", "start of a UTC hour"),
        ("aggregates", {"responses": 41}, "responses", "exceeds connections"),
        ("aggregates", {"tls": 41}, "tls", "exceeds connections"),
        ("aggregates", {"latency_hist": [[400, 29]]}, "latency_hist", "add up to responses"),
        ("aggregates", {"latency_hist": [[400, 15], [400, 15]]}, "latency_hist", "must not repeat"),
        ("aggregates", {"responses": 0, "latency_hist": [], "latency_sum_us": 5}, "latency_sum_us", "without responses"),
        ("aggregates", {"arm_iw": 10}, "arm_iw", "not the IW of arm"),
        ("aggregates", {"hour": "1999-12-31T23:00:00Z"}, "hour", "before 2000"),
        ("aggregates", {"region": "198.51.100.0"}, "region", "IP address"),
        ("connections", {"captured": False}, "response_latency_us", "not captured"),
        ("connections", {"arm": "32"}, "arm_iw", "not the IW of arm"),
        ("connections", {"region": "via 2001:db8::7"}, "region", "IP address"),
        (
            "connections",
            {"closed_at": wire.utc_timestamp(dt.datetime.now(dt.UTC) + dt.timedelta(days=2))},
            "closed_at",
            "in the future",
        ),
        ("connections", {"phase": 3}, "phase", "ahead of the campaign's phase 0"),
    ],
)
def test_relations_between_fields_are_checked(
    client: httpx.Client,
    server: Enrolled,
    campaign: dict[str, Any],
    db_engine: Engine,
    section: str,
    change: dict[str, Any],
    field: str,
    needle: str,
) -> None:
    good_aggregate, good_connection = make_aggregate(server.id, campaign["id"]), make_connection(server.id, campaign["id"])
    bad = (make_aggregate if section == "aggregates" else make_connection)(server.id, campaign["id"], **change)
    batch = (
        make_passive_batch(server.id, [good_aggregate, bad], [good_connection])
        if section == "aggregates"
        else make_passive_batch(server.id, [good_aggregate], [good_connection, bad])
    )
    response = post(client, server, batch)
    assert response.status_code == 422, response.text
    errors = response.json()["detail"]["errors"]
    record_id = bad["aggregate_id" if section == "aggregates" else "record_id"]
    assert any(
        (error["section"], error["index"], error["record_id"], error["field"]) == (section, 1, record_id, field)
        and needle in error["message"]
        for error in errors
    ), errors
    assert {error["record_id"] for error in errors} == {record_id}  # the good records are never named
    assert count_rows(db_engine, server.id) == (0, 0)


def test_another_servers_records_are_refused_whole(
    client: httpx.Client, server: Enrolled, server_token: str, campaign: dict[str, Any], admin_token: str, db_engine: Engine
) -> None:
    other = enroll_server(client, server_token)
    running_campaign(client, admin_token, [other.id])
    mine = make_aggregate(server.id, campaign["id"])
    theirs = make_connection(other.id, campaign["id"])
    refused = post(client, server, make_passive_batch(server.id, [mine], [theirs]))
    assert refused.status_code == 403, refused.text
    assert named(refused) == [("connections", 0, theirs["record_id"], "server_id")]
    envelope = post(client, server, make_passive_batch(other.id, [mine]))
    assert envelope.status_code == 403
    assert ("batch", None, None, "server_id") in [(s, i, None, f) for s, i, _, f in named(envelope)]
    assert count_rows(db_engine, server.id) == (0, 0) and count_rows(db_engine, other.id) == (0, 0)
    # An unknown id's credential: the one 401.
    assert (
        client.post(
            wire.PASSIVE_BATCH_PATH,
            json=make_passive_batch(server.id),
            headers=bearer("0b0e4a36-8d0e-4c3d-9a55-3a1c3b7f0c11.secret"),
        ).status_code
        == 401
    )


def test_records_of_a_campaign_that_is_not_this_servers_passive_campaign(
    client: httpx.Client,
    server: Enrolled,
    server_token: str,
    admin_token: str,
    origin: Enrolled,
    campaign: dict[str, Any],
    db_engine: Engine,
) -> None:
    other = enroll_server(client, server_token)
    foreign = running_campaign(client, admin_token, [other.id])
    now = dt.datetime.now(dt.UTC)
    ordinary = client.post(
        "/api/v1/campaigns",
        headers=bearer(admin_token),
        json={
            "name": "probes",
            "origin_ids": [origin.id],
            "arms": [3, 10],
            "sizes": [10_000],
            "starts_at": now.isoformat(),
            "ends_at": (now + dt.timedelta(hours=1)).isoformat(),
        },
    ).json()
    records = [
        make_aggregate(server.id, campaign["id"]),
        make_aggregate(server.id, 987_654_321),
        make_aggregate(server.id, ordinary["id"]),
    ]
    connections = [make_connection(server.id, foreign["id"])]
    response = post(client, server, make_passive_batch(server.id, records, connections))
    assert response.status_code == 422, response.text
    messages = {
        (error["section"], error["index"]): (error["field"], error["message"]) for error in response.json()["detail"]["errors"]
    }
    assert messages == {
        ("aggregates", 1): ("campaign_id", "unknown campaign"),
        ("aggregates", 2): ("campaign_id", f"campaign {ordinary['id']} is not a passive campaign"),
        ("connections", 0): ("campaign_id", f"this server is not part of passive campaign {foreign['id']}"),
    }
    assert count_rows(db_engine, server.id) == (0, 0)


def test_limits_of_the_other_batch_routes(
    client: httpx.Client, server: Enrolled, campaign: dict[str, Any], db_engine: Engine
) -> None:
    too_big = b'{"pad":"' + b"x" * (wire.MAX_BODY_BYTES + 1) + b'"}'
    response = client.post(
        wire.PASSIVE_BATCH_PATH, content=too_big, headers={**server.headers, "Content-Type": "application/json"}
    )
    assert response.status_code == 413
    connection = make_connection(server.id, campaign["id"])
    half = wire.MAX_BATCH_RECORDS // 2 + 1
    many = make_passive_batch(
        server.id,
        [make_aggregate(server.id, campaign["id"]) for _ in range(half)],
        [{**connection, "record_id": wire.new_id()} for _ in range(half)],
    )
    response = post(client, server, many)
    assert response.status_code == 413, response.text[:300]
    one_section = make_passive_batch(
        server.id, [], [{**connection, "record_id": wire.new_id()} for _ in range(wire.MAX_BATCH_RECORDS + 1)]
    )
    assert post(client, server, one_section).status_code == 413
    assert count_rows(db_engine, server.id) == (0, 0)


def test_the_heartbeat_reaches_the_servers_row(
    client: httpx.Client, server: Enrolled, campaign: dict[str, Any], db_engine: Engine
) -> None:
    with db_engine.connect() as db:
        assert db.execute(text("SELECT last_seen_at FROM servers WHERE id = :i"), {"i": server.id}).scalar() is None
    answer = post(
        client,
        server,
        make_passive_batch(
            server.id, [make_aggregate(server.id, campaign["id"])], heartbeat=make_heartbeat(arms_state="off", spool_backlog=17)
        ),
    )
    assert answer.status_code == 200, answer.text
    with db_engine.connect() as db:
        row = db.execute(text("SELECT last_seen_at, version, last_heartbeat FROM servers WHERE id = :i"), {"i": server.id}).one()
    assert row.last_seen_at is not None and row.version == "0.6.1"
    assert row.last_heartbeat["arms_state"] == "off" and row.last_heartbeat["spool_backlog"] == 17
    bad = post(client, server, make_passive_batch(server.id, heartbeat=make_heartbeat(arms_state="broken")))
    assert named(bad) == [("batch", None, None, "heartbeat.arms_state")]


def test_a_probe_batch_is_not_a_passive_batch(client: httpx.Client, probe: Enrolled, server: Enrolled) -> None:
    """The routes stay apart: a probe credential cannot upload passive records, a server's
    credential cannot upload trials."""
    assert client.post(wire.PASSIVE_BATCH_PATH, json=make_passive_batch(server.id), headers=probe.headers).status_code == 401
    trials = make_batch(probe.id, [make_trial(probe.id)])
    assert client.post(wire.TRIALS_BATCH_PATH, json=trials, headers=server.headers).status_code == 401


def test_passive_tables_are_indexed_for_time_and_campaign(db_engine: Engine) -> None:
    with db_engine.connect() as db:
        definitions = "\n".join(
            db.execute(
                text("SELECT indexdef FROM pg_indexes WHERE tablename IN ('passive_aggregates', 'passive_connections')")
            ).scalars()
        )
    assert "passive_aggregates USING brin (hour)" in definitions
    assert "passive_aggregates USING btree (campaign_id, hour)" in definitions
    assert "passive_connections USING brin (closed_at)" in definitions
    assert "passive_connections USING btree (campaign_id, closed_at)" in definitions
    assert "(aggregate_id)" in definitions and "(record_id)" in definitions  # the idempotency keys
