"""Privacy of passive measurement: after passive batches and the rest of the ingest (probes,
origins, trials with census records, observations, path samples, heartbeats, the worker's join
and roll-ups), no text, jsonb or text-array column of any table of the test database holds an IP
address -- except the columns listed in :data:`EXEMPT`, each with the reason it may.  And the
ingest refuses what would smuggle a client address in: a ``client_prefix`` that is not 16 hex
digits, a ``region`` holding an address; a server's error text is stored with its addresses
replaced.

The scan is this module's own (a regex for candidates, :mod:`ipaddress` to confirm), not the
collector's :mod:`iwscope.passive.privacy`, so a fault in one is not hidden by the other.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
import uuid
from typing import Any

import httpx
import pytest
import sqlalchemy.exc
from passive_kit import (
    count_rows,
    enroll_server,
    make_aggregate,
    make_connection,
    make_heartbeat,
    make_passive_batch,
    running_campaign,
)
from sqlalchemy import Connection, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from testkit import (
    Enrolled,
    bearer,
    census_record,
    enroll_origin,
    enroll_probe,
    make_batch,
    make_observation,
    make_observation_batch,
    make_path_sample,
    make_trial,
    wait_folded,
)

from iwprobe import wire

#: (table, column) -> why it may hold an IP address.  Every one is an address of a *server* an
#: operator or an admin configured (or the text naming it), or of iwscope's own probe -- never of
#: a real user, which passive measurement is about.
EXEMPT: dict[tuple[str, str], str] = {
    ("origins", "host"): "the address an operator enrolled an iwscope origin with; probes fetch from it",
    ("origins", "host6"): "the same origin's IPv6 address",
    ("trials", "url"): "the URL a probe fetched from an origin: its host is the origin's configured address",
    ("trials", "error_detail"): "a probe's error text about the origin it fetched (a TLS name mismatch, say, "
    "names the origin's address)",
    ("census_records", "url"): "a census target: a public server an admin named in census_urls",
    ("census_records", "host"): "the host of that target URL",
    ("census_records", "error_detail"): "a probe's error text about the census target it measured",
    ("campaigns", "census_urls"): "the census targets as the admin configured them",
    ("origin_observations", "client_addr"): "the address of iwscope's own probe as its origin saw it (wire "
    "OriginObservation.client_addr): a measurement agent enrolled by the "
    "operator, not a real user; passive records have no such field",
}
#: Column types scanned (``information_schema`` spelling; arrays by their element's ``udt_name``).
TEXT_TYPES = ("text", "character varying", "character", "json", "jsonb")
TEXT_ARRAYS = ("_text", "_varchar", "_bpchar", "_json", "_jsonb")
#: What PostgreSQL pre-selects (cheap), then Python confirms: a dotted quad, or two colons with hex between.
PREFILTER = r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}|[0-9A-Fa-f]*:[0-9A-Fa-f]*:"
_IPV4 = re.compile(r"(?<![0-9.])(?:[0-9]{1,3}\.){3}[0-9]{1,3}(?![0-9])")
_IPV6 = re.compile(r"(?<![0-9A-Fa-f:])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{1,4}|(?:[0-9]{1,3}\.){3}[0-9]{1,3})?")


def addresses(value: str) -> list[str]:
    """The IPv4 and IPv6 addresses in ``value`` (candidates confirmed by ``ipaddress``; the bare
    ``::`` of some text is no address of anyone)."""
    found = []
    for candidate in _IPV4.findall(value) + _IPV6.findall(value):
        for form in (candidate, candidate.rstrip(":")):
            if form in ("", "::"):
                continue
            try:
                ipaddress.ip_address(form)
            except ValueError:
                continue
            found.append(form)
            break
    return found


def scanned_columns(connection: Connection) -> list[tuple[str, str]]:
    """Every text, json(b) and text-array column of every table (partitions through their parent)."""
    return [
        tuple(row)
        for row in connection.execute(
            text(
                "SELECT c.table_name, c.column_name FROM information_schema.columns c "
                "JOIN pg_class k ON k.relname = c.table_name JOIN pg_namespace n ON n.oid = k.relnamespace "
                "AND n.nspname = c.table_schema "
                "WHERE c.table_schema = 'public' AND k.relkind IN ('r', 'p') AND NOT k.relispartition "
                "AND (c.data_type = ANY(:types) OR (c.data_type = 'ARRAY' AND c.udt_name = ANY(:arrays))) "
                "ORDER BY 1, 2"
            ),
            {"types": list(TEXT_TYPES), "arrays": list(TEXT_ARRAYS)},
        )
    ]


def scan(connection: Connection) -> dict[tuple[str, str], list[str]]:
    """(table, column) -> addresses found there, for every scanned column not in :data:`EXEMPT`."""
    findings: dict[tuple[str, str], list[str]] = {}
    for table, column in scanned_columns(connection):
        if (table, column) in EXEMPT:
            continue
        values = connection.execute(
            text(f'SELECT DISTINCT "{column}"::text FROM "{table}" WHERE "{column}"::text ~ :prefilter LIMIT 10000'),
            {"prefilter": PREFILTER},
        ).scalars()
        found = [address for value in values for address in addresses(value)]
        if found:
            findings[(table, column)] = sorted(set(found))[:5]
    return findings


def test_the_scanner_finds_addresses_and_ignores_what_is_not_one() -> None:
    for value in (
        "198.51.100.7",
        '{"arms_state": "error: 2001:db8::5 gone"}',
        "{10.0.0.1,x}",
        "x ::ffff:192.0.2.9",
        "fe80::1%eth0",
        "[2001:db8:0:0:0:0:0:9]:443",
        "at 203.0.113.5.",
    ):
        assert addresses(value), value
    for value in (
        "2026-11-26T15:00:00.000000Z",
        "6.1.0-13-amd64",
        "0123456789abcdef",
        "eu-west",
        "{a,b}",
        '{"rtt": 20500, "snd_cwnd": 10}',
        "1.2.3.4000",
        "10:20:30",
        "::",
        "version 0.6.1",
    ):
        assert not addresses(value), value


def _ingest_everything(
    client: httpx.Client, enroll_token: str, origin_token: str, admin_token: str, server_token: str
) -> dict[str, Any]:
    """One of everything the suite uploads, as the suite uploads it; returns the ids."""
    probe, origin = enroll_probe(client, enroll_token), enroll_origin(client, origin_token)
    now = dt.datetime.now(dt.UTC)
    campaign = client.post(
        "/api/v1/campaigns",
        headers=bearer(admin_token),
        json={
            "name": "privacy",
            "origin_ids": [origin.id],
            "arms": [3, 10],
            "sizes": [100_000],
            "starts_at": now.isoformat(),
            "ends_at": (now + dt.timedelta(hours=1)).isoformat(),
        },
    ).json()
    trials = [make_trial(probe.id, origin.id, campaign["id"], arm_iw=iw) for iw in (3, 10)]
    batch = make_batch(probe.id, trials, [make_path_sample(probe.id, origin.id)])
    batch.update(
        wire_version=5,
        census=[census_record(probe.id, "https://192.0.2.80/big.bin")],
        heartbeat={"version": "0.5.0", "spool_backlog": 0, "spool_bytes": 0, "uptime_s": 5, "trials_measured": 2},
    )
    assert client.post(wire.TRIALS_BATCH_PATH, json=batch, headers=probe.headers).status_code == 200
    observations = make_observation_batch(origin.id, [make_observation(trial, origin.id) for trial in trials])
    assert client.post(wire.OBSERVATIONS_BATCH_PATH, json=observations, headers=origin.headers).status_code == 200

    server = enroll_server(client, server_token)
    passive = running_campaign(client, admin_token, [server.id])
    aggregates = [
        make_aggregate(server.id, passive["id"], arm=arm, arm_iw=iw, family=family, region=region)
        for arm, iw, family, region in (("16", 16, "ipv4", "DE"), ("default", None, "ipv6", ""), ("32", 32, "ipv4", "eu-west"))
    ]
    connections = [make_connection(server.id, passive["id"], family=family) for family in ("ipv4", "ipv6")]
    heartbeat = make_heartbeat(arms_state="error: cannot mark 203.0.113.44 and 2001:db8:40::7 (EPERM)")
    answer = client.post(
        wire.PASSIVE_BATCH_PATH, headers=server.headers, json=make_passive_batch(server.id, aggregates, connections, heartbeat)
    )
    assert answer.status_code == 200 and answer.json()["accepted"] == 5, answer.text
    return {"probe": probe, "server": server, "passive": passive}


@pytest.mark.parametrize(
    "client_prefix",
    [
        "192.0.2.1",
        "2001:db8::1",
        "::ffff:c000:201",
        "c0000201",
        "C000020100000000",
        "c000020100000000a",
        "c00002010000000g",
        "c0.0.2.1.0000000",
        "",
        "000000000000000:",
    ],
)
def test_a_client_prefix_that_is_no_keyed_hash_is_refused(
    client: httpx.Client, server: Enrolled, admin_token: str, db_engine: Engine, client_prefix: str
) -> None:
    campaign = running_campaign(client, admin_token, [server.id])
    record = make_connection(server.id, campaign["id"], client_prefix=client_prefix)
    answer = client.post(wire.PASSIVE_BATCH_PATH, json=make_passive_batch(server.id, [], [record]), headers=server.headers)
    assert answer.status_code == 422, answer.text
    assert [(error["section"], error["field"]) for error in answer.json()["detail"]["errors"]] == [
        ("connections", "client_prefix")
    ]
    assert count_rows(db_engine, server.id) == (0, 0)


def test_no_table_holds_an_address_after_the_whole_ingest(
    client: httpx.Client,
    enroll_token: str,
    origin_token: str,
    admin_token: str,
    server_token: str,
    celery_worker: Any,
    db_engine: Engine,
) -> None:
    ingested = _ingest_everything(client, enroll_token, origin_token, admin_token, server_token)
    wait_folded(db_engine, ingested["probe"].id)  # the worker joined the trials and refreshed the roll-ups
    server: Enrolled = ingested["server"]
    # Free text that would carry a client address is refused (aggregates, connections), not stored.
    for section, record in (
        ("aggregates", make_aggregate(server.id, ingested["passive"]["id"], region="10.1.2.3")),
        ("connections", make_connection(server.id, ingested["passive"]["id"], region="prefix 2001:db8:1::/48")),
    ):
        batch = make_passive_batch(server.id, **{section: [record]})
        answer = client.post(wire.PASSIVE_BATCH_PATH, json=batch, headers=server.headers)
        assert answer.status_code == 422 and answer.json()["detail"]["errors"][0]["field"] == "region", answer.text
    with db_engine.connect() as connection:
        columns = scanned_columns(connection)
        findings = scan(connection)
        heartbeat = connection.execute(text("SELECT last_heartbeat FROM servers WHERE id = :i"), {"i": server.id}).scalar_one()
    assert ("passive_connections", "region") in columns and ("servers", "last_heartbeat") in columns
    # Every exemption names a column that exists and is scanned (a stale one would hide nothing).
    assert set(EXEMPT) <= set(columns), set(EXEMPT) - set(columns)
    assert not findings, "IP addresses stored in: " + "; ".join(
        f"{table}.{column}: {', '.join(found)}" for (table, column), found in sorted(findings.items())
    )
    assert heartbeat["arms_state"] == "error: cannot mark <address> and <address> (EPERM)"


def test_the_scan_names_a_planted_address_and_the_schema_refuses_one_in_client_prefix(
    db_session: Session, server: Enrolled
) -> None:
    """The scan can fail: rows written past the API (in a transaction rolled back after the test)."""
    db_session.execute(
        text(
            "INSERT INTO passive_connections (record_id, server_id, campaign_id, phase, closed_at, arm, treated_share_bp, "
            "family, port_kind, port, region, country, client_prefix, cluster, tcp_info, captured, syn_retrans, "
            "rwnd_limited, reused_after_idle) VALUES (:r, :s, 1, 0, now(), 'default', 0, 'ipv4', 'user', 443, "
            "'198.51.100.23', '', '00000000000000aa', 0, '{}', false, false, false, false)"
        ),
        {"r": uuid.uuid4(), "s": server.id},
    )
    db_session.execute(
        text('UPDATE servers SET last_heartbeat = \'{"arms_state": "error: 2001:db8::5"}\' WHERE id = :s'), {"s": server.id}
    )
    findings = scan(db_session.connection())
    assert findings == {("passive_connections", "region"): ["198.51.100.23"], ("servers", "last_heartbeat"): ["2001:db8::5"]}
    with pytest.raises(sqlalchemy.exc.IntegrityError, match="client_prefix_hash"), db_session.begin_nested():
        db_session.execute(
            text(
                "INSERT INTO passive_connections (record_id, server_id, campaign_id, phase, closed_at, arm, "
                "treated_share_bp, family, port_kind, port, region, country, client_prefix, cluster, tcp_info, captured, "
                "syn_retrans, rwnd_limited, reused_after_idle) VALUES (:r, :s, 1, 0, now(), 'default', 0, 'ipv4', "
                "'user', 443, '', '', '192.0.2.1', 0, '{}', false, false, false, false)"
            ),
            {"r": uuid.uuid4(), "s": server.id},
        )
