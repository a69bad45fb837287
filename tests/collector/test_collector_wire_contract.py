"""The collector's pydantic ``*In`` models agree with ``wire.schema.json`` and ``iwprobe.wire``."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel, ValidationError
from testkit import make_batch, make_observation, make_observation_batch, make_path_sample, make_trial

from iwprobe import wire
from iwscope.origins.schemas import OriginEnrollRequestIn
from iwscope.passive.schemas import (
    PassiveAggregateIn,
    PassiveArmIn,
    PassiveBatchIn,
    PassiveConnectionIn,
    ServerHeartbeatIn,
)
from iwscope.probes.schemas import ArmPortModel, CampaignScheduleOut, EnrollRequestIn, HeartbeatIn, ScheduleOut
from iwscope.servers.schemas import PassiveStudyOut, ServerConfigOut, ServerEnrollRequestIn
from iwscope.traces.schemas import TraceBatchIn, TraceRecordIn
from iwscope.trials import fastwire, protocols
from iwscope.trials.schemas import (
    CensusRecordIn,
    ClientIwIn,
    ObservationBatchIn,
    OriginObservationIn,
    PathSampleIn,
    TrialBatchIn,
    TrialRecordIn,
)

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services

SCHEMA = wire.load_schema()
MODELS: dict[str, type[BaseModel]] = {
    "TrialRecord": TrialRecordIn,
    "PathSample": PathSampleIn,
    "TrialBatch": TrialBatchIn,
    "OriginObservation": OriginObservationIn,
    "ObservationBatch": ObservationBatchIn,
    "EnrollRequest": EnrollRequestIn,
    "OriginEnrollRequest": OriginEnrollRequestIn,
    "Heartbeat": HeartbeatIn,
    "ArmPort": ArmPortModel,
    "ClientIw": ClientIwIn,
    "CensusRecord": CensusRecordIn,
    # wire v6: passive measurement (iwprobe tap)
    "PassiveArm": PassiveArmIn,
    "PassiveStudy": PassiveStudyOut,
    "ServerConfig": ServerConfigOut,
    "ServerEnrollRequest": ServerEnrollRequestIn,
    "PassiveAggregate": PassiveAggregateIn,
    "PassiveConnection": PassiveConnectionIn,
    "ServerHeartbeat": ServerHeartbeatIn,
    "PassiveBatch": PassiveBatchIn,
    # wire v7: trial traces, and the schedule entry that asks for them (trace_share)
    "CampaignSchedule": CampaignScheduleOut,
    "TraceRecord": TraceRecordIn,
    "TraceBatch": TraceBatchIn,
}
PROBE = "0b0e4a36-8d0e-4c3d-9a55-3a1c3b7f0c11"
ORIGIN = "5f1d2c3b-4a59-4e6f-8071-92a3b4c5d6e7"


def validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({**SCHEMA, "$ref": f"#/$defs/{name}"}, format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fields_and_required_match_schema_and_dataclass(name: str) -> None:
    definition = SCHEMA["$defs"][name]
    model = MODELS[name]
    assert set(model.model_fields) == set(definition["properties"])
    required = {field for field, info in model.model_fields.items() if info.is_required()}
    assert required == set(definition["required"])
    assert {field.name for field in dataclasses.fields(getattr(wire, name))} == set(definition["properties"])


def test_schedule_answer_validates_against_schema() -> None:
    schedule = ScheduleOut(probe_id=PROBE, generated_at=wire.utc_timestamp(), poll_after_s=60, campaigns=[])
    validator("Schedule").validate(json.loads(schedule.model_dump_json()))
    assert set(ScheduleOut.model_fields) == set(SCHEMA["$defs"]["Schedule"]["properties"])


def _trial_batch() -> dict[str, Any]:
    return make_batch(PROBE, [make_trial(PROBE, ORIGIN, 1)], [make_path_sample(PROBE, ORIGIN)])


def _census_record(**fields: Any) -> dict[str, Any]:
    """A valid census record (``iwprobe census`` of one target), ``fields`` set on it."""
    record: dict[str, Any] = {
        "census_id": wire.new_id(),
        "probe_id": PROBE,
        "campaign_id": 1,
        "round": 0,
        "url": "https://example.org/big",
        "measured_at": "2026-11-28T10:00:00Z",
        "status": "ok",
        "iw_segments": 32,
        "iw_bytes": 38_400,
        "mss": 1200,
        "reason": "",
        "connections": 3,
        "connections_ok": 3,
        "announced_mss": None,
        "rtt_us": 100_000,
        "family": "ipv4",
        "tls_version": "TLSv1.3",
        "http_status": 200,
    }
    return {**record, **fields}


def _mutations() -> list[tuple[str, Any]]:
    """(description, function of a good TrialBatch returning a changed copy)."""

    def trial(change):
        def apply(document: dict[str, Any]) -> dict[str, Any]:
            change(document["trials"][0])
            return document

        return apply

    def field(name: str, value: Any):
        return trial(lambda record: record.__setitem__(name, value))

    def census(**fields: Any):
        """The batch with one census record (wire v5), ``fields`` set on it."""

        def apply(document: dict[str, Any]) -> dict[str, Any]:
            return {**document, "census": [_census_record(**fields)]}

        return apply

    return [
        ("unchanged", lambda document: document),
        ("negative duration", field("total_us", -1)),
        ("duration too large", field("total_us", 86_400_000_001)),
        ("string for an integer", field("round", "1")),
        ("boolean for an integer", field("syn_retrans", True)),
        ("float for an integer", field("arm_iw", 10.5)),
        ("uppercase uuid", field("trial_id", make_trial(PROBE)["trial_id"].upper())),
        ("not a uuid", field("trial_id", "abc")),
        ("timestamp without offset", field("started_at", "2026-11-22T10:00:00")),
        ("date only", field("started_at", "2026-11-22")),
        ("month 13", field("started_at", "2026-13-22T10:00:00Z")),
        ("seven fraction digits", field("started_at", "2026-11-22T10:00:00.1234567Z")),
        ("timestamp with offset", field("started_at", "2026-11-22T10:00:00.5+02:00")),
        ("unknown error kind", field("error_kind", "boom")),
        ("null error kind", field("error_kind", None)),
        ("error detail too long", field("error_detail", "x" * 501)),
        ("arm iw zero", field("arm_iw", 0)),
        ("http status 99", field("http_status", 99)),
        ("null campaign", field("campaign_id", None)),
        ("campaign 0", field("campaign_id", 0)),
        ("unknown tcp_info key", field("tcp_info", {"nope": 1})),
        ("negative tcp_info", field("tcp_info", {"rtt": -1})),
        ("u64 tcp_info", field("tcp_info", {"bytes_acked": 2**64 - 1})),
        ("int64 max tcp_info", field("tcp_info", {"bytes_acked": 2**63 - 1})),
        ("int64 max + 1 tcp_info", field("tcp_info", {"bytes_acked": 2**63})),
        ("extra field", field("extra", 1)),
        ("missing field", trial(lambda record: record.pop("url"))),
        ("empty url", field("url", "")),
        ("NUL in url", field("url", "http://a/obj/1\x00")),
        ("NUL in error detail", field("error_detail", "\x00")),
        ("control characters but no NUL", field("error_detail", "a\tb\x01")),
        ("campaign bigint max", field("campaign_id", 2**63 - 1)),
        ("campaign beyond bigint", field("campaign_id", 2**63)),
        ("unknown wire version", lambda document: {**document, "wire_version": wire.WIRE_VERSION + 1}),
        ("missing path_samples", lambda document: {k: v for k, v in document.items() if k != "path_samples"}),
        ("sample bandwidth 0", lambda document: (document["path_samples"][0].__setitem__("bottleneck_bps", 0), document)[1]),
        ("too many trials", lambda document: {**document, "trials": document["trials"] * 5001}),
        # wire v9: a trial's protocol, each of the wire's values and nothing else
        *((f"protocol {value!r}", field("protocol", value)) for value in wire.PROTOCOLS),
        ("protocol h3", field("protocol", "h3")),
        ("protocol QUIC", field("protocol", "QUIC")),
        ("protocol null", field("protocol", None)),
        ("quic arm label", field("arm", "10q")),
        ("paced quic arm label", field("arm", "10pq")),
        ("quic before paced", field("arm", "10qp")),
        ("learned over quic", field("arm", "learnedq")),
        # wire v9: a census record's protocol
        *((f"census protocol {value!r}", census(protocol=value)) for value in wire.PROTOCOLS),
        ("census protocol h3", census(protocol="h3")),
        ("census protocol null", census(protocol=None)),
        ("census without protocol", census()),
    ]


@pytest.mark.parametrize(("description", "mutate"), _mutations(), ids=[m[0] for m in _mutations()])
def test_pydantic_and_json_schema_accept_the_same_trial_batches(description: str, mutate: Any) -> None:
    document = mutate(copy.deepcopy(_trial_batch()))
    schema_accepts = validator("TrialBatch").is_valid(document)
    try:
        TrialBatchIn.model_validate_json(json.dumps(document))
        model_accepts = True
    except ValidationError:
        model_accepts = False
    assert model_accepts == schema_accepts, description


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [
        ("response_latency_us", None, True),
        ("cwnd_mismatch", 1, False),
        ("peer_rwnd", 4_294_967_297, False),
        ("client_addr", "", False),
        ("port", 0, False),
        ("http_status", None, False),
        ("tcp_info", {}, True),
        # wire v8: how the origin sent the response, each of the wire's values and nothing else
        *(("send_path", path, True) for path in wire.SEND_PATHS),
        ("send_path", "splice", False),
        ("send_path", None, False),
        *(("segmentation_offload", offload, True) for offload in wire.SEGMENTATION_OFFLOADS),
        ("segmentation_offload", "lro", False),
        ("segmentation_offload", "TSO", False),
        # wire v9: the protocol, and a QUIC observation's first flight within the wire's ranges
        *(("protocol", protocol, True) for protocol in wire.PROTOCOLS),
        ("protocol", "h3", False),
        ("protocol", None, False),
        ("arm", "10q", True),
        ("arm", "32pq", True),
        ("arm", "10qp", False),
        ("quic_first_flight_packets", 100_000, True),
        ("quic_first_flight_packets", 100_001, False),
        ("quic_first_flight_packets", -1, False),
        ("quic_first_flight_bytes", 16_777_216, True),
        ("quic_first_flight_bytes", 16_777_217, False),
        ("quic_max_datagram_size", wire.QUIC_MIN_DATAGRAM_BYTES, True),
        ("quic_max_datagram_size", wire.QUIC_MIN_DATAGRAM_BYTES - 1, False),
        ("quic_max_datagram_size", 65_527, True),
        ("quic_max_datagram_size", 65_528, False),
        ("quic_lost_packets", 2**63 - 1, True),
        ("quic_lost_packets", 2**63, False),
        ("quic_lost_packets", None, True),
        ("quic_zero_rtt", True, True),
        ("quic_zero_rtt", None, True),
        ("quic_zero_rtt", 1, False),
        ("quic_zero_rtt", "true", False),
    ],
)
def test_observations_agree(name: str, value: Any, accepted: bool) -> None:
    trial = make_trial(PROBE, ORIGIN)
    document = make_observation_batch(ORIGIN, [make_observation(trial, ORIGIN, **{name: value})])
    assert validator("ObservationBatch").is_valid(document) == accepted
    try:
        ObservationBatchIn.model_validate_json(json.dumps(document))
        model_accepts = True
    except ValidationError:
        model_accepts = False
    assert model_accepts == accepted


def test_probe_written_dataclasses_validate() -> None:
    """What ``iwprobe.wire.dumps`` produces is accepted by both."""
    record = wire.TrialRecord(**make_trial(PROBE, ORIGIN, 3))
    batch = wire.TrialBatch(
        wire_version=wire.WIRE_VERSION, batch_id=wire.new_id(), probe_id=PROBE, sent_at=wire.utc_timestamp(), trials=[record]
    )
    body = wire.dumps(batch)
    validator("TrialBatch").validate(json.loads(body))
    assert TrialBatchIn.model_validate_json(body).trials[0].trial_id == record.trial_id


def test_probe_written_quic_records_validate() -> None:
    """A QUIC trial and its observation as ``iwprobe.wire`` writes them (wire v9: a ``10q`` arm,
    no TCP connection) are accepted by both, and the collector's own fast decoder reads them
    with no error of its cross-field checks (``iwscope.trials.protocols``)."""
    fields = make_trial(PROBE, ORIGIN, 1, arm_iw=10)
    fields.update(arm="10q", protocol="quic", connect_us=None, tcp_info={}, tls_version="TLSv1.3", tls_handshake_us=150_000)
    trial = wire.TrialRecord(**fields)
    batch = wire.TrialBatch(
        wire_version=wire.WIRE_VERSION, batch_id=wire.new_id(), probe_id=PROBE, sent_at=wire.utc_timestamp(), trials=[trial]
    )
    body = wire.dumps(batch)
    validator("TrialBatch").validate(json.loads(body))
    assert TrialBatchIn.model_validate_json(body).trials[0].protocol == "quic"
    assert protocols.trial_errors(fastwire.decode_trial_batch(body).trials) == []
    observed = make_observation(fields, ORIGIN, arm="10q", protocol="quic", tcp_info={}, peer_rwnd=None)
    observed.update(quic_first_flight_packets=10, quic_first_flight_bytes=12_000, quic_max_datagram_size=1200)
    observed.update(quic_lost_packets=0, quic_zero_rtt=False)
    observations = wire.ObservationBatch(
        wire_version=wire.WIRE_VERSION,
        batch_id=wire.new_id(),
        origin_id=ORIGIN,
        sent_at=wire.utc_timestamp(),
        observations=[wire.OriginObservation(**observed)],
    )
    body = wire.dumps(observations)
    validator("ObservationBatch").validate(json.loads(body))
    assert ObservationBatchIn.model_validate_json(body).observations[0].quic_max_datagram_size == 1200
    assert protocols.observation_errors(fastwire.decode_observation_batch(body).observations) == []


# ----------------------------------------------------------------------------- wire v6: passive
def _passive_batch() -> dict[str, Any]:
    aggregate = {
        "aggregate_id": wire.new_id(),
        "server_id": ORIGIN,
        "campaign_id": 1,
        "phase": 0,
        "hour": "2026-11-26T14:00:00Z",
        "arm": "16",
        "arm_iw": 16,
        "treated_share_bp": 1000,
        "family": "ipv4",
        "port_kind": "user",
        "region": "DE",
        "cluster": 3,
        "rtt_bucket": 2,
        "bandwidth_bucket": 5,
        "bdp_bucket": 2,
        "size_octave": 14,
        "biased": False,
        "connections": 4,
        "responses": 3,
        "latency_sum_us": 250_000,
        "latency_hist": [[450, 2], [460, 1]],
        "tls": 2,
    }
    connection = {
        "record_id": wire.new_id(),
        "server_id": ORIGIN,
        "campaign_id": 1,
        "phase": 0,
        "closed_at": "2026-11-26T14:10:00.5Z",
        "arm": "default",
        "arm_iw": None,
        "treated_share_bp": 1000,
        "family": "ipv6",
        "port_kind": "user",
        "port": 443,
        "region": "",
        "country": "DE",
        "client_prefix": "0123456789abcdef",
        "cluster": 31,
        "tcp_info": {"min_rtt": 40_000, "snd_cwnd": 10},
        "captured": True,
        "tls": True,
        "response_latency_us": 90_000,
        "exchanges": 1,
    }
    heartbeat = {
        "version": "0.6.0",
        "uptime_s": 10,
        "arms_state": "error: nft failed",
        "connections_seen": 5,
        "connections_captured": 1,
        "notifications_lost": 0,
        "packets_dropped": 0,
        "capture_share": 1,
        "spool_backlog": 0,
        "spool_bytes": 0,
    }
    return {
        "wire_version": 6,
        "batch_id": wire.new_id(),
        "server_id": ORIGIN,
        "sent_at": "2026-11-26T14:10:01Z",
        "aggregates": [aggregate],
        "connections": [connection],
        "heartbeat": heartbeat,
    }


def _passive_mutations() -> list[tuple[str, Any]]:
    """(description, function of a good PassiveBatch returning a changed copy)."""

    def record(section: str, name: str, value: Any):
        def apply(document: dict[str, Any]) -> dict[str, Any]:
            document[section][0][name] = value
            return document

        return apply

    def drop(section: str, name: str):
        def apply(document: dict[str, Any]) -> dict[str, Any]:
            del document[section][0][name]
            return document

        return apply

    aggregate, connection = "aggregates", "connections"
    return [
        ("unchanged", lambda document: document),
        ("wire version 5", lambda document: {**document, "wire_version": 5}),
        ("no heartbeat", lambda document: {**document, "heartbeat": None}),
        (
            "only the envelope",
            lambda document: {k: v for k, v in document.items() if k not in ("aggregates", "connections", "heartbeat")},
        ),
        ("arm 999", record(aggregate, "arm", "999")),
        ("arm 1000", record(aggregate, "arm", "1000")),
        ("arm label", record(aggregate, "arm", "10p")),
        ("arm_iw 0", record(aggregate, "arm_iw", 0)),
        ("arm_iw 65535", record(aggregate, "arm_iw", 65535)),
        ("arm_iw missing", drop(aggregate, "arm_iw")),
        ("share 10001", record(aggregate, "treated_share_bp", 10_001)),
        ("family empty", record(aggregate, "family", "")),
        ("port kind probe", record(aggregate, "port_kind", "probe")),
        ("cluster 32", record(aggregate, "cluster", 32)),
        ("rtt bucket 8", record(aggregate, "rtt_bucket", 8)),
        ("rtt bucket -1", record(aggregate, "rtt_bucket", -1)),
        ("bandwidth bucket 10", record(aggregate, "bandwidth_bucket", 10)),
        ("bdp bucket 6", record(aggregate, "bdp_bucket", 6)),
        ("size octave 41", record(aggregate, "size_octave", 41)),
        ("connections 0", record(aggregate, "connections", 0)),
        ("region 65 chars", record(aggregate, "region", "x" * 65)),
        ("region NUL", record(aggregate, "region", "\x00")),
        ("hist bin 1000", record(aggregate, "latency_hist", [[1000, 1]])),
        ("hist count 0", record(aggregate, "latency_hist", [[1, 0]])),
        ("hist triple", record(aggregate, "latency_hist", [[1, 1, 1]])),
        ("hist single", record(aggregate, "latency_hist", [[1]])),
        ("hour without offset", record(aggregate, "hour", "2026-11-26T14:00:00")),
        ("float count", record(aggregate, "tls", 1.5)),
        ("string count", record(aggregate, "tls", "1")),
        ("extra aggregate field", record(aggregate, "extra", 1)),
        ("client prefix 15 hex", record(connection, "client_prefix", "0123456789abcde")),
        ("client prefix upper", record(connection, "client_prefix", "0123456789ABCDEF")),
        ("client prefix address", record(connection, "client_prefix", "192.0.2.1")),
        ("country lower", record(connection, "country", "de")),
        ("country empty", record(connection, "country", "")),
        ("port 0", record(connection, "port", 0)),
        ("tcp_info unknown", record(connection, "tcp_info", {"nope": 1})),
        ("captured missing", drop(connection, "captured")),
        ("tls null", record(connection, "tls", None)),
        ("latency beyond a day", record(connection, "response_latency_us", 86_400_000_001)),
        ("rwnd 2^31", record(connection, "client_rwnd_bytes", 2**31)),
        ("rwnd 2^31 + 1", record(connection, "client_rwnd_bytes", 2**31 + 1)),
        ("segments 100001", record(connection, "first_flight_segments", 100_001)),
        ("exchanges null", record(connection, "exchanges", None)),
        ("arms_state garbage", lambda d: (d["heartbeat"].__setitem__("arms_state", "maybe"), d)[1]),
        ("capture share 1.5", lambda d: (d["heartbeat"].__setitem__("capture_share", 1.5), d)[1]),
        ("too many connections", lambda d: {**d, "connections": d["connections"] * 5001}),
    ]


@pytest.mark.parametrize(("description", "mutate"), _passive_mutations(), ids=[m[0] for m in _passive_mutations()])
def test_pydantic_and_json_schema_accept_the_same_passive_batches(description: str, mutate: Any) -> None:
    document = mutate(copy.deepcopy(_passive_batch()))
    schema_accepts = validator("PassiveBatch").is_valid(document)
    try:
        PassiveBatchIn.model_validate_json(json.dumps(document))
        model_accepts = True
    except ValidationError:
        model_accepts = False
    assert model_accepts == schema_accepts, description


def test_server_config_answers_validate_against_schema() -> None:
    study = PassiveStudyOut(
        campaign_id=1,
        name="real users",
        arms=[PassiveArmIn(arm="default", share_bp=10_000)],
        ports=[443],
        prefix_v4=24,
        prefix_v6=48,
        assignment_seed=2**32 - 1,
        starts_at=wire.utc_timestamp(),
        ends_at=wire.utc_timestamp(),
        sample_share=0.01,
    )
    for answer in (None, study):
        config = ServerConfigOut(
            wire_version=wire.WIRE_VERSION, server_id=PROBE, generated_at=wire.utc_timestamp(), poll_after_s=60, study=answer
        )
        validator("ServerConfig").validate(json.loads(config.model_dump_json()))
    enroll = wire.ServerEnrollRequest(name="web-1", region="fra1", ports=[80, 443], version="0.6.0", kernel="6.1.0")
    body = wire.dumps(enroll)
    validator("ServerEnrollRequest").validate(json.loads(body))
    assert ServerEnrollRequestIn.model_validate_json(body).ports == [80, 443]


# ----------------------------------------------------------------------------- wire v7: traces
def _trace_batch() -> dict[str, Any]:
    trace = {
        "version": wire.TRACE_VERSION,
        "packets": 2,
        "client_mss": 1460,
        "server_mss": None,
        "dropped": 0,
        "first_flight": None,
        **{name: [0, 1] for name in wire.TRACE_COLUMNS},
    }
    record = {"trial_id": wire.new_id(), "side": "receiver", "captured_at": "2026-11-27T01:00:00.25Z", "trace": trace}
    envelope = {"wire_version": 7, "batch_id": wire.new_id(), "agent_id": PROBE, "sent_at": "2026-11-27T01:00:01Z"}
    return {**envelope, "traces": [record]}


def _trace_mutations() -> list[tuple[str, Any]]:
    """(description, function of a good TraceBatch returning a changed copy): the envelope and
    the record, which the schema and the pydantic models state alike (the trace's inside is
    ``wire.check_trace``'s, run by the collector after parsing: tests/traces)."""

    def record(name: str, value: Any):
        return lambda document: (document["traces"][0].__setitem__(name, value), document)[1]

    return [
        ("unchanged", lambda document: document),
        ("no traces", lambda document: {**document, "traces": []}),
        ("wire version 6", lambda document: {**document, "wire_version": 6}),
        ("wire version 8", lambda document: {**document, "wire_version": 8}),
        ("agent not a uuid", lambda document: {**document, "agent_id": "probe-1"}),
        ("traces missing", lambda document: {k: v for k, v in document.items() if k != "traces"}),
        ("extra envelope field", lambda document: {**document, "heartbeat": None}),
        ("side sender", record("side", "sender")),
        ("side both", record("side", "both")),
        ("captured_at without offset", record("captured_at", "2026-11-27T01:00:00")),
        ("trace not an object", record("trace", [1, 2])),
        ("extra record field", record("probe_id", PROBE)),
        ("too many traces", lambda document: {**document, "traces": document["traces"] * (wire.MAX_TRACES_PER_BATCH + 1)}),
    ]


@pytest.mark.parametrize(("description", "mutate"), _trace_mutations(), ids=[m[0] for m in _trace_mutations()])
def test_pydantic_and_json_schema_accept_the_same_trace_batches(description: str, mutate: Any) -> None:
    document = mutate(copy.deepcopy(_trace_batch()))
    schema_accepts = validator("TraceBatch").is_valid(document)
    try:
        TraceBatchIn.model_validate_json(json.dumps(document))
        model_accepts = True
    except ValidationError:
        model_accepts = False
    assert model_accepts == schema_accepts, description


def test_probe_written_trace_batches_and_schedules_validate() -> None:
    """What ``iwprobe.wire.dumps`` makes of a ``TraceBatch`` is accepted by both, and a schedule
    entry carries ``trace_share`` as the schema says."""
    document = _trace_batch()
    record = wire.TraceRecord(**document["traces"][0])
    batch = wire.TraceBatch(
        wire_version=wire.WIRE_VERSION, batch_id=wire.new_id(), agent_id=ORIGIN, sent_at=wire.utc_timestamp(), traces=[record]
    )
    body = wire.dumps(batch)
    validator("TraceBatch").validate(json.loads(body))
    parsed = TraceBatchIn.model_validate_json(body)
    assert parsed.traces[0].trace == record.trace and wire.check_trace(parsed.traces[0].trace) == 2
    entry = CampaignScheduleOut(
        campaign_id=1,
        name="traced",
        arms=[3, 10],
        sizes=[100_000],
        size_dist=None,
        sizes_per_round=1,
        repetitions=1,
        interval_s=0,
        starts_at=wire.utc_timestamp(),
        ends_at=None,
        calibrate=False,
        targets=[],
        trace_share=0.25,
    )
    schedule = ScheduleOut(probe_id=PROBE, generated_at=wire.utc_timestamp(), poll_after_s=60, campaigns=[entry])
    validator("Schedule").validate(json.loads(schedule.model_dump_json()))
    assert not validator("CampaignSchedule").is_valid({**json.loads(entry.model_dump_json()), "trace_share": 1.5})


@pytest.mark.parametrize("name", ["TrialBatch", "ObservationBatch", "PassiveBatch", "TraceBatch"])
def test_every_upload_takes_what_the_agents_send_now(name: str) -> None:
    """Agents stamp every envelope with ``wire.WIRE_VERSION``: a batch whose schema or model
    stopped at an older version refuses every upload once the version moves on (the passive
    batch did, at v7, until this test)."""
    from pydantic import TypeAdapter

    assert wire.WIRE_VERSION in SCHEMA["$defs"][name]["properties"]["wire_version"]["enum"]
    field = MODELS[name].model_fields["wire_version"]
    assert TypeAdapter(field.annotation).validate_python(wire.WIRE_VERSION) == wire.WIRE_VERSION
