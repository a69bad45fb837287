"""Reads of passive data need the read credential (``read`` or ``admin`` token); the Parquet
exports hold the rows and honour their filters; the public exports, ``iwscope export`` and bundles
never hold passive tables or passive campaigns."""

from __future__ import annotations

import datetime as dt
import io
import json
import pathlib
import subprocess
import sys
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from passive_kit import enroll_server, make_aggregate, make_connection, make_passive_batch, running_campaign
from testkit import Enrolled, bearer

from iwprobe import wire

IWSCOPE = [sys.executable, "-m", "iwscope.cli"]
INVALID = {"detail": "invalid credentials"}
PATHS = ("/api/v1/passive/aggregates.parquet", "/api/v1/passive/connections.parquet")


def parquet(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/vnd.apache.parquet"
    return pq.read_table(io.BytesIO(response.content))


@pytest.fixture
def uploaded(client: httpx.Client, admin_token: str, server_token: str) -> dict[str, Any]:
    """Two servers, each in a passive campaign of its own, each with aggregates of two hours and connections."""
    found: dict[str, Any] = {"servers": [], "campaigns": [], "aggregates": [], "connections": []}
    this_hour = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
    for _ in range(2):
        server = enroll_server(client, server_token)
        campaign = running_campaign(client, admin_token, [server.id])
        aggregates = [
            make_aggregate(server.id, campaign["id"], hour=wire.utc_timestamp(this_hour - dt.timedelta(hours=hours)))
            for hours in (0, 1)
        ]
        connections = [make_connection(server.id, campaign["id"]) for _ in range(3)]
        answer = client.post(
            wire.PASSIVE_BATCH_PATH, json=make_passive_batch(server.id, aggregates, connections), headers=server.headers
        )
        assert answer.status_code == 200, answer.text
        found["servers"].append(server)
        found["campaigns"].append(campaign)
        found["aggregates"].append(aggregates)
        found["connections"].append(connections)
    found["this_hour"] = this_hour
    return found


def test_reads_need_a_read_or_admin_token(
    client: httpx.Client,
    uploaded: dict[str, Any],
    read_token: str,
    admin_token: str,
    enroll_token: str,
    origin_token: str,
    server_token: str,
    probe: Enrolled,
    origin: Enrolled,
    service_env: dict[str, str],
) -> None:
    campaign_id = uploaded["campaigns"][0]["id"]
    server: Enrolled = uploaded["servers"][0]
    for path in PATHS:
        anonymous = client.get(path, params={"campaign_id": campaign_id})
        assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Bearer"
        for credential in (
            probe.credential,
            origin.credential,
            server.credential,
            enroll_token,
            origin_token,
            server_token,
            read_token + "x",
            "garbage",
        ):
            refused = client.get(path, params={"campaign_id": campaign_id}, headers=bearer(credential))
            assert (refused.status_code, refused.json()) == (401, INVALID), credential
        for token in (read_token, admin_token):
            assert parquet(client.get(path, params={"campaign_id": campaign_id}, headers=bearer(token))).num_rows > 0
    # A revoked read token is refused from the next request on, with the same body.
    created = subprocess.run(
        [*IWSCOPE, "token", "create", "--kind", "read", "--label", "revoke-me"],
        env=service_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    reader = created.stdout.strip()
    assert reader.startswith("iws_read_")
    assert client.get(PATHS[0], headers=bearer(reader)).status_code == 200
    revoked = subprocess.run(
        [*IWSCOPE, "token", "revoke", "--token", reader], env=service_env, capture_output=True, text=True, timeout=60
    )
    assert revoked.returncode == 0, revoked.stderr
    answer = client.get(PATHS[0], headers=bearer(reader))
    assert (answer.status_code, answer.json()) == (401, INVALID)


def test_parquet_holds_the_rows_and_honours_the_filters(client: httpx.Client, uploaded: dict[str, Any], read_token: str) -> None:
    headers = bearer(read_token)
    first_campaign, second_campaign = (campaign["id"] for campaign in uploaded["campaigns"])
    first_server, second_server = uploaded["servers"]
    aggregates = parquet(client.get(PATHS[0], params={"campaign_id": first_campaign}, headers=headers))
    assert sorted(aggregates.column("aggregate_id").to_pylist()) == sorted(
        record["aggregate_id"] for record in uploaded["aggregates"][0]
    )
    types = {field.name: str(field.type) for field in aggregates.schema}
    assert types["hour"] == "timestamp[us, tz=UTC]" and types["connections"] == "int64" and types["cluster"] == "int16"
    row = aggregates.to_pylist()[0]
    original = next(record for record in uploaded["aggregates"][0] if record["aggregate_id"] == row["aggregate_id"])
    assert json.loads(row["latency_bins"]) == [pair[0] for pair in original["latency_hist"]]
    assert json.loads(row["latency_counts"]) == [pair[1] for pair in original["latency_hist"]]
    metadata = json.loads(pq.read_schema(io.BytesIO(client.get(PATHS[0], headers=headers).content)).metadata[b"iwscope"])
    assert metadata["table"] == "aggregates"
    # By server, and the window on hour (inclusive): only this hour's aggregate.
    by_server = parquet(client.get(PATHS[0], params={"server_id": second_server.id}, headers=headers))
    assert set(by_server.column("server_id").to_pylist()) == {second_server.id} and by_server.num_rows == 2
    recent = parquet(
        client.get(PATHS[0], params={"server_id": first_server.id, "since": uploaded["this_hour"].isoformat()}, headers=headers)
    )
    assert recent.num_rows == 1
    connections = parquet(client.get(PATHS[1], params={"campaign_id": second_campaign}, headers=headers))
    assert sorted(connections.column("record_id").to_pylist()) == sorted(
        record["record_id"] for record in uploaded["connections"][1]
    )
    assert json.loads(connections.column("tcp_info")[0].as_py())["snd_cwnd"] == 24
    assert connections.column("client_prefix")[0].as_py() in {record["client_prefix"] for record in uploaded["connections"][1]}
    future = (dt.datetime.now(dt.UTC) + dt.timedelta(days=2)).isoformat()
    assert parquet(client.get(PATHS[1], params={"since": future}, headers=headers)).num_rows == 0
    for bad in ({"campaign_id": 0}, {"campaign_id": 2**63}, {"server_id": "nope"}, {"since": "yesterday"}):
        assert client.get(PATHS[1], params=bad, headers=headers).status_code == 422, bad


def test_public_exports_and_bundles_never_hold_passive_data(
    client: httpx.Client, uploaded: dict[str, Any], service_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    passive_id = uploaded["campaigns"][0]["id"]
    campaigns = parquet(client.get("/api/v1/campaigns.parquet"))
    assert passive_id not in campaigns.column("id").to_pylist()
    for column in (
        "server_ids",
        "passive_arms",
        "passive_ports",
        "prefix_v4",
        "prefix_v6",
        "assignment_seed",
        "sample_share",
        "flush_interval_s",
        "phase",
    ):
        assert column not in campaigns.column_names
    assert parquet(client.get("/api/v1/campaigns.parquet", params={"campaign_id": passive_id})).num_rows == 0
    for table in ("passive_aggregates", "passive_connections", "aggregates", "connections", "servers"):
        assert client.get(f"/api/v1/{table}.parquet").status_code == 422, table
    # No public route reads a passive table without the credential (the OpenAPI says which need one).
    document = client.get("/openapi.json").json()
    assert document["paths"]["/api/v1/passive/{table}.parquet"]["get"].get("security")
    assert document["paths"][wire.PASSIVE_BATCH_PATH]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/wire.PassiveBatch"
    }
    exported = subprocess.run(
        [*IWSCOPE, "export", "--out", str(tmp_path / "all"), "--campaign", str(passive_id)],
        env=service_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert exported.returncode == 0, exported.stderr
    rows = {line.split("\t")[0]: line.split("\t")[1] for line in exported.stdout.splitlines()}
    assert set(rows) == {"trials", "observations", "path_estimates", "campaigns", "census", "traces"} and rows["campaigns"] == "0"
    refused = subprocess.run(
        [*IWSCOPE, "export", "--out", str(tmp_path / "x"), "--tables", "passive_aggregates"],
        env=service_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and "unknown table" in refused.stderr
    bundle = subprocess.run(
        [*IWSCOPE, "campaigns", "bundle", str(passive_id), "--out", str(tmp_path / "bundle")],
        env=service_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bundle.returncode != 0 and "passive campaign" in bundle.stderr


@pytest.mark.parametrize(
    "bound", ["0219-11-08T20:49:51-18:04", "9999-12-31T23:00:00-05:00", "0001-01-01T00:30:00+23:00", "2026-11-26T10:00:00"]
)
def test_window_bounds_of_any_offset_are_read_not_a_500(client: httpx.Client, read_token: str, bound: str) -> None:
    """Offsets Python takes but PostgreSQL's literals do not (beyond +-15:59), and instants whose
    UTC lies beyond year 9999 or before year 1, in the passive and the public Parquet exports
    (the fuzzer found the first as a 500)."""
    for path, headers in (
        (PATHS[0], bearer(read_token)),
        (PATHS[1], bearer(read_token)),
        ("/api/v1/census.parquet", {}),
        ("/api/v1/trials.parquet", {}),
    ):
        for name in ("since", "until"):
            answer = client.get(path, params={name: bound}, headers=headers)
            assert answer.status_code == 200, (path, name, answer.text)
