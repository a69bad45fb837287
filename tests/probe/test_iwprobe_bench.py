"""Cost and agreement numbers for the closing note (run with ``IWPROBE_BENCH=1``).

* probe CPU per 1,000 trials and peak RSS, from ``wait4`` rusage of a real
  ``iwprobe run --once`` doing 1,008 trials against a real origin and collector;
* the gap between the probe's and the origin's timing of the same trial, on an emulated
  50 ms / 20 Mbit/s lab path: probe (total - dns - connect) minus origin response latency.
  Both measure "request sent/read -> last byte delivered/acknowledged"; they differ by the
  asymmetry of the two one-way legs and by timer noise.

Results are printed and written to ``artifacts/probe-bench.json``.
"""

from __future__ import annotations

import json
import os
import secrets
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from iwprobe_testkit import FleetNet
from test_iwprobe_collector_e2e import ARMS, Agents, _create_campaign, _query

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("IWPROBE_BENCH") != "1", reason="benchmark: run with IWPROBE_BENCH=1 (numbers for the closing note)"
    ),
]
RESULTS = Path(__file__).resolve().parents[2] / "artifacts" / "probe-bench.json"


def _save(key: str, value: dict[str, Any]) -> None:
    RESULTS.parent.mkdir(exist_ok=True)
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[key] = value
    RESULTS.write_text(json.dumps(data, indent=2))
    print(key, json.dumps(value))


@pytest.fixture()
def bench_agents(fleet_net: FleetNet, api_server: Any, enroll_token: str, origin_token: str, tmp_path: Path) -> Iterator[Agents]:
    fleet = Agents(fleet_net, api_server.port, tmp_path, f"r{os.urandom(3).hex()}")
    fleet.enroll(enroll_token, origin_token)
    fleet.start_origin()
    try:
        yield fleet
    finally:
        fleet.stop()


def test_probe_cpu_and_memory_per_1000_trials(bench_agents: Agents, api_server: Any, admin_token: str, database_url: str) -> None:
    sizes = [1000, 9000, 30000, 100000]
    rounds = 63  # 63 x 4 arms x 4 sizes = 1,008 trials
    campaign = _create_campaign(
        api_server.url,
        admin_token,
        bench_agents.origin_id,
        probe_regions=[bench_agents.region],
        repetitions=rounds,
        sizes=sizes,
        calibrate=False,
    )
    started = time.monotonic()
    process = bench_agents.probe_run("--trial-gap", "0", "--upload-timeout", "120", "--campaign", str(campaign))
    # ru_maxrss of a forked child counts the parent's (pytest's) pages shared before exec,
    # so the probe's own peak is read from /proc (VmHWM only grows) until it exits.
    peak_kb = 0
    while True:
        try:
            status_text = Path(f"/proc/{process.pid}/status").read_text()
        except OSError:
            break
        hwm = [int(line.split()[1]) for line in status_text.splitlines() if line.startswith("VmHWM")]
        if not hwm:
            break  # a zombie: exited
        peak_kb = max(peak_kb, hwm[0])
        time.sleep(0.1)
    _, status, usage = os.wait4(process.pid, 0)  # ip netns exec execs python: this is the probe
    process.returncode = os.waitstatus_to_exitcode(status)
    wall_s = time.monotonic() - started
    assert process.returncode == 0, bench_agents.log()
    trials = rounds * len(ARMS) * len(sizes)
    stored = _query(database_url, "SELECT count(*) FROM trials WHERE campaign_id = %s", campaign)[0][0]
    assert stored == trials
    cpu_s = usage.ru_utime + usage.ru_stime
    result = {
        "trials": trials,
        "wall_s": round(wall_s, 1),
        "cpu_s": round(cpu_s, 2),
        "cpu_s_per_1000_trials": round(cpu_s * 1000 / trials, 2),
        "peak_rss_mb": round(peak_kb / 1024, 1),
    }
    _save("probe_cost", result)
    assert 0 < result["peak_rss_mb"] < 100 and result["cpu_s_per_1000_trials"] < 60


def test_probe_and_origin_agree_on_the_same_trial(
    api_server: Any, enroll_token: str, origin_token: str, admin_token: str, database_url: str, tmp_path: Path
) -> None:
    topology = pytest.importorskip("iwscope_lab.topology")
    from test_iwprobe_lab_e2e import LabFleet, _campaign

    topo = topology.Topology(
        f"iwt{secrets.token_hex(3)}",
        hosts=[
            topology.Host("origin", role="origin", link=topology.LinkSpec.symmetric(rate_bps=1_000_000_000, rtt_ms=0)),
            topology.Host("probe", role="probe", region="lab", link=topology.LinkSpec.symmetric(rate_bps=20_000_000, rtt_ms=50)),
        ],
    )
    with topo:
        fleet = LabFleet(topo, api_server.port, tmp_path, [3, 10])
        try:
            origin_id, _ = fleet.start(enroll_token, origin_token)
            campaign = _campaign(
                api_server.url, admin_token, origin_id, fleet.region, size_dist="websearch", sizes_per_round=10, repetitions=10
            )
            fleet.run_probe(campaign, timeout_s=300)
            deadline = time.monotonic() + 60
            while True:
                with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://", 1)) as connection:
                    rows = connection.execute(
                        "SELECT t.total_us - coalesce(t.dns_us, 0) - t.connect_us, o.response_latency_us, "
                        "t.object_size, t.ttfb_us, o.first_byte_us, t.connect_us "
                        "FROM trials t JOIN origin_observations o USING (trial_id) "
                        "WHERE t.campaign_id = %s AND t.error_kind IS NULL",
                        (campaign,),
                    ).fetchall()
                if len(rows) >= 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        finally:
            fleet.stop()
    assert len(rows) == 200
    gaps_ms = sorted((row[0] - row[1]) / 1000 for row in rows)
    worst = sorted(rows, key=lambda row: abs(row[0] - row[1]))[-5:]
    print("largest gaps (probe_us, origin_us, size, ttfb_us, origin_first_byte_us, connect_us):", worst)
    absolute = sorted(abs(gap) for gap in gaps_ms)
    result = {
        "path": "50 ms RTT, 20 Mbit/s (lab emulator)",
        "trials": len(rows),
        "gap_median_ms": round(statistics.median(gaps_ms), 3),
        "abs_gap_median_ms": round(statistics.median(absolute), 3),
        "abs_gap_p90_ms": round(absolute[int(0.9 * len(absolute)) - 1], 3),
        "abs_gap_max_ms": round(absolute[-1], 3),
    }
    _save("probe_origin_gap", result)
    assert result["abs_gap_median_ms"] < 5.0
