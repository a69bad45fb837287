"""Helpers of the passive (wire v6) tests: servers, passive campaigns, valid records to start from
(a unique module name: tests/ directories are not packages)."""

from __future__ import annotations

import datetime as dt
import random
import uuid
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.engine import Engine
from testkit import Enrolled, bearer

from iwprobe import wire


def enroll_server(
    client: httpx.Client, server_token: str, ports: list[int] | None = None, region: str = "eu-central-dc1"
) -> Enrolled:
    response = client.post(
        wire.SERVER_ENROLL_PATH,
        headers=bearer(server_token),
        json={
            "name": f"web-{uuid.uuid4().hex[:6]}",
            "region": region,
            "ports": [80, 443] if ports is None else ports,
            "version": "0.6.0",
            "kernel": "6.1.0-13-amd64",
        },
    )
    assert response.status_code == 201, response.text
    body = response.json()
    return Enrolled(body["id"], body["credential"])


def passive_campaign(client: httpx.Client, admin_token: str, server_ids: list[str], **extra: Any) -> httpx.Response:
    """POST a passive campaign running from a minute ago for an hour (``extra`` overrides)."""
    now = dt.datetime.now(dt.UTC)
    body: dict[str, Any] = {
        "name": f"real users {uuid.uuid4().hex[:6]}",
        "server_ids": server_ids,
        "passive_arms": [{"arm": "default", "share_bp": 9000}, {"arm": "16", "share_bp": 500}, {"arm": "32", "share_bp": 500}],
        "starts_at": (now - dt.timedelta(minutes=1)).isoformat(),
        "ends_at": (now + dt.timedelta(hours=1)).isoformat(),
    }
    body.update(extra)
    return client.post("/api/v1/campaigns", headers=bearer(admin_token), json=body)


def running_campaign(client: httpx.Client, admin_token: str, server_ids: list[str], **extra: Any) -> dict[str, Any]:
    response = passive_campaign(client, admin_token, server_ids, **extra)
    assert response.status_code == 201, response.text
    return dict(response.json())


def current_hour() -> str:
    return wire.utc_timestamp(dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0))


def make_aggregate(server_id: str, campaign_id: int, **overrides: Any) -> dict[str, Any]:
    """A valid wire ``PassiveAggregate`` (arm 16, 40 connections, 30 of them with a response)."""
    record: dict[str, Any] = {
        "aggregate_id": wire.new_id(),
        "server_id": server_id,
        "campaign_id": campaign_id,
        "phase": 0,
        "hour": current_hour(),
        "arm": "16",
        "arm_iw": 16,
        "treated_share_bp": 1000,
        "family": "ipv4",
        "port_kind": "user",
        "region": "DE",
        "cluster": random.randrange(wire.PASSIVE_CLUSTER_GROUPS),
        "rtt_bucket": 2,
        "bandwidth_bucket": 5,
        "bdp_bucket": 2,
        "size_octave": 14,
        "biased": False,
        "connections": 40,
        "responses": 30,
        "latency_sum_us": 30 * 85_000,
        "latency_hist": [[wire.hist_bin(80_000), 20], [wire.hist_bin(95_000), 10]],
        "retrans_connections": 3,
        "data_segs_out": 1_200,
        "total_retrans": 5,
        "bytes_acked": 1_600_000,
        "bytes_retrans": 7_240,
        "syn_retrans": 1,
        "rwnd_limited": 2,
        "reused_after_idle": 0,
        "tls": 35,
    }
    record.update(overrides)
    return record


def make_connection(server_id: str, campaign_id: int, **overrides: Any) -> dict[str, Any]:
    """A valid, captured wire ``PassiveConnection`` (arm 16, HTTPS on 443)."""
    record: dict[str, Any] = {
        "record_id": wire.new_id(),
        "server_id": server_id,
        "campaign_id": campaign_id,
        "phase": 0,
        "closed_at": wire.utc_timestamp(),
        "arm": "16",
        "arm_iw": 16,
        "treated_share_bp": 1000,
        "family": "ipv6",
        "port_kind": "user",
        "port": 443,
        "region": "DE",
        "country": "DE",
        "client_prefix": f"{random.getrandbits(64):016x}",
        "cluster": 7,
        "tcp_info": {
            "min_rtt": 41_000,
            "rtt": 45_500,
            "delivery_rate": 2_500_000,
            "bytes_acked": 48_000,
            "data_segs_out": 36,
            "total_retrans": 1,
            "bytes_retrans": 1_440,
            "snd_cwnd": 24,
            "snd_mss": 1440,
        },
        "captured": True,
        "tls": True,
        "response_latency_us": 93_000,
        "response_bytes": 46_000,
        "handshake_us": 47_000,
        "first_flight_segments": 16,
        "first_flight_bytes": 23_040,
        "handshake_rtt_us": 41_500,
        "client_rwnd_bytes": 65_535,
        "syn_retrans": False,
        "rwnd_limited": False,
        "reused_after_idle": False,
        "exchanges": 2,
    }
    record.update(overrides)
    return record


def make_heartbeat(**overrides: Any) -> dict[str, Any]:
    heartbeat: dict[str, Any] = {
        "version": "0.6.1",
        "uptime_s": 3600.5,
        "arms_state": "on",
        "connections_seen": 12_345,
        "connections_captured": 2_000,
        "notifications_lost": 0,
        "packets_dropped": 3,
        "capture_share": 0.25,
        "spool_backlog": 4,
        "spool_bytes": 8_192,
    }
    heartbeat.update(overrides)
    return heartbeat


def make_passive_batch(
    server_id: str,
    aggregates: list[dict[str, Any]] | None = None,
    connections: list[dict[str, Any]] | None = None,
    heartbeat: dict[str, Any] | None = None,
) -> dict[str, Any]:
    batch: dict[str, Any] = {
        "wire_version": 6,
        "batch_id": wire.new_id(),
        "server_id": server_id,
        "sent_at": wire.utc_timestamp(),
        "aggregates": aggregates or [],
        "connections": connections or [],
    }
    if heartbeat is not None:
        batch["heartbeat"] = heartbeat
    return batch


def count_rows(engine: Engine, server_id: str) -> tuple[int, int]:
    """Rows of ``server_id`` in (passive_aggregates, passive_connections)."""
    with engine.connect() as connection:
        return tuple(
            connection.execute(
                text(  # type: ignore[return-value]
                    "SELECT (SELECT count(*) FROM passive_aggregates WHERE server_id = :s), "
                    "(SELECT count(*) FROM passive_connections WHERE server_id = :s)"
                ),
                {"s": server_id},
            ).one()
        )
