"""Wire v3: trial roles, arm labels, page loads and interactive flows; cost campaigns in the schedule;
roll-ups made of plain short flows only (real PostgreSQL, the API in process)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import httpx
from sqlalchemy import Engine, text
from test_collector_arm_policies import _enroll_policy_origin
from testkit import Enrolled, bearer, enroll_probe, make_batch, make_trial

from iwprobe import wire


def _v3(probe: Enrolled, trials: list[dict[str, Any]]) -> dict[str, Any]:
    return {**make_batch(probe.id, trials), "wire_version": 3}


def _echo(rtts: list[int | None]) -> dict[str, Any]:
    return {
        "packet_bytes": 160,
        "interval_us": 20_000,
        "sent": len(rtts),
        "received": sum(rtt is not None for rtt in rtts),
        "rtt_us": rtts,
    }


def test_v3_roles_arms_pages_and_echoes_are_stored(
    client: httpx.Client, enroll_token: str, origin_token: str, db_engine: Engine
) -> None:
    probe = enroll_probe(client, enroll_token)
    origin = _enroll_policy_origin(client, origin_token)
    page = wire.new_id()
    trials = [
        make_trial(probe.id, origin.id, arm_iw=10, arm="10p", role="short"),
        make_trial(probe.id, origin.id, arm_iw=10, arm="10", role="short"),
        make_trial(probe.id, origin.id, arm_iw=10, arm="learned", role="page-load", page_id=page),
        make_trial(
            probe.id, origin.id, arm_iw=1, role="interactive", url="udp://10.0.0.1:8000", echo=_echo([100_000, None, 130_000])
        ),
        make_trial(probe.id, origin.id, arm_iw=3, url="http://10.0.0.1:8003/obj/1#iwscope-flow=background"),
    ]
    trials[4]["url"] = "http://10.0.0.1:8003/obj/1" + wire.FLOW_FRAGMENT_BACKGROUND  # a wire v2 background flow
    response = client.post(wire.TRIALS_BATCH_PATH, json=_v3(probe, trials), headers=probe.headers)
    assert response.status_code == 200 and response.json()["accepted"] == 5, response.text
    with db_engine.connect() as connection:
        rows = {
            row.trial_id: row
            for row in connection.execute(
                text("SELECT trial_id::text, arm, role, page_id::text, echo FROM trials WHERE probe_id = :p"), {"p": probe.id}
            )
        }
    stored = [(rows[t["trial_id"]].arm, rows[t["trial_id"]].role) for t in trials]
    assert stored == [("10p", "short"), (None, "short"), ("learned", "page-load"), (None, "interactive"), (None, "background")]
    assert rows[trials[2]["trial_id"]].page_id == page
    assert rows[trials[3]["trial_id"]].echo["rtt_us"] == [100_000, None, 130_000]


def test_inconsistent_v3_fields_refuse_the_batch(client: httpx.Client, enroll_token: str, db_engine: Engine) -> None:
    probe = enroll_probe(client, enroll_token)
    good = make_trial(probe.id, arm_iw=10, arm="10p")
    bad = [
        make_trial(probe.id, arm_iw=1, role="interactive"),  # no echo
        make_trial(probe.id, arm_iw=10, arm="32p"),  # label names IW 32
        make_trial(probe.id, arm_iw=10, page_id=wire.new_id()),  # page_id on a short flow
        make_trial(probe.id, arm_iw=1, role="interactive", echo={**_echo([1, 2]), "received": 1}),
    ]  # received is not the count
    response = client.post(wire.TRIALS_BATCH_PATH, json=_v3(probe, [good, *bad]), headers=probe.headers)
    assert response.status_code == 422, response.text
    errors = sorted((error["index"], error["field"]) for error in response.json()["detail"]["errors"])
    assert errors == [(1, "echo"), (2, "arm"), (3, "page_id"), (4, "echo.received")]
    unknown_role = client.post(
        wire.TRIALS_BATCH_PATH, json=_v3(probe, [make_trial(probe.id, role="bulk")]), headers=probe.headers
    )
    assert unknown_role.status_code == 422 and "role" in unknown_role.text
    with db_engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM trials WHERE probe_id = :p"), {"p": probe.id}).scalar_one() == 0


def _create(client: httpx.Client, admin_token: str, origin: Enrolled, region: str, **fields: Any) -> httpx.Response:
    now = dt.datetime.now(dt.UTC)
    return client.post(
        "/api/v1/campaigns",
        headers=bearer(admin_token),
        json={
            "name": f"cost-{uuid.uuid4().hex[:4]}",
            "origin_ids": [origin.id],
            "sizes": [15000, 50000],
            "starts_at": (now - dt.timedelta(minutes=1)).isoformat(),
            "ends_at": (now + dt.timedelta(hours=1)).isoformat(),
            "probe_regions": [region],
            **fields,
        },
    )


def test_cost_campaigns_reach_v3_probes_only(
    client: httpx.Client, enroll_token: str, origin_token: str, admin_token: str
) -> None:
    region = f"cost-{uuid.uuid4().hex[:6]}"
    probe = enroll_probe(client, enroll_token, region=region)
    origin = _enroll_policy_origin(client, origin_token)
    created = _create(
        client,
        admin_token,
        origin,
        region,
        arms=["10", "10p"],
        arm_shares=[0.75, 0.25],
        interactive_interval_us=20_000,
        page_connections=6,
        arrival_rate_per_s=5.0,
    )
    assert created.status_code == 201, created.text
    assert created.json()["arms"] == [10, 10] and created.json()["arm_labels"] == ["10", "10p"]
    path = wire.PROBE_SCHEDULE_PATH.format(probe_id=probe.id)
    old = client.get(path, headers=probe.headers).json()
    assert created.json()["id"] not in [c["campaign_id"] for c in old["campaigns"]]
    new = client.get(path + "?wire_version=3", headers=probe.headers).json()
    entry = next(c for c in new["campaigns"] if c["campaign_id"] == created.json()["id"])
    assert entry["arm_labels"] == ["10", "10p"] and entry["arm_shares"] == [0.75, 0.25]
    assert entry["interactive_interval_us"] == 20_000 and entry["page_connections"] == 6
    assert [(arm["arm"], arm["port"], arm["paced"]) for arm in entry["targets"][0]["arms"]] == [
        ("10", 8010, False),
        ("10p", 9010, True),
    ]
    assert client.get(path + f"?wire_version={wire.WIRE_VERSION + 1}", headers=probe.headers).status_code == 422
    for fields, word in (
        ({"arms": ["10", "10"]}, "repeat"),
        ({"arms": [10, 32], "arm_shares": [0.5, 0.6]}, "sum"),
        ({"arms": [10, 32], "arm_shares": [1.0]}, "one share"),
        ({"arms": ["10x"]}, "arms"),
        ({"arms": ["10p"], "background_bytes": 100_000}, "background_iw"),
        ({"arms": [10], "interactive_interval_us": 10}, "interactive_interval_us"),
    ):
        refused = _create(client, admin_token, origin, region, **fields)
        assert refused.status_code == 422 and word in refused.text, (fields, refused.text)


def test_rollups_hold_plain_short_flows_only(
    client: httpx.Client, enroll_token: str, origin_token: str, admin_token: str, db_engine: Engine
) -> None:
    from sqlalchemy.orm import Session

    from iwscope.analysis import refresh_rollups

    region = f"roll-{uuid.uuid4().hex[:6]}"
    probe = enroll_probe(client, enroll_token, region=region)
    origin = _enroll_policy_origin(client, origin_token)
    campaign = _create(client, admin_token, origin, region, arms=[10]).json()["id"]
    trials = [
        make_trial(probe.id, origin.id, campaign, arm_iw=10),
        make_trial(probe.id, origin.id, campaign, arm_iw=10, arm="10p"),
        make_trial(probe.id, origin.id, campaign, arm_iw=10, arm="learned"),
        make_trial(probe.id, origin.id, campaign, arm_iw=10, role="page-load", page_id=wire.new_id()),
        make_trial(probe.id, origin.id, campaign, arm_iw=10, role="background"),
    ]
    assert client.post(wire.TRIALS_BATCH_PATH, json=_v3(probe, trials), headers=probe.headers).status_code == 200
    with Session(db_engine) as session:
        refresh_rollups(session, margin=dt.timedelta(0))
        session.commit()
        n = session.execute(
            text("SELECT COALESCE(sum(n_trials), 0) FROM analysis_rollups WHERE campaign_id = :c AND grain = 0"), {"c": campaign}
        ).scalar_one()
    assert n == 1
