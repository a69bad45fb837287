"""A small offered-load campaign end to end: a real probe and origin in namespaces behind a
4 Mbit/s, 100 ms bottleneck with a one-BDP buffer, Poisson arrivals of short flows and a
background flow, through the API and the worker, read back with ``fairness()``."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from iwprobe import wire
from iwscope_lab.fairness import Bottleneck, PhaseResult, run_fairness
from iwscope_lab.stack import Stack

# A 40 s lab rehearsal of the fairness phases, which the cost experiments superseded: their lab run
# (tests/cost/test_cost_lab_e2e.py) covers the same pipeline in make test; this one runs in make test-slow.
pytestmark = pytest.mark.slow

BOTTLENECK = Bottleneck(rate_bps=4e6, rtt_ms=100.0)
LOAD = 0.6
FLOWS = 24


@pytest.fixture(scope="module")
def phases(
    database_url: str,
    redis_url: str,
    celery_worker: object,
    _api_server_process: object,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Stack, list[PhaseResult]]]:
    api = _api_server_process
    stack = Stack(
        database_url=database_url,
        redis_url=redis_url,
        api_port=api.port,  # type: ignore[attr-defined]
        dashboard_port=None,
        run_dir=tmp_path_factory.mktemp("fairlab"),
    )
    try:
        results = run_fairness(
            stack,
            bottleneck=BOTTLENECK,
            loads=(LOAD,),
            mixes=((3,), (10,)),
            flows=FLOWS,
            prefix="iwt",
            timeout_s=120,
            show_progress=False,
        )
        yield stack, results
    finally:
        stack.close_sessions()


def _trials(stack: Stack, campaign_id: int) -> list[object]:
    with stack.session() as session:
        return list(
            session.execute(
                text(
                    "SELECT url, role, arm_iw, object_size, started_at, total_us, error_kind, server_total_retrans, "
                    "server_bytes_retrans, server_bytes_sent, joined_at FROM trials WHERE campaign_id = :c "
                    "ORDER BY started_at"
                ),
                {"c": campaign_id},
            ).all()
        )


def test_every_flow_stored_and_joined(phases: tuple[Stack, list[PhaseResult]]) -> None:
    stack, results = phases
    for result in results:
        assert result.campaign.stored_per_probe == {"client": result.campaign.expected_per_probe}
        assert result.campaign.unjoined == 0
        rows = _trials(stack, result.campaign.campaign_id)
        roles = [wire.flow_role(row.url, row.role) for row in rows]
        assert roles.count("background") == 1 and roles.count("background-alone") == 1
        assert roles.count("short") == len(result.plan.sizes or ()) * len(result.mix)
        assert all(row.error_kind is None for row in rows)


def test_short_flows_arrive_as_a_poisson_process_and_overlap(phases: tuple[Stack, list[PhaseResult]]) -> None:
    stack, results = phases
    for result in results:
        short = [row for row in _trials(stack, result.campaign.campaign_id) if wire.flow_role(row.url, row.role) == "short"]
        starts = [row.started_at.timestamp() for row in short]
        gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        mean_gap = statistics.fmean(gaps)
        expected_gap = 1 / float(result.plan.arrival_rate_per_s or 1)
        # 23 exponential gaps: the sample mean is within a factor 2 of 1/lambda with overwhelming probability.
        assert expected_gap / 2 < mean_gap < expected_gap * 2, (mean_gap, expected_gap)
        # Exponential gaps have a coefficient of variation of 1; evenly spaced or sequential ones near 0.
        assert statistics.pstdev(gaps) / mean_gap > 0.5, gaps
        overlapping = sum(
            1
            for a, b in zip(short, short[1:], strict=False)
            if b.started_at.timestamp() < a.started_at.timestamp() + a.total_us / 1e6
        )
        assert overlapping >= 1, "no two short flows were ever in flight together"


def test_background_flow_pays_for_the_short_flows(phases: tuple[Stack, list[PhaseResult]]) -> None:
    _stack, results = phases
    for result in results:
        points = {(p["flow"], p["iw"]): p for p in result.points}
        alone, competing = points[("background-alone", 3)], points[("background", 3)]
        for point in (alone, competing):
            assert 0 < point["throughput_bps"] < BOTTLENECK.rate_bps * 1.02
            assert point["bytes_retrans_share"] is not None  # the origin's retransmissions are recorded
        # Sharing the bottleneck with short flows at offered load 0.6 costs the long flow throughput.
        assert competing["throughput_bps"] < 0.9 * alone["throughput_bps"], (competing, alone)
        short = points[("short", result.mix[0])]
        assert short["n"] == FLOWS and short["fct_mean_ms"] > BOTTLENECK.rtt_ms
        assert short["offered_load"] == pytest.approx(LOAD, rel=0.15)


DASHBOARD_SCRIPT = """
import importlib, json, sys
import dash
from iwscope.analysis import Filters
from iwscope_dashboard.app import create_app
from iwscope_dashboard.pagedata import cost_data
from iwscope_dashboard.pagekit import query
create_app(sys.argv[1], cache_seconds=0)
page = importlib.import_module(next(p for p in dash.page_registry.values() if p["path"] == "/cost")["module"])
report = query(cost_data, Filters(campaign_ids=tuple(json.loads(sys.argv[2]))))
figure = page.bulk_figure(report)
print(json.dumps([{"name": trace.name, "x": list(trace.x), "y": list(trace.y)} for trace in figure.data]))
"""


def test_dashboard_cost_page_draws_the_phases(phases: tuple[Stack, list[PhaseResult]], database_url: str) -> None:
    """The Cost page's bulk-flow figure (the former Fairness figure), built by the dashboard from
    the database with ``cost_data`` (own process: one app per process)."""
    _stack, results = phases
    ids = [result.campaign.campaign_id for result in results]
    answer = subprocess.run(
        [sys.executable, "-c", DASHBOARD_SCRIPT, database_url, json.dumps(ids)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    traces = {trace["name"]: trace for trace in json.loads(answer.stdout.strip().splitlines()[-1])}
    # One bulk flow per phase: its throughput is n too small (6 needed), so no bar is drawn for it.
    assert not {"background alone", "background with short flows"} & set(traces)
    assert {"short IW3 retrans", "short IW10 retrans"} <= set(traces)
    # Each single-IW phase has short flows of its own IW only, each bar a share of bytes.
    assert len(traces["short IW3 retrans"]["x"]) == 1 and len(traces["short IW10 retrans"]["x"]) == 1
    assert traces["short IW3 retrans"]["x"] != traces["short IW10 retrans"]["x"]
    assert all(0 <= value <= 100 for name in ("short IW3 retrans", "short IW10 retrans") for value in traces[name]["y"])


def test_public_api_serves_the_fairness_points(phases: tuple[Stack, list[PhaseResult]], _api_server_process: object) -> None:
    _stack, results = phases
    result = results[0]
    url = f"http://127.0.0.1:{_api_server_process.port}/api/v1/analysis/fairness"  # type: ignore[attr-defined]
    with urllib.request.urlopen(f"{url}?campaign={result.campaign.campaign_id}", timeout=30) as answer:
        data = json.load(answer)["data"]
    assert {(row["flow"], row["iw"]) for row in data} == {(p["flow"], p["iw"]) for p in result.points}
    assert all(row["campaign_id"] == result.campaign.campaign_id and row["mix"] == "3" for row in data)
