"""A passive study end to end: Debian's nginx, emulated users, ``iwprobe tap``, the collector.

Two user hosts (60 ms and 300 ms, loss-free) with 20 users each load pages from an unmodified
nginx for 40 s while the tap splits their /24s 50/50 between IW 3 and IW 10 (a campaign
created through the API, the configuration polled by the agent).  What must hold: no request
failed; the collector holds the aggregates of every connection the agent counted; the packets
show each arm's window (the first flight of a response larger than the window is the arm's IW,
seen from the server's side, not from its routes); latencies are at least a round trip, and on
the long path each response takes its own arm's slow-start round trips (IW 10's fewer than
IW 3's); regions come from the prefix map; no stored text holds a user's address.

The second test (``make test-faults``) stops the API for two minutes during a study: nothing may
be lost.
"""

from __future__ import annotations

import ipaddress
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from campaign_kit import query_rows, session_stack

pytest.importorskip("iwscope_lab.passive")
from iwscope.model import slow_start_rounds
from iwscope_lab.links import LinkSpec
from iwscope_lab.passive import LabPassive, PassivePlan
from iwscope_lab.topology import Host, Topology
from iwscope_lab.users import PopulationConfig

MSS = 1448
PATHS = {"near": ("region-near", 60.0), "far": ("region-far", 300.0)}


@pytest.fixture()
def passive_run(database_url: str, redis_url: str, api_server: Any, tmp_path: Path) -> Any:
    hosts = [Host("server", role="server", region="datacenter", link=LinkSpec.symmetric(rate_bps=1e9, rtt_ms=0))]
    hosts += [
        Host(
            name, role="users", region=region, users=20, link=LinkSpec.symmetric(rate_bps=20e6, rtt_ms=rtt, buffer_bytes=256_000)
        )
        for name, (region, rtt) in PATHS.items()
    ]
    stack = session_stack(database_url, redis_url, api_server, tmp_path / "stack")
    plan = PassivePlan(
        name="passive e2e",
        duration_s=25.0,
        flush_interval_s=5,
        lease_s=5.0,
        population=PopulationConfig(concurrent_users=8, think_time_s=1.0, mix={"h1": 0.5, "h1-tls": 0.25, "h2": 0.25}),
    )
    try:
        with Topology(hosts=hosts) as topology:
            study = LabPassive(topology, stack, plan, state_root=tmp_path / "lab")
            result = study.run(timeout_s=240)
            yield stack, topology, result
    finally:
        stack.close_sessions()


@pytest.mark.slow  # a 31 s lab rehearsal (make demo runs the passive study; the tap's parts: make test): make test-slow
def test_a_passive_study_measures_every_connection_with_its_arm(passive_run: Any) -> None:
    stack, topology, result = passive_run
    assert result.population["failures"] == 0, result.population
    seen = result.agent["connections_seen"] - result.agent["ambiguous"]
    assert seen > 200 and result.stored_connections == seen, (result.agent, result.stored_connections)
    records = query_rows(
        stack,
        "SELECT arm, arm_iw, region, response_latency_us, response_bytes, "
        "first_flight_segments, tcpi_min_rtt_us, syn_retrans, rwnd_limited, tls, "
        "client_prefix FROM passive_connections WHERE campaign_id = :c",
        c=result.campaign_id,
    )
    assert len(records) == result.stored_records == seen  # sample_share 1.0
    assert {record.arm for record in records} == {"3", "10"}
    assert {record.region for record in records} <= {region for region, _ in PATHS.values()}
    checked = {"3": 0, "10": 0}
    for record in records:
        if record.first_flight_segments is None or record.syn_retrans or record.rwnd_limited:
            continue
        if not record.tls and record.response_bytes and record.response_bytes > (record.arm_iw + 2) * MSS:
            assert record.first_flight_segments == record.arm_iw, record  # the arm's window, as sent
            checked[record.arm] += 1
        if record.response_latency_us is not None:
            assert record.response_latency_us >= 0.95 * record.tcpi_min_rtt_us, record
    assert min(checked.values()) >= 5, checked
    # IW 10 faster than IW 3 on the long path, response by response: the round trips of each
    # plain-HTTP first response the two windows would send differently (its latency over its own
    # min RTT) match its own arm's slow-start rounds, not the other arm's.  (The two arms' median
    # latencies over the dozen responses above 20 kB each had failed once in CI: one arm's few
    # users had fetched the larger objects.)
    matches = {"3": [], "10": []}
    for r in records:
        if r.region != "region-far" or r.tls or r.syn_retrans or r.rwnd_limited or r.first_flight_segments is None:
            continue
        if not r.response_latency_us or not r.tcpi_min_rtt_us or not r.response_bytes:
            continue
        own = slow_start_rounds(r.response_bytes, r.arm_iw, MSS)
        other = slow_start_rounds(r.response_bytes, 3 if r.arm_iw == 10 else 10, MSS)
        if own == other:  # a response within both windows: the arms cannot differ
            continue
        rounds = r.response_latency_us / r.tcpi_min_rtt_us
        matches[r.arm].append((r.response_bytes, round(rounds, 2), own, other))
    assert min(len(found) for found in matches.values()) >= 5, matches
    assert all(abs(rounds - own) < abs(rounds - other) for found in matches.values() for _, rounds, own, other in found), matches
    for record in records:
        assert len(record.client_prefix) == 16 and int(record.client_prefix, 16) >= 0
    users = {ipaddress.ip_address(address) for address in topology.user_addresses()}
    stored = query_rows(
        stack, "SELECT row_to_json(c)::text AS body FROM passive_connections c WHERE campaign_id = :c", c=result.campaign_id
    )
    text = " ".join(row.body for row in stored) + json.dumps(result.agent)
    assert not [address for address in users if str(address) in text]


#: The outage (the issue's two minutes), and the study's time before and after it.
DOWN_S = float(os.environ.get("IWSCOPE_FAULT_COLLECTOR_DOWN_S", "120"))
BEFORE_S = 20.0
AFTER_S = 40.0


@pytest.mark.faults
def test_collector_down_for_two_minutes_loses_no_connection(
    database_url: str, redis_url: str, api_server: Any, tmp_path: Path
) -> None:
    hosts = [Host("server", role="server", region="datacenter", link=LinkSpec.symmetric(rate_bps=1e9, rtt_ms=0))]
    hosts += [
        Host(name, role="users", region=name, users=20, link=LinkSpec.symmetric(rate_bps=20e6, rtt_ms=60))
        for name in ("u1", "u2")
    ]
    stack = session_stack(database_url, redis_url, api_server, tmp_path / "stack")
    plan = PassivePlan(
        name="passive outage",
        duration_s=BEFORE_S + DOWN_S + AFTER_S,
        flush_interval_s=5,
        population=PopulationConfig(concurrent_users=4, think_time_s=1.0, mix={"h1": 1.0}),
    )
    try:
        with Topology(hosts=hosts) as topology:
            study = LabPassive(topology, stack, plan, state_root=tmp_path / "lab")
            try:
                study.start()
                time.sleep(BEFORE_S)
                stored_before = study.stored()[0]
                api_server.stop()
                time.sleep(DOWN_S)
                api_server.start()
                result = study.finish(timeout_s=plan.duration_s + 300)
            finally:
                study.close()
            log = (study.state_dir / "tap.log").read_text()
    finally:
        stack.close_sessions()
    assert result.population["failures"] == 0, result.population
    seen = result.agent["connections_seen"] - result.agent["ambiguous"]
    print(
        f"collector down {DOWN_S:g} s: the agent saw {seen} connections ({stored_before} stored before the "
        f"outage), the collector holds {result.stored_connections} in {result.stored_aggregates} aggregate rows "
        f"and {result.stored_records} records"
    )
    assert seen > stored_before > 0
    assert "upload failed" in log  # the outage was felt
    assert result.stored_connections == seen, (result.agent, result.stored_connections)
    try:
        duplicates = query_rows(
            stack,
            "SELECT count(*) - count(DISTINCT record_id) AS n FROM passive_connections WHERE campaign_id = :c",
            c=result.campaign_id,
        )
    finally:
        # This query opened the stack's pool again: closed here, not left to the garbage
        # collector (a connection deleted open is an error in the next test's setup).
        stack.close_sessions()
    assert duplicates[0].n == 0 and result.stored_records == seen
