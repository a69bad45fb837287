"""Trial traces (wire v7) through the collector: a campaign's ``trace_share`` in its schedule,
``POST /api/v1/traces/batch`` (all or nothing, idempotent, either end's credential for its own
side), ``GET /api/v1/trials/{trial_id}/traces`` with the trial's twins, the Parquet export and
the bytes a traced trial costs.

Traces are built the way the probe builds them: synthetic :class:`iwprobe._capture.Packet` s of
one fetch (handshake, slow start's flights at a bottleneck's spacing with jitter, the probe's
ACKs, the close) turned into a dict by :meth:`iwprobe._trace.Trace.from_packets` / ``to_dict``.
The API, PostgreSQL and the credentials are the session's real ones (tests/conftest.py).
"""

from __future__ import annotations

import copy
import io
import json
import pathlib
import random
import uuid
import zlib
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from testkit import Enrolled, bearer, create_campaign, make_batch, make_trial

from iwprobe import wire
from iwprobe._capture import ACK, FIN, SYN, Packet
from iwprobe._trace import Trace
from iwscope.exports.bundle import write_bundle
from iwscope.exports.columnar import ExportFilters
from iwscope.exports.traces import traces_schema, write_traces_parquet
from iwscope.traces.schemas import TrialTracesOut
from iwscope.traces.services import read_trial_traces

MSS = 1448
PSH = 0x08
SIZE = 100_000


# ----------------------------------------------------------------------------- traces
def realistic_trace(
    seed: int, iw: int = 10, size: int = SIZE, rtt_us: int = 48_000, rate_bps: float = 10e6, **extras: Any
) -> dict[str, Any]:
    """One HTTP/1.1 fetch of ``size`` bytes as the probe captures it: SYN, SYN-ACK, ACK and
    request; the response's segments in slow start's flights (``iw``, then doubling each round
    trip) spaced by the bottleneck's serialisation with a few µs of jitter, each acknowledged by
    the probe with a receive window that grows as autotuning does; the server's FIN and the
    close.  A 100 kB object over IW10 is ~150 packets."""
    rng = random.Random(seed)
    client_isn, server_isn = rng.randrange(2**32), rng.randrange(2**32)
    start_ns = 1_764_000_000_000_000_000 + seed * 1_000_000_000
    packets: list[Packet] = []

    def add(time_us: float, outgoing: bool, seq: int, ack: int, flags: int, window: int, payload: int = 0, **opts: int) -> None:
        packets.append(
            Packet(
                start_ns + int(time_us * 1000),
                outgoing,
                seq % 2**32,
                ack % 2**32,
                flags,
                payload,
                window,
                opts.get("mss"),
                opts.get("wscale"),
            )
        )

    request = 142
    client_next, server_next = client_isn + 1, server_isn + 1
    add(0, True, client_isn, 0, SYN, 64240, mss=1460, wscale=7)
    now = rtt_us + rng.uniform(0, 400)
    add(now, False, server_isn, client_next, SYN | ACK, 65160, mss=1460, wscale=9)
    add(now + rng.uniform(20, 60), True, client_next, server_next, ACK, 502)
    add(now + rng.uniform(60, 120), True, client_next, server_next, ACK | PSH, 502, request)
    client_next += request
    body = size + 250  # the response's headers
    spacing_us = MSS * 8 / rate_bps * 1e6
    flight_start = now + rtt_us + rng.uniform(0, 500)
    sent, window = 0, iw
    while sent < body:
        count = min(window * MSS, body - sent)
        segments = -(-count // MSS)
        for index in range(segments):
            payload = min(MSS, body - sent)
            last = sent + payload == body
            arrival = flight_start + index * spacing_us + rng.uniform(0, 30)
            add(arrival, False, server_next + sent, client_next, ACK | (PSH | FIN if last else 0), 128, payload)
            sent += payload
            received = sent + (1 if last else 0)
            add(arrival + rng.uniform(15, 45), True, client_next, server_next + received, ACK, 502 + sent // 512)
        flight_start += rtt_us + rng.uniform(0, 800)
        window *= 2
    close = flight_start
    add(close, True, client_next, server_next + body + 1, ACK | FIN, 502 + body // 512)
    add(close + rtt_us, False, server_next + body + 1, client_next + 1, ACK, 128)
    trace = Trace.from_packets(packets, rcv_mss=MSS, min_rtt_us=rtt_us).to_dict()
    trace.update(extras)
    assert wire.check_trace(trace) == len(packets)
    return trace


def trace_record(trial_id: str, trace: dict[str, Any], side: str = "receiver", captured_at: str | None = None) -> dict[str, Any]:
    return {"trial_id": trial_id, "side": side, "captured_at": captured_at or wire.utc_timestamp(), "trace": trace}


def trace_batch(agent_id: str, records: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
    batch = {
        "wire_version": wire.WIRE_VERSION,
        "batch_id": wire.new_id(),
        "agent_id": agent_id,
        "sent_at": wire.utc_timestamp(),
        "traces": records,
    }
    batch.update(overrides)
    return batch


def post_traces(client: httpx.Client, agent: Enrolled | None, batch: dict[str, Any]) -> httpx.Response:
    return client.post(wire.TRACES_BATCH_PATH, headers=agent.headers if agent else {}, json=batch)


def stored(engine: Engine, *trial_ids: str) -> list[dict[str, Any]]:
    """The ``trial_traces`` rows of these trials, by trial and side."""
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT trial_id::text AS trial_id, side, agent_id::text AS agent_id, captured_at, packets, dropped, "
                "first_flight_segments, first_flight_bytes, stored_bytes, octet_length(body) AS body_bytes, body "
                "FROM trial_traces WHERE trial_id = ANY(CAST(:ids AS uuid[])) ORDER BY trial_id, side"
            ),
            {"ids": list(trial_ids)},
        )
        return [dict(row._mapping) for row in rows]


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture
def campaign(client: httpx.Client, admin_token: str, origin: Enrolled) -> dict[str, Any]:
    return create_campaign(client, admin_token, origin.id, name="traced campaign", sizes=[SIZE], trace_share=0.5)


@pytest.fixture
def round_trials(client: httpx.Client, probe: Enrolled, origin: Enrolled, campaign: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Round 0 of the campaign over one path: arms 10 and 3 (uploaded in that order), and two
    trials that are not their twins: the next round, and another size."""
    inferred = {"status": "ok", "segments": 3, "bytes": 3 * MSS, "mss": MSS, "reason": ""}  # wire v5's ClientIw
    trials = {
        "iw10": make_trial(probe.id, origin.id, campaign["id"], arm_iw=10, round=0),
        "iw3": make_trial(probe.id, origin.id, campaign["id"], arm_iw=3, round=0, client_iw=inferred),
        "next_round": make_trial(probe.id, origin.id, campaign["id"], arm_iw=3, round=1),
        "other_size": make_trial(probe.id, origin.id, campaign["id"], arm_iw=3, round=0, object_size=10_000),
    }
    batch = make_batch(probe.id, list(trials.values()))
    batch["wire_version"] = 5
    response = client.post(wire.TRIALS_BATCH_PATH, headers=probe.headers, json=batch)
    assert response.status_code == 200, response.text
    return trials


# ----------------------------------------------------------------------------- campaigns
def test_a_campaigns_trace_share_is_shown_changed_and_scheduled(
    client: httpx.Client, admin_token: str, probe: Enrolled, campaign: dict[str, Any]
) -> None:
    assert campaign["trace_share"] == 0.5
    for wire_version in (wire.WIRE_VERSION, 2):  # older probes ignore the key they do not know
        schedule = client.get(
            wire.PROBE_SCHEDULE_PATH.format(probe_id=probe.id), headers=probe.headers, params={"wire_version": wire_version}
        )
        assert schedule.status_code == 200, schedule.text
        entries = [entry for entry in schedule.json()["campaigns"] if entry["campaign_id"] == campaign["id"]]
        assert [entry["trace_share"] for entry in entries] == [0.5]
    path = f"/api/v1/campaigns/{campaign['id']}"
    changed = client.patch(path, headers=bearer(admin_token), json={"trace_share": 1})
    assert changed.status_code == 200 and changed.json()["trace_share"] == 1.0, changed.text
    for bad in (1.5, -0.1, None):
        refused = client.patch(path, headers=bearer(admin_token), json={"trace_share": bad})
        assert refused.status_code == 422, (bad, refused.text)
    census = client.post(
        "/api/v1/campaigns",
        headers=bearer(admin_token),
        json={
            "name": "traced census",
            "census_urls": ["http://example.org/big"],
            "starts_at": wire.utc_timestamp(),
            "trace_share": 0.5,
        },
    )
    assert census.status_code == 422 and "trace_share" in census.text


# ----------------------------------------------------------------------------- uploads
def test_a_batch_is_stored_once_and_a_replay_changes_nothing(
    client: httpx.Client, probe: Enrolled, round_trials: dict[str, dict[str, Any]], db_engine: Engine
) -> None:
    ids = [round_trials["iw10"]["trial_id"], round_trials["iw3"]["trial_id"]]
    traces = [realistic_trace(1, iw=10), realistic_trace(2, iw=3)]
    batch = trace_batch(probe.id, [trace_record(trial_id, trace) for trial_id, trace in zip(ids, traces, strict=True)])
    answer = post_traces(client, probe, batch)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"batch_id": batch["batch_id"], "accepted": 2, "duplicates": 0}
    rows = stored(db_engine, *ids)
    by_id = {row["trial_id"]: row for row in rows}
    for trial_id, trace in zip(ids, traces, strict=True):
        row = by_id[trial_id]
        assert (row["side"], row["agent_id"], row["packets"], row["dropped"]) == ("receiver", probe.id, trace["packets"], 0)
        assert (row["first_flight_segments"], row["first_flight_bytes"]) == (
            trace["first_flight"]["segments"],
            trace["first_flight"]["bytes"],
        )
        assert row["stored_bytes"] == row["body_bytes"] == len(row["body"])
        canonical = json.dumps(trace, separators=(",", ":"), sort_keys=True).encode()
        assert zlib.decompress(row["body"]) == canonical and bytes(row["body"]) == zlib.compress(canonical, 6)
    assert by_id[ids[0]]["first_flight_segments"] == 10 and by_id[ids[1]]["first_flight_segments"] == 3

    # The same traces again -- and one changed -- in a new batch: duplicates, nothing rewritten.
    changed = copy.deepcopy(batch)
    changed["batch_id"] = wire.new_id()
    changed["traces"][0]["trace"]["dropped"] = 7
    again = post_traces(client, probe, changed)
    assert again.status_code == 200, again.text
    assert again.json() == {"batch_id": changed["batch_id"], "accepted": 0, "duplicates": 2}
    assert stored(db_engine, *ids) == rows


def test_a_bad_trace_refuses_the_whole_batch(
    client: httpx.Client, probe: Enrolled, round_trials: dict[str, dict[str, Any]], db_engine: Engine
) -> None:
    good_id, bad_id = round_trials["iw10"]["trial_id"], round_trials["iw3"]["trial_id"]
    good = trace_record(good_id, realistic_trace(3))
    uneven = realistic_trace(4)
    uneven["window"] = uneven["window"][:-1]
    refused = post_traces(client, probe, trace_batch(probe.id, [good, trace_record(bad_id, uneven)]))
    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"]
    assert "nothing was stored" in detail["message"]
    assert [(error["section"], error["index"], error["record_id"], error["field"]) for error in detail["errors"]] == [
        ("traces", 1, bad_id, "trace")
    ]
    assert detail["errors"][0]["message"].startswith("trace columns differ in length")

    longest = {"version": wire.TRACE_VERSION, **{name: [0] * (wire.MAX_TRACE_PACKETS + 1) for name in wire.TRACE_COLUMNS}}
    too_long = post_traces(client, probe, trace_batch(probe.id, [good, trace_record(bad_id, longest)]))
    assert too_long.status_code == 422, too_long.text
    [error] = too_long.json()["detail"]["errors"]
    assert error["index"] == 1 and f"at most {wire.MAX_TRACE_PACKETS}" in error["message"]

    beyond_int64 = realistic_trace(5)
    beyond_int64["seq"][0] = 2**63
    for record, field in (
        (trace_record(bad_id, beyond_int64), "trace"),
        (trace_record(bad_id, realistic_trace(6), captured_at="1999-12-31T23:59:59Z"), "captured_at"),
        (trace_record(bad_id, {**realistic_trace(7), "version": 2}), "trace"),
    ):
        answer = post_traces(client, probe, trace_batch(probe.id, [good, record]))
        assert answer.status_code == 422, answer.text
        assert [(e["index"], e["field"]) for e in answer.json()["detail"]["errors"]] == [(1, field)]

    assert post_traces(client, probe, trace_batch(probe.id, [good], wire_version=6)).status_code == 422
    many = [trace_record(str(uuid.uuid4()), {"version": 1, **{name: [] for name in wire.TRACE_COLUMNS}})]
    too_many = post_traces(client, probe, trace_batch(probe.id, many * (wire.MAX_TRACES_PER_BATCH + 1)))
    assert too_many.status_code == 413 and str(wire.MAX_TRACES_PER_BATCH) in too_many.text
    assert stored(db_engine, good_id, bad_id) == []


def test_each_end_uploads_its_own_side_under_its_own_id(
    client: httpx.Client, probe: Enrolled, origin: Enrolled, round_trials: dict[str, dict[str, Any]], db_engine: Engine
) -> None:
    trial_id = round_trials["iw10"]["trial_id"]
    receiver, sender = trace_record(trial_id, realistic_trace(8)), trace_record(trial_id, realistic_trace(9), side="sender")
    assert post_traces(client, None, trace_batch(probe.id, [receiver])).status_code == 401
    wrong = Enrolled(probe.id, f"{probe.id}.not-the-secret")
    assert post_traces(client, wrong, trace_batch(probe.id, [receiver])).status_code == 401
    for agent, record in ((probe, sender), (origin, receiver)):  # the other end's side
        answer = post_traces(client, agent, trace_batch(agent.id, [record]))
        assert answer.status_code == 403, answer.text
        assert [(e["index"], e["field"]) for e in answer.json()["detail"]["errors"]] == [(0, "side")]
    for agent, record, claimed in ((probe, receiver, origin.id), (origin, sender, probe.id)):  # another agent's id
        answer = post_traces(client, agent, trace_batch(claimed, [record]))
        assert answer.status_code == 403, answer.text
        assert answer.json()["detail"]["message"].startswith("credential does not belong to this id")
    assert stored(db_engine, trial_id) == []
    for agent, record in ((origin, sender), (probe, receiver)):
        answer = post_traces(client, agent, trace_batch(agent.id, [record]))
        assert answer.status_code == 200 and answer.json()["accepted"] == 1, answer.text
    rows = stored(db_engine, trial_id)
    assert [(row["side"], row["agent_id"]) for row in rows] == [("receiver", probe.id), ("sender", origin.id)]


# ----------------------------------------------------------------------------- reading
def test_a_trial_reads_with_its_traces_and_its_twins(
    client: httpx.Client,
    probe: Enrolled,
    origin: Enrolled,
    round_trials: dict[str, dict[str, Any]],
    db_session: Session,
) -> None:
    iw10, iw3 = round_trials["iw10"], round_trials["iw3"]
    sent = {
        (iw10["trial_id"], "receiver"): realistic_trace(10, iw=10),
        (iw10["trial_id"], "sender"): realistic_trace(11, iw=10),
        (iw3["trial_id"], "receiver"): realistic_trace(12, iw=3),
    }
    captured = "2026-11-27T01:30:00.123456Z"
    for agent, side in ((probe, "receiver"), (origin, "sender")):
        records = [trace_record(trial, trace, side, captured) for (trial, its_side), trace in sent.items() if its_side == side]
        assert post_traces(client, agent, trace_batch(agent.id, records)).status_code == 200
    orphan = str(uuid.uuid4())  # an origin's trace of a trial the probe never uploaded (yet)
    stray = post_traces(client, origin, trace_batch(origin.id, [trace_record(orphan, realistic_trace(13), "sender")]))
    assert stray.status_code == 200 and stray.json()["accepted"] == 1, stray.text

    answer = client.get(f"/api/v1/trials/{iw10['trial_id']}/traces")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    trial = body["trial"]
    assert (trial["trial_id"], trial["campaign_id"], trial["probe_id"], trial["round"]) == (
        iw10["trial_id"],
        iw10["campaign_id"],
        probe.id,
        0,
    )
    assert (trial["arm_iw"], trial["arm"], trial["object_size"], trial["total_us"], trial["ttfb_us"]) == (
        10,
        "10",
        SIZE,
        iw10["total_us"],
        iw10["ttfb_us"],
    )
    assert trial["tcp_info"] == iw10["tcp_info"] and trial["error_kind"] is None
    assert [trace["side"] for trace in trial["traces"]] == ["receiver", "sender"]
    for trace in trial["traces"]:
        assert trace["trace"] == sent[(iw10["trial_id"], trace["side"])]
        assert trace["packets"] == trace["trace"]["packets"] and trace["dropped"] == 0 and trace["stored_bytes"] > 0
        assert wire.parse_timestamp(trace["captured_at"]) == wire.parse_timestamp(captured)
    # The twins: the other arm of the same round, size and path -- not the next round, not another size.
    [twin] = body["twins"]
    assert (twin["trial_id"], twin["arm_iw"], twin["client_iw_segments"], twin["client_iw_status"]) == (
        iw3["trial_id"],
        3,
        3,
        "ok",
    )
    assert [trace["trace"] for trace in twin["traces"]] == [sent[(iw3["trial_id"], "receiver")]]
    # From the arm-3 trial: the arm-10 trial is its twin; the next round's trial has no traces and no twin here.
    assert [twin["trial_id"] for twin in client.get(f"/api/v1/trials/{iw3['trial_id']}/traces").json()["twins"]] == [
        iw10["trial_id"]
    ]
    lonely = client.get(f"/api/v1/trials/{round_trials['next_round']['trial_id']}/traces").json()
    assert lonely["trial"]["traces"] == [] and lonely["twins"] == []
    # 404: no such trial, even when a trace of it arrived.
    for unknown in (str(uuid.uuid4()), orphan):
        missing = client.get(f"/api/v1/trials/{unknown}/traces")
        assert missing.status_code == 404, missing.text
    assert client.get("/api/v1/trials/not-a-uuid/traces").status_code == 422
    # The service function the dashboard calls says the same.
    direct = read_trial_traces(db_session, uuid.UUID(iw10["trial_id"]))
    assert direct is not None and direct == TrialTracesOut.model_validate(body)
    assert read_trial_traces(db_session, uuid.UUID(orphan)) is None


# ----------------------------------------------------------------------------- export
def test_the_parquet_export_round_trips_the_columns(
    client: httpx.Client,
    probe: Enrolled,
    origin: Enrolled,
    campaign: dict[str, Any],
    round_trials: dict[str, dict[str, Any]],
    db_session: Session,
    tmp_path: pathlib.Path,
) -> None:
    iw10, iw3 = round_trials["iw10"]["trial_id"], round_trials["iw3"]["trial_id"]
    sent = {(iw10, "receiver"): realistic_trace(20), (iw3, "receiver"): realistic_trace(21, iw=3, dropped=2)}
    records = [trace_record(trial, trace) for (trial, _), trace in sent.items()]
    assert post_traces(client, probe, trace_batch(probe.id, records)).status_code == 200
    orphan = str(uuid.uuid4())
    sent[(orphan, "sender")] = realistic_trace(22)
    stray = trace_record(orphan, sent[(orphan, "sender")], "sender")
    assert post_traces(client, origin, trace_batch(origin.id, [stray])).status_code == 200

    answer = client.get("/api/v1/traces.parquet", params={"campaign_id": campaign["id"]})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/vnd.apache.parquet"
    table = pq.read_table(io.BytesIO(answer.content))
    assert table.schema.remove_metadata() == traces_schema()
    assert all(pa.types.is_list(table.schema.field(name).type) for name in wire.TRACE_COLUMNS)
    assert table.schema.field("t_us").type.value_type == pa.int64()
    assert json.loads(table.schema.metadata[b"iwscope"])["table"] == "traces"
    rows = {(row["trial_id"], row["side"]): row for row in table.to_pylist()}
    assert set(rows) == {(iw10, "receiver"), (iw3, "receiver")}  # the orphan has no campaign
    for key, row in rows.items():
        trace = sent[key]
        assert all(row[name] == trace[name] for name in wire.TRACE_COLUMNS), key
        assert (row["campaign_id"], row["packets"], row["dropped"]) == (campaign["id"], trace["packets"], trace["dropped"])
        assert (row["first_flight_segments"], row["first_flight_bytes"]) == (
            trace["first_flight"]["segments"],
            trace["first_flight"]["bytes"],
        )
        assert row["stored_bytes"] > 0 and row["captured_at"].tzinfo is not None

    # Every trace (no filter): the orphan too, without a campaign; written to a file the same way.
    path = tmp_path / "traces.parquet"
    written = write_traces_parquet(db_session, ExportFilters(), str(path))
    everything = {(row["trial_id"], row["side"]): row for row in pq.read_table(path).to_pylist()}
    assert written == len(everything) and set(sent) <= set(everything)
    assert everything[(orphan, "sender")]["campaign_id"] is None
    assert everything[(orphan, "sender")]["window"] == sent[(orphan, "sender")]["window"]
    by_probe = client.get("/api/v1/traces.parquet", params={"probe_id": probe.id})
    assert pq.read_table(io.BytesIO(by_probe.content)).num_rows == 2
    after = client.get("/api/v1/traces.parquet", params={"campaign_id": campaign["id"], "since": "2100-01-01T00:00:00Z"})
    assert pq.read_table(io.BytesIO(after.content)).num_rows == 0

    # A bundle of the campaign holds them as data/traces.parquet.
    manifest = write_bundle(db_session, [campaign["id"]], tmp_path / "bundle")
    assert manifest["rows"]["traces"] == 2 and "data/traces.parquet" in manifest["files"]
    bundled = pq.read_table(tmp_path / "bundle" / "data" / "traces.parquet")
    assert bundled.column("seq").type == pa.list_(pa.int64()) and sorted(bundled.column("trial_id").to_pylist()) == sorted(
        [iw10, iw3]
    )


# ----------------------------------------------------------------------------- cost
def test_what_a_traced_trial_costs(
    client: httpx.Client, probe: Enrolled, origin: Enrolled, round_trials: dict[str, dict[str, Any]], db_engine: Engine
) -> None:
    """A 100 kB fetch over IW10 at 10 Mbit/s and 48 ms, traced at both ends: ~150 packets a
    side.  Printed for docs/probe.md; the bound only says the encoding compresses."""
    trial_id = round_trials["iw10"]["trial_id"]
    receiver, sender = realistic_trace(30), realistic_trace(31)
    assert post_traces(client, probe, trace_batch(probe.id, [trace_record(trial_id, receiver)])).status_code == 200
    assert post_traces(client, origin, trace_batch(origin.id, [trace_record(trial_id, sender, "sender")])).status_code == 200
    rows = {row["side"]: row for row in stored(db_engine, trial_id)}
    json_bytes = len(json.dumps(receiver, separators=(",", ":"), sort_keys=True))
    print(
        f"\ntraced trial: {receiver['packets']} packets, {json_bytes} bytes of compact JSON, stored "
        f"{rows['receiver']['stored_bytes']} bytes (receiver) + {rows['sender']['stored_bytes']} (sender)"
    )
    assert 130 <= receiver["packets"] <= 160
    assert rows["receiver"]["stored_bytes"] < json_bytes / 2
