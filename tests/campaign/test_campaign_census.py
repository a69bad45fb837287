"""A census campaign end to end: web servers nobody here wrote (Python's http.server and Debian's
lighttpd) at initcwnd 4, 10, 16 and 32, each on its own lab host; real ``iwprobe run`` agents in
two regions, the API, the worker; the records, ``/api/v1/analysis/census`` and the trials'
client-side inference of an ordinary campaign checked against the configured windows."""

from __future__ import annotations

import datetime as dt
import pathlib
import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from campaign_kit import path_hosts, query_rows, session_stack

from iwscope.exports.bundle import verify
from iwscope_lab.campaign import CampaignPlan, LabCampaign
from iwscope_lab.census import LabCensus, census_plan
from iwscope_lab.demo import DemoResult, proof_lines
from iwscope_lab.links import LinkSpec
from iwscope_lab.reproduce import write_run_bundle
from iwscope_lab.topology import Host, Topology

#: Web host -> (server, initcwnd).
WEBS = {"web4": ("http.server", 4), "web10": ("lighttpd", 10), "web16": ("http.server", 16), "web32": ("lighttpd", 32)}
PROBES = {"probe-eu": ("lab-eu", 40.0, 50e6, 0.0), "probe-as": ("lab-as", 120.0, 20e6, 0.0)}
ROUNDS = 2


@pytest.fixture(scope="module")
def census(
    database_url: str,
    redis_url: str,
    celery_worker: object,
    _api_server_process: object,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    stack = session_stack(database_url, redis_url, _api_server_process, tmp_path_factory.mktemp("census"))
    started = dt.datetime.now(dt.UTC)
    hosts = [
        Host(
            name,
            role="web",
            region="lab",
            link=LinkSpec.symmetric(rate_bps=1e9, rtt_ms=0),
            labels={"server": server, "iw": str(iw)},
        )
        for name, (server, iw) in WEBS.items()
    ]
    hosts += [host for host in path_hosts(PROBES) if host.role == "probe"]
    with Topology(f"iwt{secrets.token_hex(3)}", hosts) as topology:
        result = LabCensus(topology, stack, census_plan("census-lab", rounds=ROUNDS)).run(timeout_s=240, show_progress=False)
    yield {"result": result, "stack": stack, "started": started}
    stack.close_sessions()


def test_every_record_names_the_configured_window(census: dict[str, Any]) -> None:
    result, stack = census["result"], census["stack"]
    assert result.records_per_probe == {name: ROUNDS * len(WEBS) for name in PROBES}
    assert all(code == 0 for code in result.probe_exit_codes.values()), result.probe_exit_codes
    configured = dict(result.targets.values())
    rows = query_rows(
        stack,
        "SELECT url, status, iw_segments, mss, reason, connections_ok, family, http_status "
        "FROM census_records WHERE campaign_id = :c",
        c=result.campaign_id,
    )
    assert len(rows) == len(PROBES) * ROUNDS * len(WEBS)
    for row in rows:
        assert (row.status, row.iw_segments) == ("ok", configured[row.url]), row
        assert row.connections_ok >= 1 and row.family == "ipv4" and row.http_status in (200, 206), row


def test_the_census_analysis_names_each_servers_window_per_region(census: dict[str, Any]) -> None:
    result, stack = census["result"], census["stack"]
    answer = httpx.get(f"{stack.local_api_url}/api/v1/analysis/census?campaign={result.campaign_id}", timeout=30)
    assert answer.status_code == 200, answer.text
    targets = {target["url"]: target for target in answer.json()["data"]}
    assert set(targets) == {url for url, _ in result.targets.values()}
    for url, iw in result.targets.values():
        overall = targets[url]["overall"]
        assert (overall["iw_segments"], overall["share"], overall["records"]) == (iw, 1.0, len(PROBES) * ROUNDS)
        assert overall["share_ci_low"] < 1.0  # four records: the interval says how little that is
        # two records per region: n too small there, the window proved still shown
        for region in ("lab-eu", "lab-as"):
            cell = targets[url]["by_region"][region]
            assert cell["too_small"] and cell["iw_segments"] is None and cell["max_lower_bound"] == iw


@pytest.fixture(scope="module")
def checked(
    database_url: str,
    redis_url: str,
    celery_worker: object,
    _api_server_process: object,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """An ordinary campaign of arms 3, 10 and 32 on one 60 ms path (100 KB objects)."""
    stack = session_stack(database_url, redis_url, _api_server_process, tmp_path_factory.mktemp("check"))
    try:
        with Topology(f"iwt{secrets.token_hex(3)}", path_hosts({"probe1": ("lab-eu", 60.0, 50e6, 0.0)})) as topology:
            result = LabCampaign(topology, stack, CHECK_PLAN).run(timeout_s=180, show_progress=False)
        yield {"result": result, "stack": stack}
    finally:
        stack.close_sessions()


CHECK_PLAN = CampaignPlan(name="client-check", arms=(3, 10, 32), sizes=(100_000,), repetitions=2, calibrate=False)


def test_trials_carry_the_windows_their_probe_saw(checked: dict[str, Any]) -> None:
    """Every trial's client-side inference is its arm (the objects outlast the windows),
    independent of the origin's own TCP_INFO; the check finds no proxy.

    A busy box may stall the sender or the emulator mid-flight; the inference then says only
    "at least" (``lower_bound``, reason ``bottleneck`` or ``paused``) -- never a wrong window.
    Such a trial must still bound its arm exactly, and every arm needs a determined one (a
    clean-clone CI run saw one IW32 trial of six as ``lower_bound 32``)."""
    result, stack = checked["result"], checked["stack"]
    rows = query_rows(
        stack,
        "SELECT arm_iw, client_iw_status, client_iw_segments, client_iw_mss, client_iw_reason, "
        "server_snd_cwnd_at_accept FROM trials WHERE campaign_id = :c",
        c=result.campaign_id,
    )
    assert len(rows) == len(CHECK_PLAN.arms) * CHECK_PLAN.repetitions
    for row in rows:
        assert row.client_iw_segments == row.arm_iw, row
        assert row.client_iw_status == "ok" or (
            row.client_iw_status == "lower_bound" and row.client_iw_reason in ("bottleneck", "paused")
        ), row
        assert row.server_snd_cwnd_at_accept == row.arm_iw and row.client_iw_mss == 1448
    assert {row.arm_iw for row in rows if row.client_iw_status == "ok"} == set(CHECK_PLAN.arms), rows
    checks = httpx.get(f"{stack.local_api_url}/api/v1/analysis/iw-check?campaign={result.campaign_id}", timeout=30).json()["data"]
    assert [(check["agree"], check["disagree"], check["suspect"]) for check in checks] == [(6, 0, False)]


def test_the_demo_summary_reports_the_check_and_the_census(census: dict[str, Any], checked: dict[str, Any]) -> None:
    lines = proof_lines(checked["stack"], DemoResult(benefit=checked["result"], census=census["result"]))
    assert lines[0].startswith("client-side IW check: 6 trials inferred on 1 paths") and "6 agree" in lines[0]
    assert "no proxy or cache suspected" in lines[0]
    by_host = {line.split()[1]: line for line in lines[1:]}
    assert set(by_host) == set(WEBS)
    for host, (server, iw) in WEBS.items():
        assert f"({server}, initcwnd {iw}): IW {iw} in 100% of 4 determined records" in by_host[host], by_host[host]


def test_a_lab_run_leaves_a_bundle_of_its_campaigns(
    census: dict[str, Any], checked: dict[str, Any], tmp_path: pathlib.Path
) -> None:
    """What ``iwscope lab reproduce`` writes beside its report: every campaign made since the
    run started, as Parquet, with the files the run wrote listed and hashed."""
    (tmp_path / "summary.json").write_text("{}")
    manifest = write_run_bundle(census["stack"], tmp_path, census["started"])
    assert manifest is not None
    assert manifest["campaign_ids"] == sorted([census["result"].campaign_id, checked["result"].campaign_id])
    assert manifest["rows"]["census"] == len(PROBES) * ROUNDS * len(WEBS)
    assert manifest["rows"]["trials"] == len(CHECK_PLAN.arms) * CHECK_PLAN.repetitions
    assert "summary.json" in manifest["files"] and verify(tmp_path) == []
    census_rows = pq.read_table(tmp_path / "data" / "census.parquet").to_pylist()
    assert {(row["url"], row["iw_segments"]) for row in census_rows} == set(census["result"].targets.values())
