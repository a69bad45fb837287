"""Wire v4: HTTPS handshake numbers and the IP version, stored per trial and observation and joined."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import httpx
from sqlalchemy import Engine, text
from testkit import (
    bearer,
    enroll_origin,
    enroll_probe,
    make_batch,
    make_observation,
    make_observation_batch,
    make_trial,
    wait_for,
)

from iwprobe import wire


def test_tls_and_family_are_stored_joined_and_validated(
    client: httpx.Client, enroll_token: str, origin_token: str, db_engine: Engine, celery_worker: Any
) -> None:
    """The worker's join copies the server's handshake numbers onto the trial."""
    probe = enroll_probe(client, enroll_token)
    origin = enroll_origin(client, origin_token)
    https = make_trial(probe.id, origin.id, arm_iw=10, tls_version="TLSv1.3", tls_handshake_us=201_500, family="ipv6")
    plain = make_trial(probe.id, origin.id, arm_iw=3)  # a v3-style record: no TLS, no family
    batch = make_batch(probe.id, [https, plain])
    batch["wire_version"] = wire.WIRE_VERSION
    assert wire.WIRE_VERSION >= 4
    # a bad family or a negative handshake time refuses the whole batch
    for field, value in (("family", "ipv5"), ("tls_handshake_us", -1), ("tls_version", "x" * 65)):
        bad = make_batch(probe.id, [make_trial(probe.id, origin.id, **{field: value})])
        refused = client.post(wire.TRIALS_BATCH_PATH, json=bad, headers=probe.headers)
        assert refused.status_code == 422 and field in refused.text, (field, refused.text)
    assert client.post(wire.TRIALS_BATCH_PATH, json=batch, headers=probe.headers).status_code == 200
    observations = make_observation_batch(
        origin.id,
        [
            make_observation(
                https,
                origin.id,
                tls_version="TLSv1.3",
                tls_handshake_us=200_900,
                tls_first_flight_bytes=16_840,
                tls_flight_acked_us=200_400,
                family="ipv6",
            ),
            make_observation(plain, origin.id),
        ],
    )
    observations["wire_version"] = wire.WIRE_VERSION
    bad_observation = make_observation_batch(origin.id, [make_observation(plain, origin.id, tls_first_flight_bytes=-5)])
    refused = client.post(wire.OBSERVATIONS_BATCH_PATH, json=bad_observation, headers=origin.headers)
    assert refused.status_code == 422 and "tls_first_flight_bytes" in refused.text
    assert client.post(wire.OBSERVATIONS_BATCH_PATH, json=observations, headers=origin.headers).status_code == 200

    def joined() -> dict[str, tuple[object, ...]]:
        with db_engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT trial_id::text, tls_version, tls_handshake_us, family, server_tls_handshake_us, "
                    "server_tls_first_flight_bytes, server_tls_flight_acked_us FROM trials "
                    "WHERE probe_id = :p AND joined_at IS NOT NULL"
                ),
                {"p": probe.id},
            ).all()
        return {row[0]: tuple(row[1:]) for row in rows}

    rows = wait_for(lambda: (lambda found: found if len(found) == 2 else None)(joined()), what="both trials joined")
    assert rows[https["trial_id"]] == ("TLSv1.3", 201_500, "ipv6", 200_900, 16_840, 200_400)
    assert rows[plain["trial_id"]] == (None, None, None, None, None, None)
    with db_engine.connect() as connection:
        stored = connection.execute(
            text("SELECT family, tls_version FROM origin_observations WHERE trial_id = :t"), {"t": https["trial_id"]}
        ).one()
    assert tuple(stored) == ("ipv6", "TLSv1.3")


def test_https_origins_and_chosen_families_reach_wire_v4_probes_only(
    client: httpx.Client, enroll_token: str, origin_token: str, admin_token: str
) -> None:
    region = f"tls-{uuid.uuid4().hex[:6]}"
    probe = enroll_probe(client, enroll_token, region=region)
    enrolled = client.post(
        wire.ORIGIN_ENROLL_PATH,
        headers=bearer(origin_token),
        json={
            "name": "https-origin",
            "region": "eu",
            "host": "10.0.0.7",
            "host6": "fd99::7",
            "tls": True,
            "arms": [{"iw": 3, "port": 8003, "arm": "3"}, {"iw": 10, "port": 8010, "arm": "10"}],
            "version": "0.3",
        },
    )
    assert enrolled.status_code == 201, enrolled.text
    https_origin = enrolled.json()["id"]
    plain_origin = enroll_origin(client, origin_token).id
    listed = client.get("/api/v1/origins", headers=bearer(admin_token)).json()
    assert {(item["tls"], item["host6"]) for item in listed if item["id"] == https_origin} == {(True, "fd99::7")}
    now = dt.datetime.now(dt.UTC)

    def create(family: str | None, origins: list[str]) -> int:
        body: dict[str, Any] = {
            "name": f"family-{family}",
            "origin_ids": origins,
            "arms": [3, 10],
            "sizes": [9000],
            "repetitions": 1,
            "interval_s": 1.0,
            "starts_at": (now - dt.timedelta(minutes=1)).isoformat(),
            "ends_at": (now + dt.timedelta(hours=1)).isoformat(),
            "probe_regions": [region],
        }
        if family is not None:
            body["family"] = family
        created = client.post("/api/v1/campaigns", headers=bearer(admin_token), json=body)
        assert created.status_code == 201, created.text
        assert created.json()["family"] == family
        return int(created.json()["id"])

    over_ipv6 = create("ipv6", [https_origin])
    mixed = create(None, [https_origin, plain_origin])
    refused = client.post(
        "/api/v1/campaigns",
        headers=bearer(admin_token),
        json={
            "name": "bad",
            "origin_ids": [plain_origin],
            "arms": [3],
            "sizes": [1],
            "repetitions": 1,
            "interval_s": 1,
            "starts_at": now.isoformat(),
            "family": "ipv5",
        },
    )
    assert refused.status_code == 422 and "family" in refused.text

    def schedule(version: int) -> dict[int, dict[str, Any]]:
        answer = client.get(
            wire.PROBE_SCHEDULE_PATH.format(probe_id=probe.id) + f"?wire_version={version}", headers=probe.headers
        )
        assert answer.status_code == 200, answer.text
        return {entry["campaign_id"]: entry for entry in answer.json()["campaigns"]}

    current = schedule(4)
    assert current[over_ipv6]["family"] == "ipv6"
    assert [(t["tls"], t["host6"]) for t in current[over_ipv6]["targets"]] == [(True, "fd99::7")]
    assert {t["origin_id"] for t in current[mixed]["targets"]} == {https_origin, plain_origin}
    for version in (3, 2):  # cannot speak HTTPS nor choose the family: neither is given to them
        earlier = schedule(version)
        assert over_ipv6 not in earlier
        assert [t["origin_id"] for t in earlier[mixed]["targets"]] == [plain_origin]
