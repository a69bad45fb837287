"""Wire v2: arm labels of origins and observations; wire v1 senders still accepted."""

from __future__ import annotations

import datetime as dt
import uuid

import httpx
from sqlalchemy import Engine, text
from testkit import Enrolled, bearer, enroll_probe, make_batch, make_observation, make_observation_batch, make_trial

from iwprobe import wire


def _enroll_policy_origin(client: httpx.Client, origin_token: str) -> Enrolled:
    arms = [
        {"iw": 3, "port": 8003, "arm": "3"},
        {"iw": 10, "port": 8010, "arm": "10"},
        {"iw": 10, "port": 9010, "arm": "10p", "paced": True},
        {"iw": 10, "port": 10000, "arm": "learned"},
    ]
    response = client.post(
        wire.ORIGIN_ENROLL_PATH,
        headers=bearer(origin_token),
        json={
            "name": f"origin-{uuid.uuid4().hex[:6]}",
            "region": "eu-central",
            "host": "10.0.0.1",
            "arms": arms,
            "version": "0.2.0",
        },
    )
    assert response.status_code == 201, response.text
    body = response.json()
    return Enrolled(body["id"], body["credential"])


def test_observation_arm_labels_are_stored_and_v1_observations_still_accepted(
    client: httpx.Client, enroll_token: str, origin_token: str, db_engine: Engine
) -> None:
    probe = enroll_probe(client, enroll_token)
    origin = _enroll_policy_origin(client, origin_token)
    trials = [make_trial(probe.id, origin.id, arm_iw=10) for _ in range(3)]
    assert client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, trials), headers=probe.headers).status_code == 200
    v2 = make_observation_batch(
        origin.id,
        [
            make_observation(trials[0], origin.id, arm="10p", port=9010),
            make_observation(trials[1], origin.id, arm="learned", arm_iw=37, snd_cwnd_at_accept=37, port=10000),
        ],
    )
    v2["wire_version"] = 2
    v1 = make_observation_batch(origin.id, [make_observation(trials[2], origin.id)])  # no arm field at all
    bad = make_observation_batch(origin.id, [make_observation(trials[2], origin.id, arm="10x")])
    bad["wire_version"] = 2
    refused = client.post(wire.OBSERVATIONS_BATCH_PATH, json=bad, headers=origin.headers)
    assert refused.status_code == 422 and "arm" in refused.text
    for batch in (v2, v1):
        response = client.post(wire.OBSERVATIONS_BATCH_PATH, json=batch, headers=origin.headers)
        assert response.status_code == 200, response.text
    with db_engine.connect() as connection:
        rows = dict(
            connection.execute(
                text("SELECT trial_id::text, arm FROM origin_observations WHERE origin_id = :o"), {"o": origin.id}
            ).all()
        )
        arms = connection.execute(text("SELECT arms FROM origins WHERE id = :o"), {"o": origin.id}).scalar_one()
    assert rows == {trials[0]["trial_id"]: "10p", trials[1]["trial_id"]: "learned", trials[2]["trial_id"]: None}
    assert {arm["arm"]: arm["paced"] for arm in arms} == {"3": False, "10": False, "10p": True, "learned": False}


def test_schedule_gives_probes_plain_arms_only(
    client: httpx.Client, enroll_token: str, origin_token: str, admin_token: str
) -> None:
    """A probe picks a listener by IW: the paced and learned IW10 listeners must not reach it."""
    probe = enroll_probe(client, enroll_token, region="policy-test")
    origin = _enroll_policy_origin(client, origin_token)
    now = dt.datetime.now(dt.UTC)
    created = client.post(
        "/api/v1/campaigns",
        headers=bearer(admin_token),
        json={
            "name": "plain",
            "origin_ids": [origin.id],
            "arms": [3, 10],
            "sizes": [1000],
            "repetitions": 1,
            "interval_s": 1.0,
            "starts_at": (now - dt.timedelta(minutes=1)).isoformat(),
            "ends_at": (now + dt.timedelta(hours=1)).isoformat(),
            "probe_regions": ["policy-test"],
        },
    )
    assert created.status_code == 201, created.text
    schedule = client.get(wire.PROBE_SCHEDULE_PATH.format(probe_id=probe.id), headers=probe.headers).json()
    entry = next(c for c in schedule["campaigns"] if c["campaign_id"] == created.json()["id"])
    assert entry["targets"][0]["arms"] == [
        {"iw": 3, "port": 8003, "arm": "3", "paced": False},
        {"iw": 10, "port": 8010, "arm": "10", "paced": False},
    ]
