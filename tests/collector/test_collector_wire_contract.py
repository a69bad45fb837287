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
from iwscope.probes.schemas import ArmPortModel, EnrollRequestIn, HeartbeatIn, ScheduleOut
from iwscope.trials.schemas import (
    CensusRecordIn,
    ClientIwIn,
    ObservationBatchIn,
    OriginObservationIn,
    PathSampleIn,
    TrialBatchIn,
    TrialRecordIn,
)

SCHEMA = wire.load_schema()
MODELS: dict[str, type[BaseModel]] = {
    "TrialRecord": TrialRecordIn, "PathSample": PathSampleIn, "TrialBatch": TrialBatchIn,
    "OriginObservation": OriginObservationIn, "ObservationBatch": ObservationBatchIn,
    "EnrollRequest": EnrollRequestIn, "OriginEnrollRequest": OriginEnrollRequestIn, "Heartbeat": HeartbeatIn,
    "ArmPort": ArmPortModel, "ClientIw": ClientIwIn, "CensusRecord": CensusRecordIn,
}
PROBE = "0b0e4a36-8d0e-4c3d-9a55-3a1c3b7f0c11"
ORIGIN = "5f1d2c3b-4a59-4e6f-8071-92a3b4c5d6e7"


def validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({**SCHEMA, "$ref": f"#/$defs/{name}"},
                                           format_checker=jsonschema.FormatChecker())


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


def _mutations() -> list[tuple[str, Any]]:
    """(description, function of a good TrialBatch returning a changed copy)."""

    def trial(change):
        def apply(document: dict[str, Any]) -> dict[str, Any]:
            change(document["trials"][0])
            return document
        return apply

    def field(name: str, value: Any):
        return trial(lambda record: record.__setitem__(name, value))

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
        ("sample bandwidth 0", lambda document: (document["path_samples"][0].__setitem__("bottleneck_bps", 0),
                                                 document)[1]),
        ("too many trials", lambda document: {**document, "trials": document["trials"] * 5001}),
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


@pytest.mark.parametrize(("name", "value", "accepted"), [
    ("response_latency_us", None, True), ("cwnd_mismatch", 1, False), ("peer_rwnd", 4_294_967_297, False),
    ("client_addr", "", False), ("port", 0, False), ("http_status", None, False), ("tcp_info", {}, True),
])
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
    batch = wire.TrialBatch(wire_version=wire.WIRE_VERSION, batch_id=wire.new_id(), probe_id=PROBE,
                            sent_at=wire.utc_timestamp(), trials=[record])
    body = wire.dumps(batch)
    validator("TrialBatch").validate(json.loads(body))
    assert TrialBatchIn.model_validate_json(body).trials[0].trial_id == record.trial_id
