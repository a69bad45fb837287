"""Wire v4: HTTPS handshake numbers and the IP version, stored per trial and observation and joined."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import Engine, text
from testkit import enroll_origin, enroll_probe, make_batch, make_observation, make_observation_batch, make_trial, wait_for

from iwprobe import wire


def test_tls_and_family_are_stored_joined_and_validated(client: httpx.Client, enroll_token: str, origin_token: str,
                                                       db_engine: Engine, celery_worker: Any) -> None:
    """The worker's join copies the server's handshake numbers onto the trial."""
    probe = enroll_probe(client, enroll_token)
    origin = enroll_origin(client, origin_token)
    https = make_trial(probe.id, origin.id, arm_iw=10, tls_version="TLSv1.3", tls_handshake_us=201_500,
                       family="ipv6")
    plain = make_trial(probe.id, origin.id, arm_iw=3)  # a v3-style record: no TLS, no family
    batch = make_batch(probe.id, [https, plain])
    batch["wire_version"] = wire.WIRE_VERSION
    assert wire.WIRE_VERSION == 4
    # a bad family or a negative handshake time refuses the whole batch
    for field, value in (("family", "ipv5"), ("tls_handshake_us", -1), ("tls_version", "x" * 65)):
        bad = make_batch(probe.id, [make_trial(probe.id, origin.id, **{field: value})])
        refused = client.post(wire.TRIALS_BATCH_PATH, json=bad, headers=probe.headers)
        assert refused.status_code == 422 and field in refused.text, (field, refused.text)
    assert client.post(wire.TRIALS_BATCH_PATH, json=batch, headers=probe.headers).status_code == 200
    observations = make_observation_batch(origin.id, [
        make_observation(https, origin.id, tls_version="TLSv1.3", tls_handshake_us=200_900,
                         tls_first_flight_bytes=16_840, tls_flight_acked_us=200_400, family="ipv6"),
        make_observation(plain, origin.id)])
    observations["wire_version"] = wire.WIRE_VERSION
    bad_observation = make_observation_batch(origin.id, [make_observation(plain, origin.id,
                                                                          tls_first_flight_bytes=-5)])
    refused = client.post(wire.OBSERVATIONS_BATCH_PATH, json=bad_observation, headers=origin.headers)
    assert refused.status_code == 422 and "tls_first_flight_bytes" in refused.text
    assert client.post(wire.OBSERVATIONS_BATCH_PATH, json=observations, headers=origin.headers).status_code == 200

    def joined() -> dict[str, tuple[object, ...]]:
        with db_engine.connect() as connection:
            rows = connection.execute(text(
                "SELECT trial_id::text, tls_version, tls_handshake_us, family, server_tls_handshake_us, "
                "server_tls_first_flight_bytes, server_tls_flight_acked_us FROM trials "
                "WHERE probe_id = :p AND joined_at IS NOT NULL"), {"p": probe.id}).all()
        return {row[0]: tuple(row[1:]) for row in rows}

    rows = wait_for(lambda: (lambda found: found if len(found) == 2 else None)(joined()), what="both trials joined")
    assert rows[https["trial_id"]] == ("TLSv1.3", 201_500, "ipv6", 200_900, 16_840, 200_400)
    assert rows[plain["trial_id"]] == (None, None, None, None, None, None)
    with db_engine.connect() as connection:
        stored = connection.execute(text("SELECT family, tls_version FROM origin_observations WHERE trial_id = :t"),
                                    {"t": https["trial_id"]}).one()
    assert tuple(stored) == ("ipv6", "TLSv1.3")
