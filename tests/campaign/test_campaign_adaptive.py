"""A time-boxed, adaptive lab campaign end to end: real agents, API and worker.

Two probes: a quiet 20 ms path whose buckets reach the target precision within seconds, and
a lossy 300 ms path whose buckets cannot in the time box.  The quiet probe must stop early
(marked done, left out of its schedule, exits), the lossy one must measure until the box
closes, and every round must be paired (both arms, the same sizes).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from campaign_kit import path_hosts, query_rows, session_stack

from iwscope.campaigns.precision import update_done
from iwscope_lab.campaign import CampaignPlan, LabCampaign
from iwscope_lab.topology import Topology

PATHS = {"quiet": ("europe", 20.0, 10e6, 0.0), "lossy": ("africa", 300.0, 1e6, 0.04)}
DURATION_S = 25.0
PLAN = CampaignPlan(
    name="adaptive-e2e", arms=(3, 10), sizes=(9_000, 30_000), repetitions=10_000, duration_s=DURATION_S, target_ci_ms=10.0
)


@pytest.fixture(scope="module")
def campaign(
    database_url: str,
    redis_url: str,
    celery_worker: object,
    _api_server_process: object,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, object]]:
    api = _api_server_process
    stack = session_stack(database_url, redis_url, api, tmp_path_factory.mktemp("lab"))
    hosts = path_hosts(PATHS)
    stop = threading.Event()

    def precision_checks() -> None:  # what beat does every IWSCOPE_PRECISION_CHECK_S, faster
        while not stop.wait(2.0):
            with stack.session() as session:
                update_done(session)

    checker = threading.Thread(target=precision_checks, daemon=True)
    checker.start()
    try:
        with Topology(f"iwt{secrets.token_hex(3)}", hosts) as topology:
            result = LabCampaign(topology, stack, PLAN).run(timeout_s=DURATION_S + 120, show_progress=False)
    finally:
        stop.set()
        checker.join(timeout=30)
    yield {"result": result, "stack": stack}
    stack.close_sessions()


@pytest.mark.slow  # a 31 s lab rehearsal (make demo's benefit campaign is adaptive too): make test-slow
def test_the_quiet_probe_stops_early_and_the_lossy_one_runs_to_the_end(campaign: dict[str, object]) -> None:
    result = campaign["result"]
    stack = campaign["stack"]
    assert all(code == 0 for code in result.probe_exit_codes.values()), result.probe_exit_codes
    done = {
        str(row.probe_id)
        for row in query_rows(stack, "SELECT probe_id FROM campaign_probe_done WHERE campaign_id = :c", c=result.campaign_id)
    }
    assert done == {result.probe_ids["quiet"]}
    (window,) = query_rows(stack, "SELECT starts_at, ends_at, target_ci_ms FROM campaigns WHERE id = :c", c=result.campaign_id)
    assert (window.ends_at - window.starts_at).total_seconds() == pytest.approx(DURATION_S + 5)  # kept at close
    assert window.target_ci_ms == 10.0
    last = {
        str(row.probe_id): row.last
        for row in query_rows(
            stack, "SELECT probe_id, max(started_at) AS last FROM trials WHERE campaign_id = :c GROUP BY 1", c=result.campaign_id
        )
    }
    quiet_left = (window.ends_at - last[result.probe_ids["quiet"]]).total_seconds()
    lossy_left = (window.ends_at - last[result.probe_ids["lossy"]]).total_seconds()
    assert quiet_left > 10.0, quiet_left  # stopped well before the box closed
    assert lossy_left < 10.0, lossy_left  # kept measuring (its last round started in the last seconds)
    assert result.stored_per_probe["quiet"] >= 40  # >= 20 pairs per size octave... made in a few seconds


@pytest.mark.slow  # a 31 s lab rehearsal (make demo's benefit campaign is adaptive too): make test-slow
def test_every_round_is_paired(campaign: dict[str, object]) -> None:
    result = campaign["result"]
    rows = query_rows(
        campaign["stack"],
        """
        SELECT probe_id, round, array_agg(DISTINCT arm_iw ORDER BY arm_iw) AS arms,
               count(*) FILTER (WHERE arm_iw = 3) AS n3, count(*) FILTER (WHERE arm_iw = 10) AS n10,
               array_agg(DISTINCT object_size ORDER BY object_size) AS sizes
        FROM trials WHERE campaign_id = :c GROUP BY 1, 2""",
        c=result.campaign_id,
    )
    assert rows
    for row in rows:
        assert row.arms == [3, 10] and row.n3 == row.n10 == len(PLAN.sizes or ()), row
        assert row.sizes == sorted(PLAN.sizes or ()), row


def test_beat_runs_the_precision_check(service_env: dict[str, str]) -> None:
    # In a process of its own: importing the Celery app patches kombu (iwscope.broker), which the
    # test process's own Celery clients must not see.
    script = (
        "import json; from iwscope.worker import celery_app as app; "
        "print(json.dumps([app.conf.beat_schedule['update-precision'], app.conf.include]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**service_env, "IWSCOPE_PRECISION_CHECK_S": "7"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    entry, include = json.loads(done.stdout)
    assert entry["task"] == "iwscope.campaigns.tasks.update_precision" and entry["schedule"] == 7.0
    assert "iwscope.campaigns.tasks" in include
