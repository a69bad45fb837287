"""Upload edge cases not covered by tests/collector: replays with changed values of observations
and path samples, extreme timestamps, negative values in every duration field, invalid path
samples next to valid trials, foreign and oversized observation batches."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from testkit import Enrolled, enroll_origin, make_batch, make_observation, make_observation_batch, make_path_sample, make_trial

from iwprobe import wire


def _rows(engine: Engine, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(text(sql), params).all()]


def test_replayed_observations_and_path_samples_with_changed_values_are_ignored(
    client: httpx.Client, probe: Enrolled, origin: Enrolled, db_engine: Engine
) -> None:
    trial_id = wire.new_id()
    observation = make_observation(trial_id, origin.id)
    first = client.post(
        wire.OBSERVATIONS_BATCH_PATH, json=make_observation_batch(origin.id, [observation]), headers=origin.headers
    )
    assert first.status_code == 200 and first.json()["accepted"] == 1
    stored = _rows(
        db_engine,
        "SELECT response_latency_us, first_byte_us, http_status, received_at FROM origin_observations WHERE trial_id = :t",
        t=trial_id,
    )
    changed = {**observation, "response_latency_us": 1, "first_byte_us": 1, "http_status": 404}
    replay = client.post(wire.OBSERVATIONS_BATCH_PATH, json=make_observation_batch(origin.id, [changed]), headers=origin.headers)
    assert replay.status_code == 200 and replay.json()["duplicates"] == 1 and replay.json()["accepted"] == 0
    assert (
        _rows(
            db_engine,
            "SELECT response_latency_us, first_byte_us, http_status, received_at FROM origin_observations WHERE trial_id = :t",
            t=trial_id,
        )
        == stored
    )

    sample = make_path_sample(probe.id, origin.id)
    assert client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, [], [sample]), headers=probe.headers).status_code == 200
    stored_sample = _rows(
        db_engine, "SELECT min_rtt_us, bottleneck_bps FROM path_samples WHERE sample_id = :s", s=sample["sample_id"]
    )
    assert stored_sample == [(19_500, 10_000_000)]
    changed_sample = {**sample, "min_rtt_us": 1, "bottleneck_bps": 1}
    assert (
        client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, [], [changed_sample]), headers=probe.headers).status_code
        == 200
    )
    assert (
        _rows(db_engine, "SELECT min_rtt_us, bottleneck_bps FROM path_samples WHERE sample_id = :s", s=sample["sample_id"])
        == stored_sample
    )


@pytest.mark.parametrize(
    "started_at",
    [
        "9999-12-31T23:59:59Z",
        "0001-01-01T00:00:00Z",
        "1970-01-01T00:00:00Z",
        "2026-13-45T00:00:00Z",
        "yesterday",
        "",
        1700000000,
        "2026-01-01T00:00:00+99:00",
    ],
)
def test_extreme_or_malformed_timestamps_get_422_and_store_nothing(
    started_at: object, client: httpx.Client, probe: Enrolled, db_engine: Engine
) -> None:
    good, bad = make_trial(probe.id), make_trial(probe.id, started_at=started_at)
    response = client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, [good, bad]), headers=probe.headers)
    assert response.status_code == 422, response.text
    errors = response.json()["detail"]["errors"]
    assert [(e["index"], e["field"]) for e in errors] == [(1, "started_at")]
    assert _rows(
        db_engine, "SELECT count(*) FROM trial_ids WHERE trial_id IN (:a, :b)", a=good["trial_id"], b=bad["trial_id"]
    ) == [(0,)]


TRIAL_DURATIONS = ["dns_us", "connect_us", "ttfb_us", "total_us", "bytes_received", "object_size", "syn_retrans"]
OBSERVATION_DURATIONS = ["first_byte_us", "response_latency_us", "object_size", "snd_cwnd_at_accept"]
SAMPLE_VALUES = ["min_rtt_us", "bottleneck_bps", "transfer_bytes"]


def test_negative_values_in_every_duration_field_get_422(
    client: httpx.Client, probe: Enrolled, origin: Enrolled, db_engine: Engine
) -> None:
    trials = [make_trial(probe.id)] + [make_trial(probe.id, **{name: -1}) for name in TRIAL_DURATIONS]
    samples = [make_path_sample(probe.id, origin.id, **{name: -1}) for name in SAMPLE_VALUES]
    response = client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, trials, samples), headers=probe.headers)
    assert response.status_code == 422, response.text
    named = sorted((e["section"], e["index"], e["field"]) for e in response.json()["detail"]["errors"])
    assert named == sorted(
        [("trials", index + 1, name) for index, name in enumerate(TRIAL_DURATIONS)]
        + [("path_samples", index, name) for index, name in enumerate(SAMPLE_VALUES)]
    )
    ids = [trial["trial_id"] for trial in trials]
    assert _rows(db_engine, "SELECT count(*) FROM trial_ids WHERE trial_id = ANY(CAST(:ids AS uuid[]))", ids=ids) == [(0,)]
    observations = [make_observation(wire.new_id(), origin.id, **{name: -1}) for name in OBSERVATION_DURATIONS]
    refused = client.post(
        wire.OBSERVATIONS_BATCH_PATH, json=make_observation_batch(origin.id, observations), headers=origin.headers
    )
    assert refused.status_code == 422, refused.text
    assert sorted((e["index"], e["field"]) for e in refused.json()["detail"]["errors"]) == sorted(
        enumerate(OBSERVATION_DURATIONS)
    )
    assert _rows(db_engine, "SELECT count(*) FROM origin_observations WHERE origin_id = :o", o=origin.id) == [(0,)]


def test_nul_characters_and_huge_ids_get_422_naming_the_field(
    client: httpx.Client, probe: Enrolled, origin: Enrolled, enroll_token: str, db_engine: Engine
) -> None:
    """PostgreSQL text cannot hold U+0000 and bigint stops at 2**63-1: both are client errors."""
    trials = [
        make_trial(probe.id),
        make_trial(probe.id, url="http://o/obj/1\x00"),
        make_trial(probe.id, error_kind="other", error_detail="boom\x00"),
        make_trial(probe.id, campaign_id=2**63),
    ]
    samples = [make_path_sample(probe.id, origin.id, method="rtt\x00")]
    response = client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, trials, samples), headers=probe.headers)
    assert response.status_code == 422, response.text
    assert sorted((e["section"], e["index"], e["field"]) for e in response.json()["detail"]["errors"]) == [
        ("path_samples", 0, "method"),
        ("trials", 1, "url"),
        ("trials", 2, "error_detail"),
        ("trials", 3, "campaign_id"),
    ]
    assert _rows(db_engine, "SELECT count(*) FROM trials WHERE probe_id = :p", p=probe.id) == [(0,)]
    refused = client.post(
        wire.PROBE_ENROLL_PATH,
        headers={"Authorization": f"Bearer {enroll_token}"},
        json={"name": "nul\x00probe", "region": "sec-test", "labels": {"k\x00": "v"}, "version": "0.1.0"},
    )
    assert refused.status_code == 422, refused.text
    assert {tuple(error["loc"][-2:]) for error in refused.json()["detail"]} >= {("body", "name")}


def test_valid_trials_next_to_an_invalid_path_sample_store_nothing(
    client: httpx.Client, probe: Enrolled, origin: Enrolled, db_engine: Engine
) -> None:
    trials = [make_trial(probe.id) for _ in range(5)]
    samples = [make_path_sample(probe.id, origin.id), make_path_sample(probe.id, origin.id, method="guess" * 100)]
    response = client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, trials, samples), headers=probe.headers)
    assert response.status_code == 422
    assert [(e["section"], e["index"]) for e in response.json()["detail"]["errors"]] == [("path_samples", 1)]
    assert _rows(db_engine, "SELECT count(*) FROM trials WHERE probe_id = :p", p=probe.id) == [(0,)]
    assert _rows(db_engine, "SELECT count(*) FROM path_samples WHERE probe_id = :p", p=probe.id) == [(0,)]
    # A path sample naming another probe: 403, nothing stored.
    foreign = client.post(
        wire.TRIALS_BATCH_PATH,
        headers=probe.headers,
        json=make_batch(probe.id, trials, [make_path_sample(str(uuid.uuid4()), origin.id)]),
    )
    assert foreign.status_code == 403
    assert _rows(db_engine, "SELECT count(*) FROM trials WHERE probe_id = :p", p=probe.id) == [(0,)]


def test_foreign_and_oversized_observation_batches(
    client: httpx.Client, origin: Enrolled, origin_token: str, db_engine: Engine
) -> None:
    other = enroll_origin(client, origin_token)
    mine = make_observation(wire.new_id(), origin.id)
    # An origin's valid records with one record of another origin: 403, none stored.
    response = client.post(
        wire.OBSERVATIONS_BATCH_PATH,
        headers=origin.headers,
        json=make_observation_batch(origin.id, [mine, make_observation(wire.new_id(), other.id)]),
    )
    assert response.status_code == 403
    assert [(e["index"]) for e in response.json()["detail"]["errors"]] == [1]
    assert _rows(db_engine, "SELECT count(*) FROM origin_observations WHERE trial_id = :t", t=mine["trial_id"]) == [(0,)]
    many = [make_observation(wire.new_id(), origin.id) for _ in range(wire.MAX_BATCH_RECORDS + 1)]
    too_many = client.post(wire.OBSERVATIONS_BATCH_PATH, headers=origin.headers, json=make_observation_batch(origin.id, many))
    assert too_many.status_code == 413
    padding = b'{"pad":"' + b"x" * (wire.MAX_BODY_BYTES + 1) + b'"}'
    too_big = client.post(
        wire.OBSERVATIONS_BATCH_PATH, content=padding, headers={**origin.headers, "Content-Type": "application/json"}
    )
    assert too_big.status_code == 413
    assert _rows(db_engine, "SELECT count(*) FROM origin_observations WHERE origin_id = :o", o=origin.id) == [(0,)]
