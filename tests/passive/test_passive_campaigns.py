"""Passive campaigns through the campaign API and the CLI: what they need and refuse, their
defaults, no two on one server at once (409), a share sweep bumping the phase."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import uuid
from typing import Any

import httpx
import pytest
from passive_kit import enroll_server, passive_campaign, running_campaign
from testkit import Enrolled, bearer

from iwprobe import wire

IWSCOPE = [sys.executable, "-m", "iwscope.cli"]
DEFAULT_ARM = {"arm": "default", "share_bp": 9000}


def arms(*pairs: tuple[str, int]) -> list[dict[str, Any]]:
    return [{"arm": arm, "share_bp": share} for arm, share in pairs]


def patch(client: httpx.Client, admin_token: str, campaign_id: int, **body: Any) -> httpx.Response:
    return client.patch(f"/api/v1/campaigns/{campaign_id}", headers=bearer(admin_token), json=body)


@pytest.mark.parametrize(
    ("passive_arms", "needle"),
    [
        (arms(("default", 9000), ("16", 500)), "must sum to 10000"),
        (arms(("default", 5000), ("default", 5000)), "must not repeat"),
        (arms(("default", 9000), ("0", 1000)), "IW from 1 to 256"),
        (arms(("default", 9000), ("300", 1000)), "IW from 1 to 256"),
        (arms(("default", 9000), ("016", 1000)), "without leading zeros"),
        (arms(("16", 5000), ("16", 5000)), "must not repeat"),
        (arms(*[(str(iw), 1000) for iw in range(1, 10)], ("default", 1000)), "passive_arms"),
        (arms(("ten", 10_000)), "passive_arms"),
        (arms(("default", 10_001)), "passive_arms"),
        ([], "passive_arms"),
    ],
)
def test_arms_and_shares_are_checked(
    client: httpx.Client, admin_token: str, server: Enrolled, passive_arms: list[dict[str, Any]], needle: str
) -> None:
    refused = passive_campaign(client, admin_token, [server.id], passive_arms=passive_arms)
    assert refused.status_code == 422 and needle in refused.text, refused.text


def test_two_default_arms_are_refused_even_if_shares_add_up(client: httpx.Client, admin_token: str, server: Enrolled) -> None:
    refused = passive_campaign(
        client, admin_token, [server.id], passive_arms=arms(("default", 4000), ("16", 2000), ("default", 4000))
    )
    assert refused.status_code == 422 and "must not repeat" in refused.text
    accepted = passive_campaign(client, admin_token, [server.id], passive_arms=arms(("10", 2000), ("16", 3000), ("256", 5000)))
    assert accepted.status_code == 201, accepted.text  # no default arm at all is fine


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"ends_at": None}, "time box"),
        ({"passive_arms": None}, "passive_arms"),
        ({"arms": [3, 10]}, "does not take arms"),
        ({"sizes": [1000]}, "does not take sizes"),
        ({"repetitions": 3}, "does not take repetitions"),
        ({"probe_regions": ["eu"]}, "does not take probe_regions"),
        ({"census_urls": ["https://example.org/x"]}, "does not take census_urls"),
        ({"server_ids": []}, "server_ids"),
        ({"prefix_v4": 25}, "prefix_v4"),
        ({"prefix_v6": 31}, "prefix_v6"),
        ({"assignment_seed": 2**32}, "assignment_seed"),
        ({"sample_share": 1.5}, "sample_share"),
        ({"passive_ports": [443, 443]}, "must not repeat"),
    ],
)
def test_what_a_passive_campaign_needs_and_refuses(
    client: httpx.Client, admin_token: str, server: Enrolled, change: dict[str, Any], needle: str
) -> None:
    change = dict(change)
    refused = passive_campaign(client, admin_token, change.pop("server_ids", [server.id]), **change)
    assert refused.status_code == 422 and needle in refused.text, refused.text


def test_passive_fields_need_server_ids_and_servers_must_exist(
    client: httpx.Client, admin_token: str, server_token: str, service_env: dict[str, str], origin: Enrolled
) -> None:
    now = dt.datetime.now(dt.UTC)
    ordinary = client.post(
        "/api/v1/campaigns",
        headers=bearer(admin_token),
        json={
            "name": "x",
            "origin_ids": [origin.id],
            "arms": [3],
            "sizes": [1000],
            "starts_at": now.isoformat(),
            "passive_arms": [{"arm": "default", "share_bp": 10_000}],
        },
    )
    assert ordinary.status_code == 422 and "only a passive campaign" in ordinary.text
    unknown = passive_campaign(client, admin_token, [str(uuid.uuid4())])
    assert unknown.status_code == 422 and "unknown or revoked servers" in unknown.text
    revoked = enroll_server(client, server_token)
    subprocess.run([*IWSCOPE, "servers", "revoke", revoked.id], env=service_env, check=True, capture_output=True)
    assert "unknown or revoked" in passive_campaign(client, admin_token, [revoked.id]).text
    portless = enroll_server(client, server_token, ports=[])
    refused = passive_campaign(client, admin_token, [portless.id])
    assert refused.status_code == 422 and "enrolled no ports" in refused.text
    assert passive_campaign(client, admin_token, [portless.id], passive_ports=[443]).status_code == 201


def test_defaults_and_the_seed(client: httpx.Client, admin_token: str, server_token: str) -> None:
    seeds = set()
    for _ in range(3):
        server = enroll_server(client, server_token)
        created = running_campaign(client, admin_token, [server.id])
        assert (
            created["prefix_v4"],
            created["prefix_v6"],
            created["sample_share"],
            created["flush_interval_s"],
            created["phase"],
            created["passive_ports"],
        ) == (24, 48, 0.01, 60, 0, None)
        assert (created["origin_ids"], created["arms"], created["sizes"], created["size_dist"]) == ([], [], None, None)
        assert 0 <= created["assignment_seed"] < 2**32
        seeds.add(created["assignment_seed"])
    assert len(seeds) == 3  # random per campaign (a 1-in-10^9 chance of a false failure)
    server = enroll_server(client, server_token)
    given = running_campaign(client, admin_token, [server.id], assignment_seed=0, duration_s=600, ends_at=None, prefix_v6=56)
    assert given["assignment_seed"] == 0 and given["prefix_v6"] == 56
    starts = dt.datetime.fromisoformat(given["starts_at"])
    assert dt.datetime.fromisoformat(given["ends_at"]) - starts == dt.timedelta(seconds=600)


def test_overlapping_passive_campaigns_on_one_server_conflict(client: httpx.Client, admin_token: str, server_token: str) -> None:
    first_server, second_server = enroll_server(client, server_token), enroll_server(client, server_token)
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    window = {"starts_at": now.isoformat(), "ends_at": (now + dt.timedelta(hours=2)).isoformat()}
    first = running_campaign(client, admin_token, [first_server.id], **window)
    clash = passive_campaign(
        client,
        admin_token,
        [second_server.id, first_server.id],
        starts_at=(now + dt.timedelta(hours=1)).isoformat(),
        ends_at=(now + dt.timedelta(hours=3)).isoformat(),
    )
    assert clash.status_code == 409, clash.text
    detail = clash.json()["detail"]
    assert "must not overlap" in detail and first_server.id in detail and f"campaign {first['id']}" in detail
    assert second_server.id not in detail
    # Back to back is not an overlap ([starts_at, ends_at)); another server is free.
    after = running_campaign(
        client, admin_token, [first_server.id], starts_at=window["ends_at"], ends_at=(now + dt.timedelta(hours=4)).isoformat()
    )
    running_campaign(client, admin_token, [second_server.id], **window)
    # A patch that stretches a window into another campaign's, or adds a busy server: 409.
    assert patch(client, admin_token, first["id"], ends_at=(now + dt.timedelta(hours=3)).isoformat()).status_code == 409
    third = enroll_server(client, server_token)
    alone = running_campaign(client, admin_token, [third.id], **window)
    assert patch(client, admin_token, alone["id"], server_ids=[third.id, first_server.id]).status_code == 409
    assert patch(client, admin_token, after["id"], ends_at=(now + dt.timedelta(hours=5)).isoformat()).status_code == 200


def test_a_share_sweep_bumps_the_phase(
    client: httpx.Client, admin_token: str, server: Enrolled, origin: Enrolled, service_env: dict[str, str]
) -> None:
    campaign = running_campaign(client, admin_token, [server.id], passive_arms=arms(("default", 9500), ("10", 500)))
    for phase, treated in ((1, 2500), (2, 5000)):
        swept = patch(client, admin_token, campaign["id"], passive_arms=arms(("default", 10_000 - treated), ("10", treated)))
        assert swept.status_code == 200, swept.text
        assert swept.json()["phase"] == phase and swept.json()["passive_arms"][1]["share_bp"] == treated
    same = patch(client, admin_token, campaign["id"], passive_arms=arms(("default", 5000), ("10", 5000)))
    assert same.json()["phase"] == 2  # unchanged shares: same phase
    other = patch(client, admin_token, campaign["id"], sample_share=0.2, flush_interval_s=120)
    assert (other.json()["phase"], other.json()["sample_share"], other.json()["flush_interval_s"]) == (2, 0.2, 120)
    assert patch(client, admin_token, campaign["id"], passive_arms=arms(("default", 10))).status_code == 422
    for refused in (
        {"ends_at": None},
        {"repetitions": 2},
        {"probe_regions": ["eu"]},
        {"passive_arms": None},
        {"assignment_seed": 1},
        {"prefix_v4": 16},
    ):
        answer = patch(client, admin_token, campaign["id"], **refused)
        assert answer.status_code == 422, (refused, answer.text)
    # The CLI's share sweep: prints the new phase.
    completed = subprocess.run(
        [*IWSCOPE, "campaigns", "shares", str(campaign["id"]), "--passive-arm", "default:2500", "--passive-arm", "10:7500"],
        env=service_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0 and completed.stdout.strip() == "3", completed.stderr
    # An ordinary campaign takes none of it.
    now = dt.datetime.now(dt.UTC)
    ordinary = client.post(
        "/api/v1/campaigns",
        headers=bearer(admin_token),
        json={"name": "o", "origin_ids": [origin.id], "arms": [3], "sizes": [1000], "starts_at": now.isoformat()},
    ).json()
    answer = patch(client, admin_token, ordinary["id"], passive_arms=arms(("default", 10_000)))
    assert answer.status_code == 422 and "only a passive campaign" in answer.text
    assert ordinary["server_ids"] is None and ordinary["phase"] is None


def test_cli_creates_a_passive_campaign(
    client: httpx.Client, admin_token: str, server_token: str, service_env: dict[str, str]
) -> None:
    first, second = enroll_server(client, server_token), enroll_server(client, server_token)
    completed = subprocess.run(
        [
            *IWSCOPE,
            "campaigns",
            "create",
            "--name",
            "cli passive",
            "--server",
            first.id,
            "--server",
            second.id,
            "--passive-arm",
            "default:9000",
            "--passive-arm",
            "16:500",
            "--passive-arm",
            "32:500",
            "--duration",
            "3600",
            "--sample-share",
            "0.1",
            "--prefix-v4",
            "20",
            "--prefix-v6",
            "40",
            "--passive-port",
            "443",
        ],
        env=service_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    stored = client.get(f"/api/v1/campaigns/{int(completed.stdout)}", headers=bearer(admin_token)).json()
    assert sorted(stored["server_ids"]) == sorted([first.id, second.id])
    assert stored["passive_arms"] == arms(("default", 9000), ("16", 500), ("32", 500))
    assert (stored["sample_share"], stored["prefix_v4"], stored["prefix_v6"], stored["passive_ports"]) == (0.1, 20, 40, [443])
    config = client.get(wire.SERVER_CONFIG_PATH.format(server_id=second.id), headers=second.headers).json()
    assert config["study"]["campaign_id"] == stored["id"] and config["study"]["ports"] == [443]
    for bad, needle in (
        (["--passive-arm", "default9000"], "ARM:BP"),
        (["--repetitions", "3"], "repetitions"),
        (["--passive-arm", "16:500"], "sum to 10000"),
    ):
        refused = subprocess.run(
            [
                *IWSCOPE,
                "campaigns",
                "create",
                "--name",
                "bad",
                "--server",
                enroll_server(client, server_token).id,
                "--duration",
                "60",
                *(bad if bad[0] != "--repetitions" else ["--passive-arm", "default:10000", *bad]),
            ],
            env=service_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode != 0 and needle in refused.stderr, (bad, refused.stderr)
    overlap = subprocess.run(
        [
            *IWSCOPE,
            "campaigns",
            "create",
            "--name",
            "again",
            "--server",
            first.id,
            "--passive-arm",
            "default:10000",
            "--duration",
            "60",
        ],
        env=service_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert overlap.returncode != 0 and "must not overlap" in overlap.stderr
