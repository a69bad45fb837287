"""The msgspec decoder of observation batches accepts and refuses exactly what pydantic does.

The same property test as ``test_collector_fastwire.py``'s (whose value tables and mutators it
reuses), for ``POST /api/v1/observations/batch``: a seeded generator builds thousands of
observation batches, valid ones and ones with fields mutated to boundary values, wrong types
(``true`` for an int, ``1`` for a bool), unknown or missing fields, odd timestamps, the wire-v8
``send_path``/``segmentation_offload`` values and bad ones, wire v9's ``protocol`` and QUIC
first flight, plus raw-JSON oddities such as
duplicate keys; for each the verdicts of ``ObservationBatchIn.model_validate_json`` and
``fastwire.decode_observation_batch`` must agree, and when both accept, every decoded value (and
the row stored from it) must be pydantic's.  Then :func:`validate_observation_batch`'s own
checks on the fast records, and an API round trip of every stored column.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import uuid
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.engine import Engine
from test_collector_fastwire import (
    ERROR_KINDS,
    GENERIC_VALUES,
    INT_BOUNDARIES,
    STRING_VALUES,
    TIMESTAMP_VALUES,
    UUID_VALUES,
    mutate_record,
)
from testkit import Enrolled, make_observation, make_observation_batch

from iwprobe import wire
from iwscope.trials import fastwire, validation
from iwscope.trials.schemas import ObservationBatchIn, OriginObservationIn

CASES = 4000
#: A field left out (``None`` is a value).
_MISSING = object()

#: The record's fields in order: the pydantic model's (the reference the fast decoder mirrors).
OBSERVATION_FIELDS = list(OriginObservationIn.model_fields)
ENVELOPE_FIELDS = ["wire_version", "batch_id", "origin_id", "sent_at", "observations"]
#: The boundaries of the observation's own ranges (port, peer_rwnd, tls_first_flight_bytes), on
#: top of the trial test's.
OBSERVATION_INT_BOUNDARIES = [
    *INT_BOUNDARIES,
    2,
    999_999,
    16_777_215,
    16_777_216,
    16_777_217,
    4_294_967_295,
    4_294_967_296,
    4_294_967_297,
    1199,  # wire v9: quic_max_datagram_size from wire.QUIC_MIN_DATAGRAM_BYTES to a UDP payload's 65,527
    1200,
    65_527,
    65_528,
    100_000,  # quic_first_flight_packets
    100_001,
]
#: ``int`` for ``bool`` and the like; ``GENERIC_VALUES`` holds ``true`` for every int.
BOOL_VALUES = [True, False, 0, 1, 0.0, "true", "false", "True", None]
CLIENT_ADDR_VALUES = ["10.0.1.2", "fd00::1", "::ffff:192.0.2.7", "x" * 64, "x" * 65, "é" * 64, "é" * 65, " ", "a\u0000"]
ARM_VALUES = ["", "3", "10", "10p", "1000p", "9999", "10000", "learned", "Learned", "p", "10pp", "10\n", "x" * 17, " 10"]
ARM_VALUES += ["10q", "10pq", "10qp", "10qq", "q", "learnedq", "10Q"]  # wire v9: QUIC arms
TLS_VERSION_VALUES = ["", "TLSv1.3", "TLSv1.2", "x" * 64, "x" * 65, "a\u0000b", "TLSv1.3\n"]
FAMILY_VALUES = ["", "ipv4", "ipv6", "IPv4", "ipv5", "ipv4 "]
SEND_PATH_VALUES = [*wire.SEND_PATHS, "WRITEV", "sendfile ", "mss_writes", "splice", "writev\n"]
SEGMENTATION_OFFLOAD_VALUES = [*wire.SEGMENTATION_OFFLOADS, "TSO", "on", "lro", "gso\n"]
PROTOCOL_VALUES = [*wire.PROTOCOLS, "QUIC", "h3", "quic ", "udp", "tcp\n"]
TCP_INFO_VALUES: list[Any] = [
    {},
    dict.fromkeys(wire.TCP_INFO_FIELDS, 2**63 - 1),
    {"rtt": -1},
    {"rtt": 2**63},
    {"rtt": True},
    {"rtt": 1.0},
    {"rtt": None},
    {"rtt": "1"},
    {"RTT": 1},
    {"bogus": 1},
    [["rtt", 1]],
]
WIRE_VERSION_VALUES = [*wire.ACCEPTED_WIRE_VERSIONS, 0, wire.WIRE_VERSION + 1, -1, "8", 8.0, 8.5, 1.0, True, False, None, 2**64]


def observation_values(name: str) -> list[Any]:
    """Replacement values for field ``name`` of an observation or its envelope."""
    if name in ("request_at", "sent_at"):
        return TIMESTAMP_VALUES + GENERIC_VALUES
    if name.endswith("_id"):
        return UUID_VALUES + GENERIC_VALUES
    if name == "client_addr":
        return CLIENT_ADDR_VALUES + STRING_VALUES + GENERIC_VALUES
    if name == "error_kind":
        return ERROR_KINDS + GENERIC_VALUES
    if name == "wire_version":
        return WIRE_VERSION_VALUES
    if name in ("cwnd_mismatch", "rwnd_limited", "quic_zero_rtt"):
        return BOOL_VALUES + GENERIC_VALUES
    if name == "arm":
        return ARM_VALUES + GENERIC_VALUES
    if name == "tls_version":
        return TLS_VERSION_VALUES + GENERIC_VALUES
    if name == "family":
        return FAMILY_VALUES + GENERIC_VALUES
    if name == "send_path":
        return SEND_PATH_VALUES + GENERIC_VALUES
    if name == "segmentation_offload":
        return SEGMENTATION_OFFLOAD_VALUES + GENERIC_VALUES
    if name == "protocol":
        return PROTOCOL_VALUES + GENERIC_VALUES
    if name == "tcp_info":
        return TCP_INFO_VALUES + GENERIC_VALUES
    if name == "observations":
        return [None, {}, [1], [None], "x", [[]], []]
    return OBSERVATION_INT_BOUNDARIES + GENERIC_VALUES


def random_timestamp(rng: random.Random) -> str:
    """A valid wire timestamp near now, in UTC or at an offset, with or without a fraction."""
    instant = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=rng.randrange(86_400))
    offset = dt.timezone(dt.timedelta(minutes=rng.choice([0, 0, 330, -690, 23 * 60 + 59])))
    text_form = instant.astimezone(offset).isoformat(timespec=rng.choice(["seconds", "milliseconds", "microseconds"]))
    return text_form.replace("+00:00", "Z") if rng.random() < 0.7 else text_form


def make_random_observation(rng: random.Random, origin_id: str) -> dict[str, Any]:
    """A valid observation: the optional fields of later wire versions said, defaulted (absent)
    or set to their "not said" values at random."""
    arm_iw = rng.choice([1, 3, 10, 16, 1000])
    trial = {
        "trial_id": str(uuid.uuid4()),
        "arm_iw": arm_iw,
        "object_size": rng.choice([0, 100_000, 17_179_869_184]),
        "started_at": random_timestamp(rng),
    }
    observation = make_observation(
        trial,
        origin_id,
        port=rng.choice([1, 8000 + arm_iw, 65535]),
        response_latency_us=rng.choice([None, 0, 90_000, 86_400_000_000]),
        peer_rwnd=rng.choice([None, 0, 65_535, 4_294_967_296]),
        cwnd_mismatch=rng.random() < 0.2,
        rwnd_limited=rng.random() < 0.2,
        http_status=rng.choice([100, 200, 206, 404, 599]),
        error_kind=rng.choice([None, None, *wire.ERROR_KINDS]),
    )
    if rng.random() < 0.2:
        observation["tcp_info"] = rng.choice([{}, {name: rng.randint(0, 2**63 - 1) for name in wire.TCP_INFO_FIELDS}])
    if rng.random() < 0.5:  # wire v4
        observation.update(
            arm=rng.choice(["", str(arm_iw), f"{arm_iw}p", "learned"]),
            tls_version=rng.choice(["", "TLSv1.3"]),
            tls_handshake_us=rng.choice([None, 1_200]),
            tls_first_flight_bytes=rng.choice([None, 0, 4_000, 16_777_216]),
            tls_flight_acked_us=rng.choice([None, 25_000]),
            family=rng.choice(wire.FAMILIES),
        )
    if rng.random() < 0.5:  # wire v8
        observation.update(send_path=rng.choice(wire.SEND_PATHS), segmentation_offload=rng.choice(wire.SEGMENTATION_OFFLOADS))
    if rng.random() < 0.3:  # wire v9: a QUIC observation
        observation.update(
            arm=rng.choice([f"{arm_iw}q", f"{arm_iw}pq"]),
            protocol="quic",
            tcp_info={},
            quic_first_flight_packets=rng.choice([None, 0, 10, 100_000]),
            quic_first_flight_bytes=rng.choice([None, 0, 12_000, 16_777_216]),
            quic_max_datagram_size=rng.choice([None, 1200, 1252, 65_527]),
            quic_lost_packets=rng.choice([None, 0, 2**63 - 1]),
            quic_zero_rtt=rng.choice([None, False, True]),
        )
    elif rng.random() < 0.2:
        observation["protocol"] = rng.choice(["", "tcp"])
    for name in ("arm", "tls_version", "tls_handshake_us", "family", "send_path", "segmentation_offload", "protocol"):
        if rng.random() < 0.1:
            observation.pop(name, None)  # the default
    return observation


def make_document(rng: random.Random) -> Any:
    origin_id = str(uuid.uuid4())
    observations = [make_random_observation(rng, origin_id) for _ in range(rng.randrange(5))]
    document: dict[str, Any] = make_observation_batch(origin_id, observations)
    document["wire_version"] = rng.choice(wire.ACCEPTED_WIRE_VERSIONS)
    document["sent_at"] = random_timestamp(rng)
    kind = rng.randrange(10)
    if kind <= 1:
        return document  # valid
    if kind <= 6 and observations:
        mutate_record(rng, rng.choice(observations), OBSERVATION_FIELDS, observation_values)
    elif kind <= 8:
        mutate_record(rng, document, ENVELOPE_FIELDS, observation_values)
    else:
        document["observations"] = rng.choice(observation_values("observations"))
    return document


def raw_oddities(rng: random.Random) -> list[bytes]:
    """Bodies that no ``json.dumps`` of a dict produces; the first six hold duplicate keys."""
    origin_id = str(uuid.uuid4())
    observation = make_observation(str(uuid.uuid4()), origin_id, request_at="2026-11-22T10:00:00Z")
    observation.update(send_path="writev", segmentation_offload="tso")
    good = json.dumps(make_observation_batch(origin_id, [observation]))
    trial_id = observation["trial_id"]

    def replaced(old: str, new: str) -> str:
        assert old in good, old
        return good.replace(old, new, 1)

    bodies = [
        replaced('"http_status": 200', '"http_status": 200, "http_status": 404'),
        replaced('"cwnd_mismatch": false', '"cwnd_mismatch": 0, "cwnd_mismatch": false'),
        replaced('"port": 8010', '"port": 0, "port": 8010'),
        replaced('"send_path": "writev"', '"send_path": "splice", "send_path": "sendfile"'),
        replaced('"rtt": 21000', '"rtt": -1, "rtt": 21000'),
        replaced('"wire_version": 1', '"wire_version": 0, "wire_version": 8'),
        replaced('"cwnd_mismatch": false', '"cwnd_mismatch": false, "cwnd_mismatch": 0'),
        replaced('"port": 8010', '"port": 8010.0'),
        replaced('"port": 8010', '"port": 8.01e3'),
        replaced('"port": 8010', '"port": 08010'),
        replaced('"port": 8010', '"port": -0'),
        replaced('"first_byte_us": 150', '"first_byte_us": NaN'),
        replaced('"cwnd_mismatch": false', '"cwnd_mismatch": False'),
        replaced('"cwnd_mismatch": false', '"cwnd_mismatch": null'),
        replaced('"client_addr": "', '"client_addr": "\\ud800'),
        replaced('"client_addr": "', '"client_addr": "\\u0000'),
        replaced('"client_addr": "', '"client_addr": "\\u00e9\\t'),
        replaced('"request_at": "2026-11-22T10:00:00Z"', '"request_at": "2026-11-22T10:00:00\\u005a"'),
        replaced('"request_at": "2026-11-22T10:00:00Z"', '"request_at": "2026-11-22T10:00:00Z\\n"'),
        replaced('"send_path": "writev"', '"send_path": "writ\\u0065v"'),
        replaced(trial_id, trial_id.upper()),
        replaced(trial_id, trial_id[:8] + "\\u002d" + trial_id[9:]),
        good + " ",
        "\n" + good,
        good + "x",
        good[:-1],
        "",
        "null",
        "[]",
        "{}",
    ]
    encoded = [body.encode() for body in bodies]
    encoded.append(replaced('"client_addr": "', '"client_addr": "\xff').encode("latin-1"))
    encoded.append(good.encode("utf-8-sig"))
    rng.shuffle(encoded[6:])  # the duplicate-key bodies stay first
    return encoded


def pydantic_verdict(body: bytes) -> ObservationBatchIn | None:
    try:
        return ObservationBatchIn.model_validate_json(body)
    except ValidationError:
        return None


def fast_verdict(body: bytes) -> fastwire.FastObservationBatch | None:
    try:
        return fastwire.decode_observation_batch(body)
    except fastwire.FastDecodeRefused:
        return None


def service_verdict(body: bytes) -> fastwire.FastObservationBatch | None:
    """What the upload route decides (fast path, pydantic when the fast path refuses)."""
    try:
        return fastwire.decode_or_refuse_observations(body)
    except ValidationError:
        return None


def assert_same_value(value: Any, expected: Any, name: str) -> None:
    """Equal and of the same type (``True == 1``, but a bool column is no int column)."""
    assert type(value) is type(expected) and value == expected, (name, value, expected)


def assert_same_instant(value: dt.datetime, expected: dt.datetime, name: str) -> None:
    assert value == expected and value.utcoffset() == expected.utcoffset(), (name, value, expected)


def assert_same_reading(reference: ObservationBatchIn, fast: fastwire.FastObservationBatch) -> None:
    """Every decoded value is pydantic's (a stored row is made in SQL from these values:
    ``iwscope.trials.rows``, tests/collector/test_collector_rows.py)."""
    # pydantic's Literal gives the version it matched (``1`` for ``true``); it is not stored.
    assert fast.envelope.wire_version == reference.wire_version
    assert_same_value(fast.batch_id, reference.batch_id, "batch_id")
    assert_same_value(fast.origin_id, reference.origin_id, "origin_id")
    assert_same_instant(fast.sent_at, reference.sent_at, "sent_at")
    assert len(fast.observations) == len(fast.request_at) == len(reference.observations)
    for observation, request_at, expected in zip(fast.observations, fast.request_at, reference.observations, strict=True):
        for name in OBSERVATION_FIELDS:
            if name != "request_at":
                assert_same_value(getattr(observation, name), getattr(expected, name), name)
        assert_same_instant(request_at, expected.request_at, "request_at")
        assert list(observation.tcp_info.items()) == list(expected.tcp_info.items())


def check(body: bytes, duplicate_keys: bool = False) -> bool:
    """The route's verdict on ``body`` is pydantic's, with pydantic's values; returns whether it was accepted.

    The fast decoder alone must agree too, except that it may refuse bodies with duplicate keys
    (``duplicate_keys``), which pydantic reads last-value-wins: the route then stores pydantic's reading.
    """
    reference, fast, service = pydantic_verdict(body), fast_verdict(body), service_verdict(body)
    assert (reference is None) == (service is None), (
        f"pydantic {'accepts' if reference else 'refuses'}, the route {'accepts' if service else 'refuses'}: {body[:600]!r}"
    )
    if fast is not None:
        assert reference is not None, f"fast decoder accepts what pydantic refuses: {body[:600]!r}"
        assert_same_reading(reference, fast)
    elif not duplicate_keys:
        assert reference is None, f"fast decoder refuses what pydantic accepts: {body[:600]!r}"
    if reference is not None and service is not None:
        assert_same_reading(reference, service)
    return reference is not None


@pytest.mark.unit
def test_fast_decoder_agrees_with_pydantic_on_generated_observation_batches() -> None:
    rng = random.Random(20261123)
    verdicts = [check(json.dumps(make_document(rng)).encode()) for _ in range(CASES)]
    # The corpus must exercise both sides substantially, or the comparison shows little.
    assert CASES * 0.15 < sum(verdicts) < CASES * 0.85, sum(verdicts)


@pytest.mark.unit
def test_fast_decoder_agrees_on_every_field_and_value() -> None:
    """Exhaustively, what the random corpus hits only by chance: each field of a record and of
    the envelope set to each of its test values, left out, and beside an unknown field."""
    rng = random.Random(5)
    origin_id = str(uuid.uuid4())
    verdicts: list[bool] = []

    def variants(fields: list[str]) -> list[tuple[str, Any]]:
        return [(name, value) for name in fields for value in [_MISSING, *observation_values(name)]]

    for name, value in variants(OBSERVATION_FIELDS):
        observation = make_random_observation(rng, origin_id)
        if value is _MISSING:
            observation.pop(name, None)
        else:
            observation[name] = value
        verdicts.append(check(json.dumps(make_observation_batch(origin_id, [observation])).encode()))
    for name, value in variants(ENVELOPE_FIELDS):
        document = make_observation_batch(origin_id, [make_random_observation(rng, origin_id)])
        if value is _MISSING:
            del document[name]
        else:
            document[name] = value
        verdicts.append(check(json.dumps(document).encode()))
    for unknown in ("extra", "Trial_id", "_", "request_at "):
        observation = make_random_observation(rng, origin_id) | {unknown: 1}
        assert not check(json.dumps(make_observation_batch(origin_id, [observation])).encode())
        assert not check(json.dumps(make_observation_batch(origin_id, [observation]) | {unknown: 1}).encode())
    assert any(verdicts) and not all(verdicts)


@pytest.mark.unit
def test_fast_decoder_agrees_with_pydantic_on_raw_json_oddities() -> None:
    rng = random.Random(8)
    verdicts = [check(body, duplicate_keys=index < 6) for _ in range(3) for index, body in enumerate(raw_oddities(rng))]
    assert any(verdicts) and not all(verdicts)


@pytest.mark.unit
def test_duplicate_keys_are_read_as_pydantic_reads_them(caplog: pytest.LogCaptureFixture) -> None:
    """The fast decoder refuses an object with a key twice; the route stores pydantic's reading
    (the last value) and says so in the log."""
    origin_id = str(uuid.uuid4())
    body = json.dumps(make_observation_batch(origin_id, [make_observation(str(uuid.uuid4()), origin_id)]))
    body = body.replace('"http_status": 200', '"http_status": 0, "http_status": 404').replace(
        '"rwnd_limited": false', '"rwnd_limited": 1, "rwnd_limited": true'
    )
    assert fast_verdict(body.encode()) is None
    with caplog.at_level(logging.INFO, logger=fastwire.__name__):
        batch = fastwire.decode_or_refuse_observations(body.encode())
    assert (batch.observations[0].http_status, batch.observations[0].rwnd_limited) == (404, True)
    assert f"observation batch {batch.batch_id} decoded by pydantic" in caplog.text


@pytest.mark.parametrize("timestamp", TIMESTAMP_VALUES)
@pytest.mark.unit
def test_fast_decoder_agrees_on_every_timestamp_form(timestamp: Any) -> None:
    origin_id = str(uuid.uuid4())
    observation = make_observation(str(uuid.uuid4()), origin_id, request_at=timestamp)
    check(json.dumps(make_observation_batch(origin_id, [observation])).encode())
    check(json.dumps(make_observation_batch(origin_id, []) | {"sent_at": timestamp}).encode())


@pytest.mark.parametrize(
    ("name", "values", "wire_values"),
    [
        ("send_path", SEND_PATH_VALUES, wire.SEND_PATHS),
        ("segmentation_offload", SEGMENTATION_OFFLOAD_VALUES, wire.SEGMENTATION_OFFLOADS),
        ("family", FAMILY_VALUES, wire.FAMILIES),
        ("protocol", PROTOCOL_VALUES, wire.PROTOCOLS),
    ],
)
@pytest.mark.unit
def test_fast_decoder_agrees_on_every_enumerated_value(name: str, values: list[Any], wire_values: tuple[str, ...]) -> None:
    """Each wire value of the v4, v8 and v9 enumerations is taken as itself, any other refused."""
    origin_id = str(uuid.uuid4())
    for value in [*values, *GENERIC_VALUES]:
        observation = make_observation(str(uuid.uuid4()), origin_id, **{name: value})
        accepted = check(json.dumps(make_observation_batch(origin_id, [observation])).encode())
        assert accepted == (isinstance(value, str) and value in wire_values), value


@pytest.mark.unit
def test_fast_structs_mirror_the_pydantic_models() -> None:
    """Field for field, in order, defaults included: a field added to one must be added to the other."""
    fields = fastwire.FastObservation.__struct_fields__
    assert list(fields) == list(OriginObservationIn.model_fields) == OBSERVATION_FIELDS
    defaults = fastwire.FastObservation.__struct_defaults__
    assert dict(zip(fields[len(fields) - len(defaults) :], defaults, strict=True)) == {
        name: field.default for name, field in OriginObservationIn.model_fields.items() if not field.is_required()
    }
    assert list(fastwire.FastObservationBatchEnvelope.__struct_fields__) == list(ObservationBatchIn.model_fields)


# ----------------------------------------------------------------------------- the checks after decoding
@pytest.mark.unit
def test_foreign_records_are_a_403_naming_each() -> None:
    own, other = str(uuid.uuid4()), str(uuid.uuid4())
    observations = [make_observation(str(uuid.uuid4()), origin) for origin in (own, other, own, other)]
    body = json.dumps(make_observation_batch(other, observations)).encode()
    with pytest.raises(validation.BatchRejected) as refused:
        validation.validate_observation_batch(body, uuid.UUID(own))
    assert refused.value.status_code == 403
    assert [(error.section, error.index, error.record_id, error.field) for error in refused.value.errors] == [
        ("batch", None, json.loads(body)["batch_id"], "origin_id"),
        ("observations", 1, observations[1]["trial_id"], "origin_id"),
        ("observations", 3, observations[3]["trial_id"], "origin_id"),
    ]


@pytest.mark.unit
def test_instants_out_of_range_are_a_422_naming_each() -> None:
    origin_id = str(uuid.uuid4())
    ahead = wire.utc_timestamp(dt.datetime.now(dt.UTC) + dt.timedelta(days=2))
    times = [wire.utc_timestamp(), ahead, "1999-12-31T23:59:59Z", "2026-11-22T10:00:00+05:30"]
    observations = [make_observation(str(uuid.uuid4()), origin_id, request_at=instant) for instant in times]
    body = json.dumps(make_observation_batch(origin_id, observations)).encode()
    with pytest.raises(validation.BatchRejected) as refused:
        validation.validate_observation_batch(body, uuid.UUID(origin_id))
    assert refused.value.status_code == 422
    assert [(error.index, error.record_id, error.field, error.message) for error in refused.value.errors] == [
        (1, observations[1]["trial_id"], "request_at", "timestamp is more than a day in the future"),
        (2, observations[2]["trial_id"], "request_at", "timestamp is before 2000-01-01"),
    ]
    del observations[1:3]
    accepted = validation.validate_observation_batch(
        json.dumps(make_observation_batch(origin_id, observations)).encode(), uuid.UUID(origin_id)
    )
    assert accepted.request_at[1] == dt.datetime(2026, 11, 22, 4, 30, tzinfo=dt.UTC)


@pytest.mark.unit
def test_schema_errors_are_pydantics_and_name_every_record() -> None:
    """The fast path refuses at the first error; the 422 lists all of them (pydantic's), a
    section over ``wire.MAX_BATCH_RECORDS`` is a 413."""
    origin_id = str(uuid.uuid4())
    observations = [make_observation(str(uuid.uuid4()), origin_id) for _ in range(5)]
    observations[1]["port"] = 0
    observations[2]["cwnd_mismatch"] = 1
    observations[3]["send_path"] = "splice"
    observations[4]["tcp_info"] = {"rtt": True}
    body = json.dumps(make_observation_batch(origin_id, observations)).encode()
    with pytest.raises(validation.BatchRejected) as refused:
        validation.validate_observation_batch(body, uuid.UUID(origin_id))
    assert refused.value.status_code == 422
    assert [(error.index, error.record_id, error.field) for error in refused.value.errors] == [
        (1, observations[1]["trial_id"], "port"),
        (2, observations[2]["trial_id"], "cwnd_mismatch"),
        (3, observations[3]["trial_id"], "send_path"),
        (4, observations[4]["trial_id"], "tcp_info.rtt"),
    ]
    many = [make_observation(str(uuid.uuid4()), origin_id) for _ in range(wire.MAX_BATCH_RECORDS + 1)]
    body = json.dumps(make_observation_batch(origin_id, many)).encode()
    assert fast_verdict(body) is None and pydantic_verdict(body) is None
    with pytest.raises(validation.BatchRejected) as too_many:
        validation.validate_observation_batch(body, uuid.UUID(origin_id))
    assert too_many.value.status_code == 413


# ----------------------------------------------------------------------------- stored as before
def test_every_column_is_stored_as_sent(client: httpx.Client, origin: Enrolled, db_engine: Engine) -> None:
    """An API round trip: every wire value lands in its column (offsets converted to UTC, "not
    said" as NULL or '' as before), and a body with a duplicate key is stored as pydantic read it."""
    said = make_observation(
        str(uuid.uuid4()),
        origin.id,
        request_at="2026-11-21T23:30:00.5+05:30",
        client_addr="fd00::1",
        response_latency_us=None,
        peer_rwnd=4_294_967_296,
        cwnd_mismatch=True,
        error_kind="tls",
        http_status=599,
        tcp_info={"rtt": 2**63 - 1, "min_rtt": 0, "delivery_rate": 5},
        arm="10p",
        tls_version="TLSv1.3",
        tls_handshake_us=1_200,
        tls_first_flight_bytes=16_777_216,
        tls_flight_acked_us=0,
        family="ipv6",
        send_path="mss-writes",
        segmentation_offload="off",
    )
    plain = make_observation(str(uuid.uuid4()), origin.id, tcp_info={})
    body = json.dumps(make_observation_batch(origin.id, [said, plain]) | {"wire_version": 8})
    body = body.replace('"http_status": 200', '"http_status": 1, "http_status": 204')  # plain's: the last wins
    answer = client.post(
        wire.OBSERVATIONS_BATCH_PATH, content=body, headers={**origin.headers, "Content-Type": "application/json"}
    )
    assert answer.status_code == 200 and answer.json()["accepted"] == 2, answer.text
    with db_engine.connect() as connection:
        rows = {
            str(row["trial_id"]): row
            for row in connection.execute(
                text("SELECT * FROM origin_observations WHERE origin_id = :o"), {"o": origin.id}
            ).mappings()
        }
    stored = rows[said["trial_id"]]
    for name in ("arm_iw", "port", "client_addr", "object_size", "first_byte_us", "response_latency_us"):
        assert stored[name] == said[name], name
    for name in ("snd_cwnd_at_accept", "cwnd_mismatch", "rwnd_limited", "peer_rwnd", "http_status", "error_kind"):
        assert stored[name] == said[name], name
    for name in ("arm", "tls_version", "tls_handshake_us", "tls_first_flight_bytes", "tls_flight_acked_us", "family"):
        assert stored[name] == said[name], name
    assert (stored["send_path"], stored["segmentation_offload"]) == ("mss-writes", "off")
    assert stored["request_at"] == dt.datetime(2026, 11, 21, 18, 0, 0, 500000, tzinfo=dt.UTC)
    assert (stored["tcpi_rtt_us"], stored["tcpi_min_rtt_us"], stored["tcpi_delivery_rate"], stored["tcpi_segs_out"]) == (
        2**63 - 1,
        0,
        5,
        None,
    )
    assert stored["tcp_info"] == said["tcp_info"]
    other = rows[plain["trial_id"]]
    assert other["http_status"] == 204
    assert (other["arm"], other["tls_version"], other["tls_handshake_us"], other["family"]) == (None, None, None, None)
    assert (other["send_path"], other["segmentation_offload"], other["tcp_info"], other["tcpi_rtt_us"]) == ("", "", {}, None)
