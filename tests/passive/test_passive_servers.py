"""Servers (``iwprobe tap``, wire v6): enrollment, identical 401s, revocation, the configuration a
server polls (no study, the running study, ETag/304, another server's id), the fleet listing,
and passive campaigns kept out of the probes' schedules."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import uuid

import httpx
from passive_kit import enroll_server, make_heartbeat, make_passive_batch, running_campaign
from sqlalchemy import text
from sqlalchemy.engine import Engine
from testkit import Enrolled, bearer, enroll_probe, wait_for

from iwprobe import wire

IWSCOPE = [sys.executable, "-m", "iwscope.cli"]
INVALID = {"detail": "invalid credentials"}


def config(client: httpx.Client, server: Enrolled, server_id: str | None = None, etag: str | None = None) -> httpx.Response:
    headers = {**server.headers, **({"If-None-Match": etag} if etag else {})}
    return client.get(wire.SERVER_CONFIG_PATH.format(server_id=server_id or server.id), headers=headers)


def test_enrollment_stores_the_server_and_only_a_hash(client: httpx.Client, server_token: str, db_engine: Engine) -> None:
    server = enroll_server(client, server_token, ports=[8080, 8443], region="us-east-dc7")
    secret = server.credential.split(wire.CREDENTIAL_SEPARATOR, 1)[1]
    with db_engine.connect() as connection:
        row = connection.execute(
            text("SELECT region, ports, version, kernel, secret_hash, revoked_at FROM servers WHERE id = :i"), {"i": server.id}
        ).one()
    assert (row.region, row.ports, row.version, row.kernel) == ("us-east-dc7", [8080, 8443], "0.6.0", "6.1.0-13-amd64")
    assert row.secret_hash != secret and secret not in row.secret_hash and row.revoked_at is None
    # The credential works at once: no study yet.
    answer = config(client, server)
    assert answer.status_code == 200, answer.text
    assert answer.json()["study"] is None and answer.json()["server_id"] == server.id


def test_enrollment_needs_a_server_token(
    client: httpx.Client, server_token: str, enroll_token: str, origin_token: str, admin_token: str, read_token: str
) -> None:
    body = {"name": "web", "region": "dc", "ports": [443]}
    for token in (enroll_token, origin_token, admin_token, read_token, server_token + "x", "garbage"):
        refused = client.post(wire.SERVER_ENROLL_PATH, headers=bearer(token), json=body)
        assert (refused.status_code, refused.json()) == (401, INVALID), token
    assert client.post(wire.SERVER_ENROLL_PATH, json=body).status_code == 401
    # The schema's constraints hold: a port out of range, an unknown field, too many ports.
    for bad in (
        {**body, "ports": [0]},
        {**body, "extra": 1},
        {**body, "ports": list(range(1, 18))},
        {"name": "", "region": "dc"},
    ):
        assert client.post(wire.SERVER_ENROLL_PATH, headers=bearer(server_token), json=bad).status_code == 422, bad


def test_wrong_secret_unknown_server_and_revoked_get_the_same_401(
    client: httpx.Client, server: Enrolled, service_env: dict[str, str]
) -> None:
    wrong = client.get(wire.SERVER_CONFIG_PATH.format(server_id=server.id), headers=bearer(f"{server.id}.nope"))
    unknown_id = str(uuid.uuid4())
    unknown = client.get(wire.SERVER_CONFIG_PATH.format(server_id=unknown_id), headers=bearer(f"{unknown_id}.nope"))
    assert (wrong.status_code, wrong.json()) == (unknown.status_code, unknown.json()) == (401, INVALID)
    assert config(client, server).status_code == 200
    revoked = subprocess.run(
        [*IWSCOPE, "servers", "revoke", server.id], env=service_env, capture_output=True, text=True, timeout=60
    )
    assert revoked.returncode == 0, revoked.stderr
    # Migration 0013's trigger notifies the API, which empties its credential cache (at the
    # latest the cache's 5 s expiry refuses it).
    after = wait_for(
        lambda: (lambda answer: answer if answer.status_code != 200 else None)(config(client, server)),
        timeout=15,
        what="the revoked server refused",
    )
    assert (after.status_code, after.json()) == (401, INVALID)
    batch = client.post(wire.PASSIVE_BATCH_PATH, json=make_passive_batch(server.id), headers=server.headers)
    assert (batch.status_code, batch.json()) == (401, INVALID)
    again = subprocess.run(
        [*IWSCOPE, "servers", "revoke", server.id], env=service_env, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 1 and "no unrevoked server" in again.stderr


def test_config_without_a_study_and_with_the_running_one(
    client: httpx.Client, server: Enrolled, admin_token: str, server_token: str
) -> None:
    empty = config(client, server)
    assert empty.status_code == 200 and empty.json()["study"] is None
    assert empty.json()["wire_version"] == wire.WIRE_VERSION and empty.json()["poll_after_s"] > 0
    # A campaign that starts later, one that ended, and one of another server are not in force.
    now = dt.datetime.now(dt.UTC)
    other = enroll_server(client, server_token)
    running_campaign(client, admin_token, [other.id])
    running_campaign(
        client,
        admin_token,
        [server.id],
        starts_at=(now + dt.timedelta(hours=2)).isoformat(),
        ends_at=(now + dt.timedelta(hours=3)).isoformat(),
    )
    running_campaign(
        client,
        admin_token,
        [server.id],
        starts_at=(now - dt.timedelta(hours=3)).isoformat(),
        ends_at=(now - dt.timedelta(hours=2)).isoformat(),
    )
    assert config(client, server).json()["study"] is None
    campaign = running_campaign(
        client, admin_token, [server.id], assignment_seed=0xC0FFEE, sample_share=0.05, prefix_v4=22, flush_interval_s=30
    )
    study = config(client, server).json()["study"]
    assert study == {
        "campaign_id": campaign["id"],
        "name": campaign["name"],
        "arms": [{"arm": "default", "share_bp": 9000}, {"arm": "16", "share_bp": 500}, {"arm": "32", "share_bp": 500}],
        "ports": [80, 443],
        "prefix_v4": 22,
        "prefix_v6": 48,
        "assignment_seed": 0xC0FFEE,
        "starts_at": wire.utc_timestamp(dt.datetime.fromisoformat(campaign["starts_at"])),
        "ends_at": wire.utc_timestamp(dt.datetime.fromisoformat(campaign["ends_at"])),
        "sample_share": 0.05,
        "flush_interval_s": 30,
        "phase": 0,
    }


def test_campaign_ports_replace_the_servers_own(client: httpx.Client, server_token: str, admin_token: str) -> None:
    server = enroll_server(client, server_token, ports=[80])
    running_campaign(client, admin_token, [server.id], passive_ports=[8443, 443])
    assert config(client, server).json()["study"]["ports"] == [8443, 443]


def test_config_etag_304_and_a_share_change(client: httpx.Client, server: Enrolled, admin_token: str) -> None:
    campaign = running_campaign(client, admin_token, [server.id])
    first = config(client, server)
    etag = first.headers["ETag"]
    unchanged = config(client, server, etag=etag)
    assert unchanged.status_code == 304 and unchanged.content == b"" and unchanged.headers["ETag"] == etag
    assert config(client, server, etag='"something-else"').status_code == 200
    patched = client.patch(
        f"/api/v1/campaigns/{campaign['id']}",
        headers=bearer(admin_token),
        json={
            "passive_arms": [
                {"arm": "default", "share_bp": 5000},
                {"arm": "16", "share_bp": 2500},
                {"arm": "32", "share_bp": 2500},
            ]
        },
    )
    assert patched.status_code == 200 and patched.json()["phase"] == 1, patched.text
    changed = config(client, server, etag=etag)
    assert changed.status_code == 200 and changed.headers["ETag"] != etag
    assert changed.json()["study"]["phase"] == 1
    assert [arm["share_bp"] for arm in changed.json()["study"]["arms"]] == [5000, 2500, 2500]


def test_a_server_cannot_read_another_servers_config(client: httpx.Client, server: Enrolled, server_token: str) -> None:
    other = enroll_server(client, server_token)
    refused = config(client, server, server_id=other.id)
    assert refused.status_code == 403
    assert config(client, other).status_code == 200


def test_fleet_listing_shows_the_last_heartbeat(
    client: httpx.Client, server: Enrolled, admin_token: str, read_token: str, service_env: dict[str, str]
) -> None:
    running_campaign(client, admin_token, [server.id])
    heartbeat = make_heartbeat(arms_state="error: nft add rule failed for 203.0.113.9 on eth0", version="0.6.2")
    upload = client.post(wire.PASSIVE_BATCH_PATH, json=make_passive_batch(server.id, heartbeat=heartbeat), headers=server.headers)
    assert upload.status_code == 200, upload.text
    assert client.get("/api/v1/servers", headers=bearer(read_token)).status_code == 401  # admin only
    listing = client.get("/api/v1/servers", headers=bearer(admin_token))
    assert listing.status_code == 200
    mine = next(entry for entry in listing.json() if entry["id"] == server.id)
    assert mine["version"] == "0.6.2" and mine["last_seen_at"] is not None and mine["ports"] == [80, 443]
    stored = mine["last_heartbeat"]
    assert stored["connections_seen"] == 12_345 and stored["capture_share"] == 0.25 and "received_at" in stored
    # The server's error text keeps what it says but not the address in it.
    assert stored["arms_state"] == "error: nft add rule failed for <address> on eth0"
    completed = subprocess.run(
        [*IWSCOPE, "servers", "list"], env={**service_env, "COLUMNS": "250"}, capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 0, completed.stderr
    assert server.id in completed.stdout and "80,443" in completed.stdout


def test_probes_are_never_scheduled_a_passive_campaign(
    client: httpx.Client, server: Enrolled, admin_token: str, enroll_token: str
) -> None:
    campaign = running_campaign(client, admin_token, [server.id])
    probe = enroll_probe(client, enroll_token)
    schedule = client.get(wire.PROBE_SCHEDULE_PATH.format(probe_id=probe.id), params={"wire_version": 6}, headers=probe.headers)
    assert schedule.status_code == 200
    assert campaign["id"] not in [entry["campaign_id"] for entry in schedule.json()["campaigns"]]
