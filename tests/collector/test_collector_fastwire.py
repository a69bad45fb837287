"""The ingest hot path's msgspec decoder accepts and refuses exactly what the pydantic models do.

Property-style: a seeded generator builds thousands of trial batches (valid ones and ones with
one or more fields mutated to boundary values, wrong types, unknown or missing fields, odd
timestamps and strings, raw-JSON oddities such as duplicate keys and lone surrogates); for each
the verdicts of ``TrialBatchIn.model_validate_json`` and ``fastwire.decode_trial_batch`` must
agree, and when both accept, the decoded values must be equal.  Plus an API round trip of the
hand-built COPY text (escapes, NULLs, every typed column).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import typing
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.engine import Engine
from testkit import Enrolled, make_batch, make_trial, wait_folded

from iwprobe import wire
from iwscope.trials import fastwire
from iwscope.trials.schemas import CensusRecordIn, TrialBatchIn, TrialRecordIn
from iwscope.wiretypes import ErrorKind

CASES = 4000
_MISSING = object()

#: Values any field may be replaced with: wrong types, boundaries, odd strings.
GENERIC_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    1.0,
    1.5,
    -0.0,
    2**31,
    2**63 - 1,
    2**63,
    2**64,
    10**30,
    "",
    "1",
    "x" * 3000,
    [],
    {},
    [1],
    {"a": 1},
    "NaN",
    1e3,
]
INT_BOUNDARIES = [
    -1,
    0,
    1,
    99,
    100,
    255,
    256,
    599,
    600,
    999,
    1000,
    1001,
    65535,
    65536,
    1_000_000,
    1_000_001,
    1_000_000_000,
    1_000_000_001,
    86_400_000_000,
    86_400_000_001,
    17_179_869_184,
    17_179_869_185,
    1_000_000_000_000,
    1_000_000_000_001,
    2**63 - 1,
    2**63,
]
UUID_VALUES = [
    str(uuid.uuid4()),
    str(uuid.uuid4()).upper(),
    str(uuid.uuid4()) + "\n",
    "\n" + str(uuid.uuid4()),
    str(uuid.uuid4()).replace("-", ""),
    "{" + str(uuid.uuid4()) + "}",
    str(uuid.uuid4())[:-1],
    str(uuid.uuid4()) + "0",
    " " + str(uuid.uuid4()),
    "urn:uuid:" + str(uuid.uuid4()),
]
TIMESTAMP_VALUES = [
    "2026-11-22T10:00:00Z",
    "2026-11-22T10:00:00.123456Z",
    "2026-11-22T10:00:00.1Z",
    "2026-11-22T10:00:00.1234567Z",
    "2026-11-22T10:00:00+02:00",
    "2026-11-22T10:00:00-11:30",
    "2026-11-22T10:00:00",
    "2026-11-22 10:00:00Z",
    "2026-11-22t10:00:00z",
    "2026-11-22T10:00:00z",
    "2026-13-22T10:00:00Z",
    "2026-02-30T10:00:00Z",
    "2026-11-22T24:00:00Z",
    "2026-11-22T23:59:60Z",
    "2026-11-22T10:00:00Z\n",
    "2026-11-22T10:00:00+0200",
    "\u0662\u0660\u0662\u0666-11-22T10:00:00Z",
    "1999-12-31T23:59:59Z",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999Z",
    "2026-11-22T10:00:00.Z",
    "2026-11-22T10:00:00+24:00",
    "2026-11-22",
    "2026-11-22T10:00Z",
    1_700_000_000,
    "2026-W47-1T10:00:00Z",
]
STRING_VALUES = [
    "a",
    "é" * 2048,
    "é" * 2049,
    "x" * 2048,
    "x" * 2049,
    "e" * 500,
    "é" * 501,
    "tab\there",
    "line\nbreak",
    "back\\slash",
    "cr\rhere",
    "\u0000",
    "\ud83d\ude00" * 10,
    "m" * 64,
    "m" * 65,
]
ERROR_KINDS = [*wire.ERROR_KINDS, "Other", "dns ", "unknown"]
TRIAL_FIELDS = [
    "trial_id",
    "probe_id",
    "campaign_id",
    "origin_id",
    "round",
    "arm_iw",
    "object_size",
    "url",
    "started_at",
    "dns_us",
    "connect_us",
    "ttfb_us",
    "total_us",
    "bytes_received",
    "http_status",
    "error_kind",
    "error_detail",
    "syn_retrans",
    "tcp_info",
]
SAMPLE_FIELDS = ["sample_id", "probe_id", "origin_id", "measured_at", "min_rtt_us", "bottleneck_bps", "transfer_bytes", "method"]
ENVELOPE_FIELDS = ["wire_version", "batch_id", "probe_id", "sent_at", "trials", "path_samples", "census"]
#: Wire v5: a census record's fields, and a trial's ``client_iw``.
CENSUS_FIELDS = [
    "census_id",
    "probe_id",
    "campaign_id",
    "round",
    "url",
    "measured_at",
    "status",
    "iw_segments",
    "iw_bytes",
    "mss",
    "reason",
    "connections",
    "connections_ok",
    "announced_mss",
    "rtt_us",
    "family",
    "tls_version",
    "http_status",
    "error_detail",
    "protocol",
]
CLIENT_IW_FIELDS = ["status", "segments", "bytes", "mss", "reason"]
STATUS_VALUES = [*wire.IW_STATUSES, "OK", "ok ", "lower-bound", ""]
REASON_VALUES = ["", "object_ended", "bottleneck", "Object_ended", "x" * 32, "x" * 33, "two words", "a\n"]
#: Wire v9: the protocol's values and near misses.
PROTOCOL_VALUES = [*wire.PROTOCOLS, "QUIC", "h3", "quic ", "udp", "tcp\n"]
CENSUS_URL_VALUES = [
    "https://example.org/big",
    "http://[fd00::1]:8080/x",
    "ftp://example.org/x",
    "example.org",
    "https://" + "e" * 2040,
    "https://" + "e" * 2041,
    "https://ex\u0000ample.org/",
]


def field_values(name: str) -> list[Any]:
    if name.endswith("_id") and name != "campaign_id":
        return UUID_VALUES + GENERIC_VALUES
    if name in ("started_at", "measured_at", "sent_at"):
        return TIMESTAMP_VALUES + GENERIC_VALUES
    if name in ("url", "error_detail", "method"):
        return STRING_VALUES + GENERIC_VALUES
    if name == "error_kind":
        return ERROR_KINDS + GENERIC_VALUES
    if name == "wire_version":
        return [1, 2, 3, 4, 5, 6, 0, "1", 1.0, 2.0, True, None]
    if name == "status":
        return STATUS_VALUES + GENERIC_VALUES
    if name == "reason":
        return REASON_VALUES + GENERIC_VALUES
    if name == "family":
        return ["", "ipv4", "ipv6", "IPv4", "ipv5"] + GENERIC_VALUES
    if name == "protocol":
        return PROTOCOL_VALUES + GENERIC_VALUES
    if name == "tls_version":
        return ["", "TLSv1.3", "x" * 64, "x" * 65, "a\u0000b"] + GENERIC_VALUES
    return INT_BOUNDARIES + GENERIC_VALUES


def mutate_tcp_info(rng: random.Random, tcp_info: dict[str, Any]) -> Any:
    choice = rng.randrange(7)
    if choice == 0:
        return {**tcp_info, rng.choice(["bogus", "RTT", "rtt ", ""]): 1}
    if choice == 1:
        return {**tcp_info, rng.choice(wire.TCP_INFO_FIELDS): rng.choice(INT_BOUNDARIES + GENERIC_VALUES)}
    if choice == 2:
        return {name: rng.randint(0, 2**40) for name in wire.TCP_INFO_FIELDS}  # every field: allowed
    if choice == 3:
        return {}
    if choice == 4:
        return rng.choice([[], None, "x", 1, [["rtt", 1]]])
    if choice == 5:
        return dict.fromkeys(rng.sample(wire.TCP_INFO_FIELDS, 5), 2**63 - 1)
    return tcp_info


def mutate_record(
    rng: random.Random, record: dict[str, Any], fields: list[str], values: Callable[[str], list[Any]] = field_values
) -> None:
    """One to three mutations of ``record``: a field dropped, an unknown one added, or a field
    set to one of ``values(name)`` (``tcp_info``: :func:`mutate_tcp_info`)."""
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        action = rng.randrange(10)
        name = rng.choice(fields)
        if action == 0:
            record.pop(name, None)
        elif action == 1:
            record[rng.choice(["extra", "Trial_id", "tcp_info_", "_"])] = rng.choice(GENERIC_VALUES)
        elif name == "tcp_info":
            record[name] = mutate_tcp_info(rng, record.get(name, {}))
        else:
            record[name] = rng.choice(values(name))


def make_sample(rng: random.Random, probe_id: str) -> dict[str, Any]:
    return {
        "sample_id": str(uuid.uuid4()),
        "probe_id": probe_id,
        "origin_id": str(uuid.uuid4()),
        "measured_at": wire.utc_timestamp(),
        "min_rtt_us": rng.randint(0, 10**6),
        "bottleneck_bps": rng.choice([None, 1, 10**9]),
        "transfer_bytes": rng.randint(0, 10**6),
        "method": rng.choice(["packet_pair", "bulk"]),
    }


def make_client_iw(rng: random.Random) -> dict[str, Any]:
    status = rng.choice(wire.IW_STATUSES)
    return {
        "status": status,
        "segments": None if status == "undetermined" else rng.choice([1, 10, 64, 1000]),
        "bytes": rng.choice([None, 14_480]),
        "mss": rng.choice([None, 1, 1448, 65535]),
        "reason": "" if status == "ok" else rng.choice(["object_ended", "bottleneck"]),
    }


def make_census(rng: random.Random, probe_id: str) -> dict[str, Any]:
    status = rng.choice(wire.IW_STATUSES)
    return {
        "census_id": str(uuid.uuid4()),
        "probe_id": probe_id,
        "campaign_id": rng.choice([None, 1]),
        "round": rng.randrange(3),
        "url": rng.choice(["https://example.org/big", "http://192.0.2.7:8080/x"]),
        "measured_at": wire.utc_timestamp(),
        "status": status,
        "iw_segments": None if status == "undetermined" else rng.choice([4, 10, 32]),
        "iw_bytes": rng.choice([None, 46_336]),
        "mss": rng.choice([None, 1448]),
        "reason": "" if status == "ok" else "client_data",
        "connections": 3,
        "connections_ok": rng.randrange(4),
        "announced_mss": rng.choice([None, 536]),
        "rtt_us": rng.choice([None, 60_000]),
        "family": rng.choice(["ipv4", "ipv6"]),
        "tls_version": rng.choice(["", "TLSv1.3"]),
        "http_status": rng.choice([None, 206]),
        "error_detail": rng.choice([None, "x"]),
        **({"protocol": rng.choice(wire.PROTOCOLS)} if rng.random() < 0.5 else {}),  # wire v9, or left out
    }


def make_document(rng: random.Random) -> Any:
    probe_id = str(uuid.uuid4())
    trials = [
        make_trial(probe_id, rng.choice([None, str(uuid.uuid4())]), rng.choice([None, 1, 7]), arm_iw=rng.choice([1, 3, 10, 1000]))
        for _ in range(rng.randrange(4))
    ]
    for trial in trials:
        if rng.random() < 0.3:
            trial["client_iw"] = rng.choice([None, make_client_iw(rng)])
        if rng.random() < 0.3:  # wire v9
            trial["protocol"] = rng.choice(wire.PROTOCOLS)
    samples = [make_sample(rng, probe_id) for _ in range(rng.randrange(3))]
    document: dict[str, Any] = make_batch(probe_id, trials, samples)
    if rng.random() < 0.3:
        document["wire_version"] = 5
        document["census"] = [make_census(rng, probe_id) for _ in range(rng.randrange(1, 3))]
    kind = rng.randrange(12)
    if kind == 0:
        return document  # valid
    with_iw = [trial for trial in trials if isinstance(trial.get("client_iw"), dict)]
    if kind <= 5 and trials:
        mutate_record(rng, rng.choice(trials), TRIAL_FIELDS + ["client_iw", "protocol"])
    elif kind <= 7 and samples:
        mutate_record(rng, rng.choice(samples), SAMPLE_FIELDS)
    elif kind == 8:
        mutate_record(rng, document, ENVELOPE_FIELDS)
    elif kind == 9 and document.get("census"):
        mutate_record(rng, rng.choice(document["census"]), CENSUS_FIELDS)
    elif kind == 10 and with_iw:
        mutate_record(rng, rng.choice(with_iw)["client_iw"], CLIENT_IW_FIELDS)
    else:
        document[rng.choice(["trials", "path_samples", "census"])] = rng.choice([None, {}, [1], [None], "x", [[]]])
    return document


def raw_oddities(rng: random.Random) -> list[bytes]:
    """Bodies that no ``json.dumps`` of a dict produces."""
    probe_id = str(uuid.uuid4())
    good = json.dumps(make_batch(probe_id, [make_trial(probe_id)]))
    trial_id = json.loads(good)["trials"][0]["trial_id"]
    return [
        good.replace('"round": 0', '"round": 0, "round": 1').encode(),
        good.replace('"round": 0', '"round": 0, "round": -1').encode(),
        good.replace('"round": 0', '"round": -1, "round": 0').encode(),
        good.replace('"wire_version": 1', '"wire_version": 1, "wire_version": 2').encode(),
        good.replace('"rtt": 20500', '"rtt": 20500, "rtt": 1').encode(),
        good.replace('"rtt": 20500', '"rtt": 20500, "rtt": -1').encode(),
        good.replace('"round": 0', '"round": 0e0').encode(),
        good.replace('"round": 0', '"round": -0').encode(),
        good.replace('"round": 0', '"round": 00').encode(),
        good.replace('"round": 0', '"round": NaN').encode(),
        good.replace('"round": 0', '"round": Infinity').encode(),
        good.replace('"url": "', '"url": "\\ud800').encode(),
        good.replace('"url": "', '"url": "\\u00e9\\t').encode(),
        good.replace('"url": "', '"url": "\xff').encode("latin-1"),
        good.replace(trial_id, trial_id.upper()).encode(),
        good.replace(trial_id, trial_id + "\\n").encode(),
        good.replace(trial_id, trial_id[:8] + "\\u002d" + trial_id[9:]).encode(),
        (good + " ").encode(),
        ("\n" + good).encode(),
        (good + "x").encode(),
        (good + "{}").encode(),
        good[:-1].encode(),
        b"",
        b"null",
        b"[]",
        b"1",
        b'"x"',
        b"{}",
        good.encode("utf-8-sig"),
    ]


def pydantic_verdict(body: bytes) -> TrialBatchIn | None:
    try:
        return TrialBatchIn.model_validate_json(body)
    except ValidationError:
        return None


def fast_verdict(body: bytes) -> fastwire.FastTrialBatch | None:
    try:
        return fastwire.decode_trial_batch(body)
    except fastwire.FastDecodeRefused:
        return None


def service_verdict(body: bytes) -> fastwire.FastTrialBatch | None:
    """What the upload route decides (fast path, pydantic when the fast path refuses)."""
    try:
        return fastwire.decode_or_refuse(body)
    except ValidationError:
        return None


def assert_same_reading(reference: TrialBatchIn, fast: fastwire.FastTrialBatch) -> None:
    assert (fast.batch_id, fast.probe_id, fast.sent_at) == (reference.batch_id, reference.probe_id, reference.sent_at)
    assert fast.sent_at.utcoffset() == reference.sent_at.utcoffset()
    assert len(fast.trials) == len(reference.trials) and len(fast.path_samples) == len(reference.path_samples)
    for trial, started_at, expected in zip(fast.trials, fast.started_at, reference.trials, strict=True):
        for name in TRIAL_FIELDS:
            if name != "started_at":
                assert getattr(trial, name) == getattr(expected, name), name
        assert started_at == expected.started_at and started_at.utcoffset() == expected.started_at.utcoffset()
        assert trial.protocol == expected.protocol
    for sample, measured_at, expected_sample in zip(fast.path_samples, fast.measured_at, reference.path_samples, strict=True):
        for name in SAMPLE_FIELDS:
            if name != "measured_at":
                assert getattr(sample, name) == getattr(expected_sample, name), name
        assert measured_at == expected_sample.measured_at
    for trial, expected in zip(fast.trials, reference.trials, strict=True):
        if expected.client_iw is None:
            assert trial.client_iw is None
        else:
            assert trial.client_iw is not None
            for name in CLIENT_IW_FIELDS:
                assert getattr(trial.client_iw, name) == getattr(expected.client_iw, name), name
    assert len(fast.census) == len(reference.census)
    for record, measured_at, expected_record in zip(fast.census, fast.census_measured_at, reference.census, strict=True):
        for name in CENSUS_FIELDS:
            if name != "measured_at":
                assert getattr(record, name) == getattr(expected_record, name), name
        assert measured_at == expected_record.measured_at


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
def test_fast_decoder_agrees_with_pydantic_on_generated_batches() -> None:
    rng = random.Random(20261122)
    verdicts = [check(json.dumps(make_document(rng)).encode()) for _ in range(CASES)]
    # The corpus must exercise both sides substantially, or the comparison shows little.
    assert CASES * 0.15 < sum(verdicts) < CASES * 0.85, sum(verdicts)


@pytest.mark.unit
def test_fast_decoder_agrees_with_pydantic_on_raw_json_oddities() -> None:
    rng = random.Random(7)
    verdicts = [check(body, duplicate_keys=index < 6) for _ in range(3) for index, body in enumerate(raw_oddities(rng))]
    assert any(verdicts) and not all(verdicts)


@pytest.mark.unit
def test_a_nul_escape_text_is_left_to_pydantic_and_read_as_it_reads_it() -> None:
    """The fast decoder checks "no NUL in any string" as "no ``\\u0000`` in the body": a real NUL
    is refused by both, the same six characters after an escaped backslash (no NUL) only by the
    fast decoder, and the route then stores pydantic's reading."""
    probe_id = str(uuid.uuid4())
    with_nul = make_trial(probe_id)
    with_nul["url"] = "http://origin/a\x00b"
    assert pydantic_verdict(json.dumps(make_batch(probe_id, [with_nul])).encode()) is None
    assert check(json.dumps(make_batch(probe_id, [with_nul])).encode()) is False
    text_only = make_trial(probe_id)
    text_only["url"] = "http://origin/a\\u0000b"  # a backslash, then the text u0000
    body = json.dumps(make_batch(probe_id, [text_only])).encode()
    assert b"\\\\u0000" in body and fast_verdict(body) is None
    stored = service_verdict(body)
    assert stored is not None and stored.trials[0].url == "http://origin/a\\u0000b"


@pytest.mark.parametrize("timestamp", TIMESTAMP_VALUES)
@pytest.mark.unit
def test_fast_decoder_agrees_on_every_timestamp_form(timestamp: Any) -> None:
    probe_id = str(uuid.uuid4())
    check(json.dumps(make_batch(probe_id, [make_trial(probe_id, started_at=timestamp)])).encode())
    check(
        json.dumps(
            make_batch(probe_id, [], [make_sample(random.Random(1), probe_id) | {"measured_at": timestamp}])
            | {"sent_at": timestamp}
        ).encode()
    )


@pytest.mark.unit
def test_fast_trial_and_census_structs_mirror_the_pydantic_models() -> None:
    """Field for field, in order, defaults included (wire v9 added ``protocol`` to both)."""
    for fast, model in ((fastwire.FastTrial, TrialRecordIn), (fastwire.FastCensus, CensusRecordIn)):
        fields = fast.__struct_fields__
        assert list(fields) == list(model.model_fields), fast
        defaults = dict(zip(fields[len(fields) - len(fast.__struct_defaults__) :], fast.__struct_defaults__, strict=True))
        assert defaults == {name: field.default for name, field in model.model_fields.items() if not field.is_required()}
    assert CENSUS_FIELDS == list(CensusRecordIn.model_fields)


@pytest.mark.parametrize("value", [*PROTOCOL_VALUES, *GENERIC_VALUES])
@pytest.mark.unit
def test_fast_decoder_agrees_on_every_protocol(value: Any) -> None:
    """Each wire value of ``protocol`` is taken as itself, on a trial and on a census record, any other refused."""
    probe_id = str(uuid.uuid4())
    trial = make_batch(probe_id, [make_trial(probe_id, protocol=value)])
    census = make_batch(probe_id, []) | {"census": [make_census(random.Random(3), probe_id) | {"protocol": value}]}
    for document in (trial, census):
        assert check(json.dumps(document).encode()) == (isinstance(value, str) and value in wire.PROTOCOLS), value


def test_error_kind_is_the_probe_wire_formats_tuple() -> None:
    """``ErrorKind`` is spelled out once on the collector side (a type checker cannot read a tuple
    as a ``Literal``): it must stay ``iwprobe.wire.ERROR_KINDS``, which the JSON Schema lists too."""
    assert typing.get_args(ErrorKind) == wire.ERROR_KINDS
    assert fastwire.ErrorKind is ErrorKind  # the fast decoder checks the very same kinds
    schema = wire.load_schema()
    for record in ("TrialRecord", "OriginObservation"):
        assert schema["$defs"][record]["properties"]["error_kind"]["enum"] == [*wire.ERROR_KINDS, None]


def test_refused_batches_still_name_every_bad_record(client: httpx.Client, probe: Enrolled) -> None:
    """The fast path refuses at the first error; the 422 body still lists all of them (pydantic's)."""
    trials = [make_trial(probe.id) for _ in range(5)]
    trials[1]["arm_iw"] = 0
    trials[3]["started_at"] = "2026-11-22 10:00:00"
    trials[4]["tcp_info"] = {"rtt": -1}
    response = client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, trials), headers=probe.headers)
    assert response.status_code == 422, response.text
    named = {(error["index"], error["field"], error["record_id"]) for error in response.json()["detail"]["errors"]}
    assert named == {
        (1, "arm_iw", trials[1]["trial_id"]),
        (3, "started_at", trials[3]["trial_id"]),
        (4, "tcp_info.rtt", trials[4]["trial_id"]),
    }


def test_stored_rows_keep_escapes_nulls_big_ints_and_offsets(client: httpx.Client, probe: Enrolled, db_engine: Engine) -> None:
    odd = make_trial(
        probe.id,
        url="http://h/a\tb\nc\\d\re\u00e9\U0001f600\\N",
        error_kind="other",
        error_detail="\\N",
        started_at="2026-11-21T23:30:00.5+05:30",
        http_status=None,
        dns_us=None,
        connect_us=None,
        ttfb_us=None,
        total_us=None,
        tcp_info={"rtt": 2**63 - 1, "min_rtt": 0, "delivery_rate": 5},
    )
    empty = make_trial(probe.id, url="\\", error_detail="", tcp_info={})
    response = client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, [odd, empty]), headers=probe.headers)
    assert response.status_code == 200 and response.json()["accepted"] == 2, response.text
    with db_engine.connect() as connection:
        rows = {
            str(row["trial_id"]): row
            for row in connection.execute(text("SELECT * FROM trials WHERE probe_id = :p"), {"p": probe.id}).mappings()
        }
    stored = rows[odd["trial_id"]]
    assert stored["url"] == odd["url"] and stored["error_detail"] == "\\N" and stored["error_kind"] == "other"
    assert stored["started_at"] == dt.datetime(2026, 11, 21, 18, 0, 0, 500000, tzinfo=dt.UTC)
    assert (stored["http_status"], stored["dns_us"], stored["total_us"]) == (None, None, None)
    assert (stored["tcpi_rtt_us"], stored["tcpi_min_rtt_us"], stored["tcpi_segs_in"]) == (2**63 - 1, 0, None)
    assert stored["tcp_info"] == odd["tcp_info"]
    other = rows[empty["trial_id"]]
    assert (other["url"], other["error_detail"], other["tcp_info"], other["tcpi_rtt_us"]) == ("\\", "", {}, None)


def test_trials_stored_task_joins_and_recomputes_idempotently(
    celery_worker, client: httpx.Client, probe: Enrolled, origin: Enrolled, db_engine: Engine
) -> None:
    """``trials_stored`` (queued per upload by earlier versions) joins and has the estimates
    refreshed; running it again changes nothing."""
    trial = make_trial(probe.id, origin.id)
    trial["tcp_info"]["min_rtt"] = 12_345
    assert client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, [trial]), headers=probe.headers).status_code == 200
    pairs = [[probe.id, origin.id]]
    first = celery_worker.send("iwscope.trials.tasks.trials_stored", [trial["trial_id"]], pairs)
    second = celery_worker.send("iwscope.trials.tasks.trials_stored", [trial["trial_id"]], pairs)
    assert first == second == {"joined": 0}  # no observation to join

    def estimate() -> Any:
        with db_engine.connect() as connection:
            return connection.execute(
                text("SELECT min_rtt_us, sample_count FROM path_estimates WHERE probe_id = :p AND origin_id = :o"),
                {"p": probe.id, "o": origin.id},
            ).first()

    wait_folded(db_engine, probe.id)  # the refreshes both calls queued have run
    assert tuple(estimate()) == (12_345, 1)  # the trial counted once
