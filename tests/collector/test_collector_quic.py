"""Wire v9: HTTP/3 -- a QUIC arm's trials, observations and census records stored, checked,
joined, scheduled and exported.

A QUIC arm (``10q``, ``10pq``) is the TCP arm's policy over HTTP/3 on the UDP port of the same
number; its records say ``protocol: "quic"`` and carry no TCP connection (``connect_us`` and
``tcp_info`` empty), a QUIC observation its first flight (``quic_*``).  ``protocol`` is stored as
sent, "not said" (``""``, every record before v9) as NULL; the rules relating it to the rest of a
record are :mod:`iwscope.trials.protocols`'.  The API, PostgreSQL, the worker and credentials are
the session's real ones (tests/conftest.py).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
import sqlalchemy.exc
from sqlalchemy import Engine, text
from testkit import (
    Enrolled,
    bearer,
    census_record,
    enroll_probe,
    make_batch,
    make_observation,
    make_observation_batch,
    make_trial,
    wait_for,
)

from iwprobe import wire
from iwscope.trials.protocols import arm_mismatch

#: The QUIC origin's arms: each TCP arm and its QUIC arm on the same port number.
QUIC_ARMS = [
    {"iw": 10, "port": 8010, "arm": "10", "paced": False},
    {"iw": 10, "port": 9010, "arm": "10p", "paced": True},
    {"iw": 10, "port": 8010, "arm": "10q", "paced": False},
    {"iw": 10, "port": 9010, "arm": "10pq", "paced": True},
]
#: A QUIC observation's first flight as an IW 10 arm sends it.
QUIC_FLIGHT = {
    "quic_first_flight_packets": 10,
    "quic_first_flight_bytes": 12_000,
    "quic_max_datagram_size": 1200,
    "quic_lost_packets": 1,
    "quic_zero_rtt": False,
}


def v9(document: dict[str, Any]) -> dict[str, Any]:
    return {**document, "wire_version": 9}


def quic_origin(client: httpx.Client, origin_token: str, **fields: Any) -> httpx.Response:
    body = {"name": f"h3-{uuid.uuid4().hex[:6]}", "region": "eu", "host": "10.0.0.9", "tls": True, "arms": QUIC_ARMS}
    return client.post(wire.ORIGIN_ENROLL_PATH, headers=bearer(origin_token), json={**body, **fields})


def create_campaign(client: httpx.Client, admin_token: str, origin_id: str, arms: list[Any], **fields: Any) -> httpx.Response:
    now = dt.datetime.now(dt.UTC)
    body = {
        "name": f"arms {arms}",
        "origin_ids": [origin_id],
        "arms": arms,
        "sizes": [100_000],
        "starts_at": (now - dt.timedelta(minutes=1)).isoformat(),
        "ends_at": (now + dt.timedelta(hours=1)).isoformat(),
    }
    return client.post("/api/v1/campaigns", headers=bearer(admin_token), json={**body, **fields})


def quic_trial(probe_id: str, origin_id: str | None = None, campaign_id: int | None = None, **overrides: Any) -> dict[str, Any]:
    """A QUIC arm's trial as ``iwprobe`` writes it: no TCP connection, the QUIC handshake as the
    TLS one, the first flight from the client's datagram log (packets of 1,200 bytes)."""
    said: dict[str, Any] = {
        "arm_iw": 10,
        "arm": "10q",
        "protocol": "quic",
        "url": "https://10.0.0.9:8010/obj/100000",
        "connect_us": None,
        "tcp_info": {},
        "tls_version": "TLSv1.3",
        "tls_handshake_us": 101_000,
        "client_iw": {"status": "ok", "segments": 10, "bytes": 12_000, "mss": 1200, "reason": ""},
    }
    return make_trial(probe_id, origin_id, campaign_id, **{**said, **overrides})


def quic_observation(trial: dict[str, Any], origin_id: str, **overrides: Any) -> dict[str, Any]:
    """The QUIC origin's observation of ``trial``: no ``tcp_info``, the window in packets."""
    said: dict[str, Any] = {
        "arm": trial["arm"],
        "protocol": "quic",
        "tcp_info": {},
        "peer_rwnd": None,
        "response_latency_us": 61_000,
        "snd_cwnd_at_accept": 10,
        "tls_version": "TLSv1.3",
        "tls_handshake_us": 100_400,
        **QUIC_FLIGHT,
    }
    return make_observation(trial, origin_id, **{**said, **overrides})


def stored(db_engine: Engine, table: str, columns: str, ids: list[str]) -> dict[str, tuple[Any, ...]]:
    """``columns`` of the rows of ``table`` whose ``trial_id`` is one of ``ids``, by trial id."""
    with db_engine.connect() as connection:
        rows = connection.execute(
            text(f"SELECT trial_id::text, {columns} FROM {table} WHERE trial_id = ANY(CAST(:ids AS uuid[]))"), {"ids": ids}
        ).all()
    return {row[0]: tuple(row[1:]) for row in rows}


# ----------------------------------------------------------------------------- stored and joined
def test_a_quic_trial_and_its_observation_are_stored_and_joined(
    client: httpx.Client, enroll_token: str, origin_token: str, admin_token: str, db_engine: Engine, celery_worker: Any
) -> None:
    """The join keys on the trial id, whatever the protocol: the QUIC observation's response
    latency, window (in packets) and handshake reach the trial; its TCP-only numbers stay NULL."""
    probe = enroll_probe(client, enroll_token)
    enrolled = quic_origin(client, origin_token)
    assert enrolled.status_code == 201, enrolled.text
    origin = Enrolled(enrolled.json()["id"], enrolled.json()["credential"])
    created = create_campaign(client, admin_token, origin.id, [10, "10q"])
    assert created.status_code == 201, created.text
    campaign_id = created.json()["id"]
    tcp = make_trial(probe.id, origin.id, campaign_id, arm_iw=10, arm="10", protocol="tcp", round=1)
    quic = quic_trial(probe.id, origin.id, campaign_id, round=1)
    answer = client.post(wire.TRIALS_BATCH_PATH, json=v9(make_batch(probe.id, [tcp, quic])), headers=probe.headers)
    assert answer.status_code == 200 and answer.json()["accepted"] == 2, answer.text
    observations = [make_observation(tcp, origin.id, arm="10", protocol="tcp"), quic_observation(quic, origin.id)]
    answer = client.post(
        wire.OBSERVATIONS_BATCH_PATH, json=v9(make_observation_batch(origin.id, observations)), headers=origin.headers
    )
    assert answer.status_code == 200 and answer.json()["accepted"] == 2, answer.text

    columns = (
        "protocol, arm, connect_us, tcpi_rtt_us, tcp_info, client_iw_segments, client_iw_mss, tls_handshake_us, "
        "server_latency_us, server_snd_cwnd_at_accept, server_total_retrans, server_bytes_sent, server_tls_handshake_us"
    )
    ids = [tcp["trial_id"], quic["trial_id"]]

    def joined() -> dict[str, tuple[Any, ...]] | None:
        with db_engine.connect() as connection:
            done = connection.execute(
                text("SELECT count(*) FROM trials WHERE trial_id = ANY(CAST(:ids AS uuid[])) AND joined_at IS NOT NULL"),
                {"ids": ids},
            ).scalar_one()
        return stored(db_engine, "trials", columns, ids) if done == 2 else None

    rows = wait_for(joined, what="both trials joined")
    # The QUIC arm is stored by its label (not a plain arm: the roll-ups, `arm IS NULL`, leave it out).
    assert rows[quic["trial_id"]] == ("quic", "10q", None, None, {}, 10, 1200, 101_000, 61_000, 10, None, None, 100_400)
    assert rows[tcp["trial_id"]] == ("tcp", None, 20_000, 20_500, tcp["tcp_info"], None, None, None, 90_000, 10, 1, 100_250, None)
    observed = stored(
        db_engine,
        "origin_observations",
        "protocol, arm, " + ", ".join(QUIC_FLIGHT) + ", tcp_info, tcpi_total_retrans, joined_at IS NOT NULL",
        ids,
    )
    assert observed[quic["trial_id"]] == ("quic", "10q", 10, 12_000, 1200, 1, False, {}, None, True)
    assert observed[tcp["trial_id"]] == ("tcp", "10", None, None, None, None, None, observations[0]["tcp_info"], 1, True)

    # The trial inspector's read names each trial's protocol; the TCP trial is the QUIC one's twin.
    traced = client.get(f"/api/v1/trials/{quic['trial_id']}/traces")
    assert traced.status_code == 200, traced.text
    body = traced.json()
    assert (body["trial"]["arm"], body["trial"]["protocol"]) == ("10q", "quic")
    assert [(twin["arm"], twin["protocol"]) for twin in body["twins"]] == [("10", "tcp")]


def test_a_wire_v8_batch_is_stored_as_before(client: httpx.Client, probe: Enrolled, origin: Enrolled, db_engine: Engine) -> None:
    """Records of agents older than v9 say no protocol: stored as NULL ("not said", TCP), with no
    QUIC first flight."""
    trial = make_trial(probe.id, origin.id, arm_iw=10, arm="10p")
    batch = {**make_batch(probe.id, [trial]), "wire_version": 8}
    assert "protocol" not in trial
    answer = client.post(wire.TRIALS_BATCH_PATH, json=batch, headers=probe.headers)
    assert answer.status_code == 200 and answer.json()["accepted"] == 1, answer.text
    observation = make_observation(trial, origin.id, arm="10p", send_path="paced")
    answer = client.post(
        wire.OBSERVATIONS_BATCH_PATH,
        json={**make_observation_batch(origin.id, [observation]), "wire_version": 8},
        headers=origin.headers,
    )
    assert answer.status_code == 200 and answer.json()["accepted"] == 1, answer.text
    assert stored(db_engine, "trials", "protocol, arm", [trial["trial_id"]]) == {trial["trial_id"]: (None, "10p")}
    flight = ", ".join(QUIC_FLIGHT)
    row = stored(db_engine, "origin_observations", f"protocol, send_path, {flight}", [trial["trial_id"]])
    assert row == {trial["trial_id"]: (None, "paced", None, None, None, None, None)}


# ----------------------------------------------------------------------------- refused
TRIAL_REFUSALS = [
    ("a QUIC arm whose protocol is not said", {"protocol": ""}, "protocol"),
    ("a paced QUIC arm said to be TCP", {"arm": "10pq", "protocol": "tcp"}, "protocol"),
    ("QUIC over a TCP arm", {"arm": "10"}, "protocol"),
    ("QUIC over a wire-v1 plain arm", {"arm": ""}, "protocol"),
    ("QUIC over the learned arm", {"arm": "learned"}, "protocol"),
    ("a QUIC trial with a TCP connect time", {"connect_us": 20_000}, "connect_us"),
    ("a QUIC trial with TCP_INFO", {"tcp_info": {"rtt": 20_500}}, "tcp_info"),
]


@pytest.mark.parametrize(("case", "overrides", "field"), TRIAL_REFUSALS, ids=[case[0] for case in TRIAL_REFUSALS])
def test_a_trial_whose_protocol_disagrees_refuses_the_batch(
    client: httpx.Client, probe: Enrolled, origin: Enrolled, db_engine: Engine, case: str, overrides: dict[str, Any], field: str
) -> None:
    """A 422 naming the record and field; nothing of the batch is stored (its good trial neither)."""
    good = quic_trial(probe.id, origin.id)
    bad = quic_trial(probe.id, origin.id, **overrides)
    refused = client.post(wire.TRIALS_BATCH_PATH, json=v9(make_batch(probe.id, [good, bad])), headers=probe.headers)
    assert refused.status_code == 422, refused.text
    errors = refused.json()["detail"]["errors"]
    assert [(error["section"], error["index"], error["record_id"], error["field"]) for error in errors] == [
        ("trials", 1, bad["trial_id"], field)
    ], case
    assert stored(db_engine, "trials", "protocol", [good["trial_id"], bad["trial_id"]]) == {}


OBSERVATION_REFUSALS: list[tuple[str, Callable[[dict[str, Any], str], dict[str, Any]], str]] = [
    ("a QUIC arm whose protocol is not said", lambda trial, origin: quic_observation(trial, origin, protocol=""), "protocol"),
    ("QUIC over a TCP arm", lambda trial, origin: quic_observation(trial, origin, arm="10"), "protocol"),
    (
        "a QUIC observation with TCP_INFO",
        lambda trial, origin: quic_observation(trial, origin, tcp_info={"total_retrans": 1}),
        "tcp_info",
    ),
    (
        "a TCP observation with a QUIC first flight",
        lambda trial, origin: make_observation(trial, origin, arm="10", quic_first_flight_packets=10),
        "quic_first_flight_packets",
    ),
    (
        "a TCP observation saying 0-RTT",
        lambda trial, origin: make_observation(trial, origin, protocol="tcp", quic_zero_rtt=False),
        "quic_zero_rtt",
    ),
]


@pytest.mark.parametrize(("case", "build", "field"), OBSERVATION_REFUSALS, ids=[case[0] for case in OBSERVATION_REFUSALS])
def test_an_observation_whose_protocol_disagrees_refuses_the_batch(
    client: httpx.Client,
    probe: Enrolled,
    origin: Enrolled,
    db_engine: Engine,
    case: str,
    build: Callable[[dict[str, Any], str], dict[str, Any]],
    field: str,
) -> None:
    """As for trials: a 422 naming the record and field, nothing of the batch stored."""
    trials = [quic_trial(probe.id, origin.id) for _ in range(2)]
    good, bad = quic_observation(trials[0], origin.id), build(trials[1], origin.id)
    refused = client.post(
        wire.OBSERVATIONS_BATCH_PATH, json=v9(make_observation_batch(origin.id, [good, bad])), headers=origin.headers
    )
    assert refused.status_code == 422, refused.text
    errors = refused.json()["detail"]["errors"]
    assert [(error["section"], error["index"], error["record_id"], error["field"]) for error in errors] == [
        ("observations", 1, bad["trial_id"], field)
    ], case
    assert stored(db_engine, "origin_observations", "protocol", [trial["trial_id"] for trial in trials]) == {}


@pytest.mark.parametrize(
    ("protocol", "arm", "agrees"),
    [
        ("", "", True),
        ("", "10", True),
        ("tcp", "10p", True),
        ("", "learned", True),
        ("quic", "10q", True),
        ("quic", "32pq", True),
        ("", "10q", False),
        ("tcp", "10pq", False),
        ("quic", "10", False),
        ("quic", "10p", False),
        ("quic", "", False),
        ("quic", "learned", False),
    ],
)
@pytest.mark.unit
def test_the_protocol_is_the_arms(protocol: str, arm: str, agrees: bool) -> None:
    assert (arm_mismatch(protocol, arm) is None) == agrees


# ----------------------------------------------------------------------------- enrollment and schedules
def test_quic_arms_reach_wire_v9_probes_only(
    client: httpx.Client, enroll_token: str, origin_token: str, admin_token: str
) -> None:
    """An origin enrolls its QUIC arms as ordinary ``ArmPort``s; a campaign with a QUIC arm is
    withheld from probes below wire v9 (not given without the arm), one without is given to every
    probe without the QUIC listeners."""
    region = f"h3-{uuid.uuid4().hex[:6]}"
    probe = enroll_probe(client, enroll_token, region=region)
    refused = quic_origin(client, origin_token, tls=False)
    assert refused.status_code == 422 and "tls" in refused.text, refused.text
    enrolled = quic_origin(client, origin_token)
    assert enrolled.status_code == 201, enrolled.text
    origin_id = enrolled.json()["id"]
    listed = [item for item in client.get("/api/v1/origins", headers=bearer(admin_token)).json() if item["id"] == origin_id]
    assert [item["arms"] for item in listed] == [QUIC_ARMS]

    for arms in (["1000pq"], ["10qp"], ["10q", "10q"]):
        assert create_campaign(client, admin_token, origin_id, arms).status_code == 422, arms
    over_quic = create_campaign(client, admin_token, origin_id, [10, "10q", "10pq"], probe_regions=[region])
    assert over_quic.status_code == 201, over_quic.text
    assert (over_quic.json()["arms"], over_quic.json()["arm_labels"]) == ([10, 10, 10], ["10", "10q", "10pq"])
    tcp_only = create_campaign(client, admin_token, origin_id, [10], probe_regions=[region])
    assert tcp_only.status_code == 201, tcp_only.text
    quic_id, tcp_id = over_quic.json()["id"], tcp_only.json()["id"]

    def schedule(version: int, etag: str | None = None) -> httpx.Response:
        headers = {**probe.headers, **({"If-None-Match": etag} if etag else {})}
        return client.get(wire.PROBE_SCHEDULE_PATH.format(probe_id=probe.id) + f"?wire_version={version}", headers=headers)

    def campaigns(version: int) -> dict[int, list[tuple[str, int, bool]]]:
        answer = schedule(version)
        assert answer.status_code == 200, answer.text
        return {
            entry["campaign_id"]: [
                (arm["arm"], arm["port"], arm["paced"]) for target in entry["targets"] for arm in target["arms"]
            ]
            for entry in answer.json()["campaigns"]
        }

    ours = {quic_id, tcp_id}  # the probe's region is its own, but campaigns of every region reach it too
    current = {key: value for key, value in campaigns(9).items() if key in ours}
    assert current == {quic_id: [("10", 8010, False), ("10q", 8010, False), ("10pq", 9010, True)], tcp_id: [("10", 8010, False)]}
    for version in (8, 5, 4):
        assert {key: value for key, value in campaigns(version).items() if key in ours} == {tcp_id: [("10", 8010, False)]}, (
            version
        )
    for version in (3, 2):  # nor HTTPS: the origin is withheld from them as before, the QUIC campaign still
        assert {key: value for key, value in campaigns(version).items() if key in ours} == {tcp_id: []}, version
    # The schedule's ETag tells the levels apart: a v8 probe holding v9's gets the whole answer.
    v9_etag = schedule(9).headers["ETag"]
    assert schedule(9, v9_etag).status_code == 304
    assert schedule(8, v9_etag).status_code == 200


# ----------------------------------------------------------------------------- census
CADDY_URL = "https://caddy.example/big"


def test_census_records_say_their_protocol_and_each_protocol_is_its_own_target(
    client: httpx.Client, probe: Enrolled, admin_token: str, db_engine: Engine
) -> None:
    """Caddy's windows: 10 segments over TCP, 32 packets of 1,252 bytes over QUIC.  Both are
    stored and exported with their protocol; the census answers each protocol apart (mixed, it
    would be neither), and ``proto=`` keeps one."""
    now = dt.datetime.now(dt.UTC)
    created = client.post(
        "/api/v1/campaigns",
        headers=bearer(admin_token),
        json={"name": "h3 census", "census_urls": ["https://caddy.example/big"], "starts_at": now.isoformat()},
    )
    assert created.status_code == 201, created.text
    campaign_id = created.json()["id"]
    quic = {"iw_segments": 32, "iw_bytes": 40_822, "mss": 1252, "announced_mss": None, "http_status": 200}
    records = [census_record(probe.id, CADDY_URL, campaign_id, protocol=protocol) for protocol in ("", "tcp", "tcp")]
    records += [census_record(probe.id, CADDY_URL, campaign_id, protocol="quic", **quic) for _ in range(3)]
    bad = census_record(probe.id, CADDY_URL, campaign_id, protocol="h3")
    refused = client.post(
        wire.TRIALS_BATCH_PATH, json=v9(make_batch(probe.id, []) | {"census": [*records, bad]}), headers=probe.headers
    )
    assert refused.status_code == 422, refused.text
    assert [(e["section"], e["index"], e["field"]) for e in refused.json()["detail"]["errors"]] == [("census", 6, "protocol")]
    answer = client.post(wire.TRIALS_BATCH_PATH, json=v9(make_batch(probe.id, []) | {"census": records}), headers=probe.headers)
    assert answer.status_code == 200 and answer.json()["accepted"] == 6, answer.text
    with db_engine.connect() as connection:
        rows = connection.execute(
            text("SELECT census_id::text, protocol, iw_segments FROM census_records WHERE campaign_id = :c"), {"c": campaign_id}
        ).all()
    expected = {record["census_id"]: (record["protocol"] or None, record["iw_segments"]) for record in records}
    assert {row[0]: (row[1], row[2]) for row in rows} == expected

    def answers(**params: str) -> list[tuple[str, int, int, dict[str, int], int]]:
        targets = client.get("/api/v1/analysis/census", params={"campaign": campaign_id, **params}).json()["data"]
        return [
            (t["protocol"], t["overall"]["records"], t["overall"]["iw_segments"], t["overall"]["values"], t["overall"]["mss"])
            for t in targets
        ]

    assert answers() == [("quic", 3, 32, {"32": 3}, 1252), ("tcp", 3, 10, {"10": 3}, 1448)]
    assert answers(proto="quic") == [("quic", 3, 32, {"32": 3}, 1252)]
    assert answers(proto="tcp") == [("tcp", 3, 10, {"10": 3}, 1448)]
    series = client.get("/api/v1/analysis/census/series", params={"campaign": campaign_id}).json()["data"]
    assert sorted((day["protocol"], day["answer"]["iw_segments"]) for day in series) == [("quic", 32), ("tcp", 10)]
    exported = client.get("/api/v1/census.parquet", params={"campaign_id": campaign_id})
    assert exported.status_code == 200, exported.text
    table = pq.read_table(io.BytesIO(exported.content)).select(["census_id", "protocol"]).to_pylist()
    assert {row["census_id"]: row["protocol"] for row in table} == {key: value[0] for key, value in expected.items()}


# ----------------------------------------------------------------------------- exports
def test_exports_carry_the_protocol_as_stored(
    client: httpx.Client, probe: Enrolled, origin: Enrolled, campaign: dict[str, Any]
) -> None:
    """Every export of trials has ``protocol`` as stored -- ``tcp``, ``quic``, or empty/null for
    "not said" (TCP) -- and the observations' Parquet the QUIC first flight, typed."""
    not_said = make_trial(probe.id, origin.id, campaign["id"], arm_iw=3)
    tcp = make_trial(probe.id, origin.id, campaign["id"], arm_iw=10, protocol="tcp")
    quic = quic_trial(probe.id, origin.id, campaign["id"])
    answer = client.post(wire.TRIALS_BATCH_PATH, json=v9(make_batch(probe.id, [not_said, tcp, quic])), headers=probe.headers)
    assert answer.status_code == 200, answer.text
    observations = [make_observation(tcp, origin.id), quic_observation(quic, origin.id)]
    answer = client.post(
        wire.OBSERVATIONS_BATCH_PATH, json=v9(make_observation_batch(origin.id, observations)), headers=origin.headers
    )
    assert answer.status_code == 200, answer.text
    expected = {not_said["trial_id"]: None, tcp["trial_id"]: "tcp", quic["trial_id"]: "quic"}
    as_text = {trial_id: protocol or "" for trial_id, protocol in expected.items()}

    trials = client.get("/api/v1/trials.parquet", params={"campaign_id": campaign["id"]})
    assert trials.status_code == 200, trials.text
    rows = pq.read_table(io.BytesIO(trials.content)).select(["trial_id", "protocol"]).to_pylist()
    assert {row["trial_id"]: row["protocol"] for row in rows} == expected
    for path, params in (
        ("/api/v1/trials.csv", {"campaign_id": campaign["id"]}),
        ("/api/v1/analysis/trials.csv", {"campaign": campaign["id"]}),
    ):
        read = list(csv.DictReader(io.StringIO(client.get(path, params=params).text)))
        assert {row["trial_id"]: row["protocol"] for row in read} == as_text, path
    page = client.get("/api/v1/analysis/trials", params={"campaign": campaign["id"]})
    assert page.status_code == 200, page.text
    assert {row["trial_id"]: row["protocol"] for row in page.json()["data"]} == expected

    exported = client.get("/api/v1/observations.parquet", params={"campaign_id": campaign["id"]})
    assert exported.status_code == 200, exported.text
    table = pq.read_table(io.BytesIO(exported.content))
    assert str(table.schema.field("quic_zero_rtt").type) == "bool"
    assert str(table.schema.field("quic_first_flight_bytes").type) == "int64"
    read_back = {row.pop("trial_id"): row for row in table.select(["trial_id", "protocol", *QUIC_FLIGHT]).to_pylist()}
    assert read_back == {
        tcp["trial_id"]: {"protocol": None, **dict.fromkeys(QUIC_FLIGHT)},
        quic["trial_id"]: {"protocol": "quic", **QUIC_FLIGHT},
    }


# ----------------------------------------------------------------------------- the database's own check
_INSERTS = {
    "trials": (
        "INSERT INTO trials (trial_id, started_at, probe_id, round, arm_iw, object_size, url, bytes_received, syn_retrans, "
        "tcp_info, protocol) VALUES (gen_random_uuid(), now(), gen_random_uuid(), 0, 10, 1, 'u', 1, 0, '{}', :protocol)"
    ),
    "origin_observations": (
        "INSERT INTO origin_observations (trial_id, origin_id, arm_iw, port, client_addr, object_size, request_at, "
        "first_byte_us, snd_cwnd_at_accept, cwnd_mismatch, rwnd_limited, http_status, tcp_info, protocol) VALUES "
        "(gen_random_uuid(), gen_random_uuid(), 10, 8010, '10.0.1.2', 1, now(), 1, 10, false, false, 200, '{}', :protocol)"
    ),
    "census_records": (
        "INSERT INTO census_records (census_id, probe_id, round, url, host, measured_at, status, reason, connections, "
        "connections_ok, protocol) VALUES (gen_random_uuid(), gen_random_uuid(), 0, 'https://a/', 'a', now(), 'ok', '', 3, 3, "
        ":protocol)"
    ),
}


@pytest.mark.parametrize("table", sorted(_INSERTS))
def test_the_database_holds_only_the_named_protocols(db_engine: Engine, table: str) -> None:
    """NULL ("not said"), ``tcp`` and ``quic``; anything else breaks the migration's check,
    whatever writes the row (every statement rolled back)."""
    with db_engine.connect() as connection:
        for protocol in (None, "tcp", "quic"):
            connection.execute(text(_INSERTS[table]), {"protocol": protocol})
        connection.rollback()
        for protocol in ("", "h3", "QUIC"):
            with pytest.raises(sqlalchemy.exc.IntegrityError, match=f"ck_{table}_protocol_known"):
                connection.execute(text(_INSERTS[table]), {"protocol": protocol})
            connection.rollback()
