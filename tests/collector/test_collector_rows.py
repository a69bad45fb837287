"""Rows made in SQL from the wire's JSON (``iwscope.trials.rows``): every column a record does
not carry as such -- typed ``tcp_info`` fields, the client-side IW, "not said" as NULL, the plain
arm, the flow role of a wire-v1/v2 URL, timestamps with an offset -- stored as the Python rules
of the wire (``wire.is_plain_arm``, ``wire.flow_role``) say, against the real database."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import httpx
import msgspec
import orjson
import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from testkit import Enrolled, enroll_origin, enroll_probe, make_batch, make_observation, make_observation_batch, make_trial

from iwprobe import wire
from iwscope.trials import fastwire, rows, services, validation
from iwscope.trials.models import OBSERVATION_TCPI_COLUMNS, TRIAL_TCPI_COLUMNS, tcpi_column_name

#: What a record that leaves out a later wire version's field says (the decoder's default).
OBSERVATION_DEFAULTS = {field.name: field.default for field in msgspec.structs.fields(fastwire.FastObservation)}

#: (overrides of make_trial) covering each derived column's cases.
TRIAL_CASES: list[dict[str, Any]] = [
    {"arm_iw": 10, "arm": "", "role": "", "url": "http://10.0.0.1:8010/obj/1000#iwscope-flow=background"},
    {"arm_iw": 10, "arm": "10", "role": "short"},
    {"arm_iw": 10, "arm": "10p", "role": "background-alone", "tls_version": "TLSv1.3", "family": "ipv6"},
    {"arm_iw": 10, "arm": "learned", "role": "", "url": "http://10.0.0.1:8010/obj/1000#iwscope-flow=nonsense"},
    {"arm_iw": 3, "arm": "", "role": "", "url": "http://h/a#iwscope-flow=interactive#iwscope-flow=page-load"},
    {"arm_iw": 3, "started_at": "2026-11-28T10:00:00.25+05:30", "tcp_info": {"rtt": 7, "rcv_mss": 1448}},
    {"arm_iw": 10, "client_iw": {"status": "ok", "segments": 10, "bytes": 14480, "mss": 1448, "reason": ""}},
    {"arm_iw": 10, "client_iw": {"status": "lower_bound", "segments": 8, "bytes": None, "mss": None, "reason": "object_ended"}},
    # wire v9: "not said" (TCP) as NULL, a said TCP as itself, a QUIC arm's trial
    {"arm_iw": 10, "arm": "10", "protocol": ""},
    {"arm_iw": 3, "arm": "3", "protocol": "tcp"},
    {"arm_iw": 10, "arm": "10q", "protocol": "quic", "connect_us": None, "tcp_info": {}, "tls_version": "TLSv1.3"},
]


@pytest.fixture()
def probe(client: httpx.Client, enroll_token: str) -> Enrolled:
    return enroll_probe(client, enroll_token)


def _row(engine: Engine, table: str, trial_id: str) -> dict[str, Any]:
    with engine.connect() as connection:
        found = connection.execute(text(f"SELECT * FROM {table} WHERE trial_id = CAST(:t AS uuid)"), {"t": trial_id})
        return dict(found.mappings().one())


def test_each_trial_column_is_the_wire_rule_of_its_record(probe: Enrolled, db_engine: Engine) -> None:
    records = [make_trial(probe.id, **case) for case in TRIAL_CASES]
    document = {**make_batch(probe.id, records), "wire_version": wire.WIRE_VERSION}
    batch = validation.validate_trial_batch(orjson.dumps(document), uuid.UUID(probe.id))
    upload = services.Upload(batch, uuid.UUID(probe.id))
    services.store_group(db_engine, [upload])
    assert isinstance(upload.outcome, services.IngestResult) and upload.outcome.accepted == len(records)
    for record in records:
        row = _row(db_engine, "trials", record["trial_id"])
        for column in rows.TRIAL_WIRE_COLUMNS:
            expected = record[column]
            if column == "started_at":
                expected = dt.datetime.fromisoformat(expected)
            elif column in ("trial_id", "probe_id", "origin_id") and expected is not None:
                expected = uuid.UUID(expected)
            assert row[column] == expected, (column, row[column], expected)
        for name in TRIAL_TCPI_COLUMNS:
            assert row[tcpi_column_name(name)] == record["tcp_info"].get(name), name
        assert row["tcp_info"] == record["tcp_info"]
        arm, role = record.get("arm", ""), record.get("role", "")
        assert row["arm"] == (None if wire.is_plain_arm(arm, record["arm_iw"]) else arm)
        assert row["role"] == wire.flow_role(record["url"], role)
        assert row["tls_version"] == (record.get("tls_version") or None)
        assert row["family"] == (record.get("family") or None)
        assert row["protocol"] == (record.get("protocol") or None)
        inference = record.get("client_iw")
        for field in ("status", "segments", "bytes", "mss"):
            assert row[f"client_iw_{field}"] == (None if inference is None else inference[field]), field
        assert row["client_iw_reason"] == (None if inference is None else inference["reason"] or None)
    # The cases do reach each rule's branches.
    roles = {wire.flow_role(record["url"], record.get("role", "")) for record in records}
    assert {"background", "short", "background-alone", "page-load"} <= roles
    assert {record.get("protocol") for record in records} == {None, "", "tcp", "quic"}


def test_each_observation_column_is_its_record(
    client: httpx.Client, origin_token: str, probe: Enrolled, db_engine: Engine
) -> None:
    origin = enroll_origin(client, origin_token)
    trials = [make_trial(probe.id, arm_iw=10) for _ in range(5)]
    quic_flight = {
        "quic_first_flight_packets": 10,
        "quic_first_flight_bytes": 12_000,
        "quic_max_datagram_size": 1200,
        "quic_lost_packets": 0,
        "quic_zero_rtt": False,
    }
    records = [
        make_observation(trials[0], origin.id),
        make_observation(trials[1], origin.id, arm="10p", tls_version="TLSv1.3", family="ipv4", send_path="writev"),
        make_observation(trials[2], origin.id, request_at="2026-11-28T01:00:00-09:30"),
        make_observation(trials[3], origin.id, arm="10", protocol="tcp"),
        make_observation(trials[4], origin.id, arm="10pq", protocol="quic", tcp_info={}, **quic_flight),
    ]
    body = orjson.dumps({**make_observation_batch(origin.id, records), "wire_version": wire.WIRE_VERSION})
    upload = services.Upload(validation.validate_observation_batch(body, uuid.UUID(origin.id)), uuid.UUID(origin.id))
    services.store_group(db_engine, [upload])
    assert isinstance(upload.outcome, services.IngestResult) and upload.outcome.accepted == len(records)
    for record in records:
        row = _row(db_engine, "origin_observations", record["trial_id"])
        for column in rows.OBSERVATION_WIRE_COLUMNS:
            expected = record.get(column, OBSERVATION_DEFAULTS.get(column))
            if column == "request_at":
                expected = dt.datetime.fromisoformat(expected)
            elif column in ("trial_id", "origin_id"):
                expected = uuid.UUID(expected)
            elif column in ("arm", "tls_version", "family", "protocol"):
                expected = expected or None
            assert row[column] == expected, (column, row[column], expected)
        for name in OBSERVATION_TCPI_COLUMNS:
            assert row[tcpi_column_name(name)] == record["tcp_info"].get(name), name
        assert row["tcp_info"] == record["tcp_info"]


def test_a_timestamp_offset_beyond_what_postgresql_reads_is_stored_as_its_instant(probe: Enrolled, db_engine: Engine) -> None:
    """Python reads +23:00; PostgreSQL refuses offsets beyond +-15:59: the record goes as UTC."""
    record = make_trial(probe.id, started_at="2026-11-28T23:00:00+23:00")
    document = {**make_batch(probe.id, [record]), "wire_version": wire.WIRE_VERSION}
    upload = services.Upload(validation.validate_trial_batch(orjson.dumps(document), uuid.UUID(probe.id)), uuid.UUID(probe.id))
    services.store_group(db_engine, [upload])
    assert isinstance(upload.outcome, services.IngestResult) and upload.outcome.accepted == 1
    assert _row(db_engine, "trials", record["trial_id"])["started_at"] == dt.datetime(2026, 11, 28, tzinfo=dt.UTC)
    assert rows.utc_text("2026-11-28T00:00:00Z", dt.datetime(2026, 11, 28, tzinfo=dt.UTC)) == "2026-11-28T00:00:00Z"
