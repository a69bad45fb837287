"""The agent against the real collector (API process, PostgreSQL, Celery worker).

Origin and probe run in their own network namespaces (``iwt*``) and reach the collector
through a veth into the root namespace.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sqlite3
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from iwprobe_testkit import PYTHON, FleetNet, wait_for_port
from testenv import libpq_url

IWPROBE = [PYTHON, "-m", "iwprobe", "--log-level", "INFO"]
ARMS = [3, 10, 16, 32]
BASE_PORT = 8300


def _query(database_url: str, sql: str, *params: Any) -> list[tuple]:
    with psycopg.connect(libpq_url(database_url)) as connection:
        return connection.execute(sql, params).fetchall()


def _create_campaign(api_url: str, admin_token: str, origin_id: str, **fields: Any) -> int:
    body: dict[str, Any] = {
        "name": f"probe-test-{os.urandom(3).hex()}",
        "origin_ids": [origin_id],
        "arms": ARMS,
        "sizes": [3000, 9000],
        "repetitions": 1,
        "interval_s": 0.0,
        "starts_at": (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)).isoformat(),
        "calibrate": True,
    }
    body.update(fields)
    answer = httpx.post(f"{api_url}/api/v1/campaigns", json=body, headers={"Authorization": f"Bearer {admin_token}"}, timeout=30)
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


class Agents:
    """Origin and probe processes of one test, with their state directories."""

    def __init__(self, net: FleetNet, api_port: int, tmp: Path, region: str) -> None:
        self.net = net
        self.api_port = api_port
        self.origin_state = tmp / "origin-state"
        self.probe_state = tmp / "probe-state"
        self.region = region
        self.origin: subprocess.Popen | None = None
        self.probes: list[subprocess.Popen] = []
        self.origin_id = ""
        self.probe_id = ""
        self.logs = tmp

    def enroll(self, enroll_token: str, origin_token: str) -> None:
        origin_enroll = self.net.run(
            self.net.origin_ns,
            [
                *IWPROBE,
                "origin",
                "enroll",
                "--state-dir",
                str(self.origin_state),
                "--collector",
                self.net.collector_url(self.net.origin_ns, self.api_port),
                "--token",
                origin_token,
                "--name",
                "origin-test",
                "--region",
                "lab",
                "--host",
                self.net.origin_address,
                "--arms",
                ",".join(map(str, ARMS)),
                "--base-port",
                str(BASE_PORT),
            ],
        )
        assert origin_enroll.returncode == 0, origin_enroll.stderr
        self.origin_id = json.loads((self.origin_state / "origin.json").read_text())["id"]
        probe_enroll = self.net.run(
            self.net.probe_ns,
            [
                *IWPROBE,
                "enroll",
                "--state-dir",
                str(self.probe_state),
                "--collector",
                self.net.collector_url(self.net.probe_ns, self.api_port),
                "--token",
                enroll_token,
                "--name",
                "probe-test",
                "--region",
                self.region,
                "--country",
                "ZA",
                "--label",
                "access=lab",
            ],
        )
        assert probe_enroll.returncode == 0, probe_enroll.stderr
        self.probe_id = json.loads((self.probe_state / "probe.json").read_text())["id"]

    def start_origin(self) -> None:
        with open(self.logs / "origin.log", "ab") as log:
            self.origin = self.net.popen(
                self.net.origin_ns,
                [
                    *IWPROBE,
                    "origin",
                    "serve",
                    "--setup-routes",
                    "--state-dir",
                    str(self.origin_state),
                    "--arms",
                    ",".join(map(str, ARMS)),
                    "--base-port",
                    str(BASE_PORT),
                    "--bind",
                    self.net.origin_address,
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        wait_for_port(self.net, self.net.probe_ns, self.net.origin_address, BASE_PORT + ARMS[-1])

    def probe_run(self, *extra: str) -> subprocess.Popen:
        with open(self.logs / "probe.log", "ab") as log:
            probe = self.net.popen(
                self.net.probe_ns,
                [
                    *IWPROBE,
                    "run",
                    "--once",
                    "--state-dir",
                    str(self.probe_state),
                    "--backoff-cap",
                    "2",
                    "--calibration-bytes",
                    "300000",
                    *extra,
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        self.probes.append(probe)
        return probe

    def stop(self) -> None:
        """Stop every agent this test started, also when it failed half-way (no process outlives it)."""
        for process in [*self.probes, self.origin]:
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

    def log(self) -> str:
        return "\n".join(
            f"--- {name}\n" + (self.logs / name).read_text(errors="replace")[-4000:]
            for name in ("origin.log", "probe.log")
            if (self.logs / name).exists()
        )


@pytest.fixture()
def agents(fleet_net: FleetNet, api_server: Any, enroll_token: str, origin_token: str, tmp_path: Path) -> Iterator[Agents]:
    region = f"r{os.urandom(3).hex()}"  # only this test's campaigns reach this probe
    fleet = Agents(fleet_net, api_server.port, tmp_path, region)
    fleet.enroll(enroll_token, origin_token)
    fleet.start_origin()
    try:
        yield fleet
    finally:
        fleet.stop()


def _wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            print(f"waited {time.monotonic() - deadline + timeout_s:.1f} s for {what}", flush=True)
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_credentials_are_private_and_bad_tokens_are_refused(fleet_net: FleetNet, api_server: Any, tmp_path: Path) -> None:
    state = tmp_path / "state"
    refused = fleet_net.run(
        fleet_net.probe_ns,
        [
            *IWPROBE,
            "enroll",
            "--state-dir",
            str(state),
            "--token",
            "wrong",
            "--collector",
            fleet_net.collector_url(fleet_net.probe_ns, api_server.port),
            "--name",
            "x",
            "--region",
            "y",
        ],
    )
    assert refused.returncode == 2 and "HTTP 401" in refused.stderr
    assert not (state / "probe.json").exists()
    not_enrolled = fleet_net.run(fleet_net.probe_ns, [*IWPROBE, "run", "--once", "--state-dir", str(state)])
    assert not_enrolled.returncode != 0 and "not enrolled" in not_enrolled.stderr


def test_campaign_round_trip(agents: Agents, api_server: Any, admin_token: str, database_url: str, celery_worker: Any) -> None:
    assert stat.S_IMODE((agents.probe_state / "probe.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((agents.origin_state / "origin.json").stat().st_mode) == 0o600
    campaign = _create_campaign(api_server.url, admin_token, agents.origin_id, probe_regions=[agents.region], repetitions=2)
    started = time.monotonic()
    probe = agents.probe_run("--upload-timeout", "60", "--campaign", str(campaign))
    assert probe.wait(timeout=180) == 0, agents.log()
    print(f"probe ran {time.monotonic() - started:.1f} s", flush=True)
    expected = 2 * len(ARMS) * 2  # rounds x arms x sizes
    rows = _query(
        database_url,
        "SELECT round, arm_iw, object_size, error_kind, total_us FROM trials WHERE campaign_id = %s AND probe_id = %s",
        campaign,
        agents.probe_id,
    )
    assert len(rows) == expected, agents.log()
    assert sorted((r[0], r[1], r[2]) for r in rows) == sorted(
        (round_, iw, size) for round_ in (0, 1) for iw in ARMS for size in (3000, 9000)
    )
    assert all(r[3] is None and r[4] > 0 for r in rows)
    samples = _query(
        database_url, "SELECT min_rtt_us, bottleneck_bps, transfer_bytes FROM path_samples WHERE probe_id = %s", agents.probe_id
    )
    # Calibration starts at 300 kB and grows 4x while the transfer is too short to leave
    # slow start (on a veth it is: the rate is tens of Gbit/s); it stays within 16 MiB.
    assert len(samples) == 1 and samples[0][0] > 0 and 300000 <= samples[0][2] <= 16 * 1024 * 1024
    # A rate measured from that transfer: on a veth tens of Gbit/s when the box is idle, 89 Mbit/s
    # in a clean-clone CI run on a busy one -- so a floor that only a broken calibration misses.
    assert samples[0][1] is not None and samples[0][1] > 10e6
    # The origin uploads its observations on its own; each arm started with its IW.
    _wait_for(
        lambda: (
            _query(
                database_url,
                "SELECT count(*) FROM origin_observations o JOIN trials t USING (trial_id) WHERE t.campaign_id = %s",
                campaign,
            )[0][0]
            == expected
        ),
        60,
        "observations",
    )
    observed = _query(
        database_url,
        "SELECT o.arm_iw, o.snd_cwnd_at_accept, o.cwnd_mismatch, o.response_latency_us "
        "FROM origin_observations o JOIN trials t USING (trial_id) WHERE t.campaign_id = %s",
        campaign,
    )
    assert all(iw == cwnd and not mismatch and latency > 0 for iw, cwnd, mismatch, latency in observed)
    assert {row[0] for row in observed} == set(ARMS)
    # The worker joins the server side into the trials.
    _wait_for(
        lambda: (
            _query(
                database_url,
                "SELECT count(*) FROM trials WHERE campaign_id = %s AND joined_at IS NOT NULL "
                "AND server_snd_cwnd_at_accept = arm_iw",
                campaign,
            )[0][0]
            == expected
        ),
        60,
        "join",
    )
    heartbeat = _query(database_url, "SELECT last_heartbeat FROM probes WHERE id = %s", agents.probe_id)[0][0]
    assert heartbeat["trials_measured"] == expected and heartbeat["spool_backlog"] == 0
    # Campaigns of other tests in the same database (every probe, no region filter) were
    # skipped thanks to --campaign: this probe measured nothing else.
    assert _query(database_url, "SELECT count(*) FROM trials WHERE probe_id = %s", agents.probe_id)[0][0] == expected


def test_spool_survives_outage_and_sigkill(agents: Agents, api_server: Any, admin_token: str, database_url: str) -> None:
    """Collector stopped mid-run, probe SIGKILLed and restarted, collector back: every trial exactly once."""
    rounds = 6
    sizes = [2000, 12000]
    campaign = _create_campaign(
        api_server.url,
        admin_token,
        agents.origin_id,
        probe_regions=[agents.region],
        repetitions=rounds,
        interval_s=0.5,
        sizes=sizes,
        calibrate=False,
    )
    spool_path = agents.probe_state / "probe-spool.sqlite"

    def stored() -> int:
        if not spool_path.exists():
            return 0
        try:
            with sqlite3.connect(f"file:{spool_path}?mode=ro", uri=True, timeout=5) as connection:
                row = connection.execute("SELECT value FROM counters WHERE name = 'stored_trial'").fetchone()
        except sqlite3.OperationalError as error:  # the file exists a moment before its schema does
            if "no such table" in str(error):
                return 0
            raise
        return int(row[0]) if row else 0

    probe = agents.probe_run("--campaign", str(campaign))
    per_round = len(ARMS) * len(sizes)
    _wait_for(lambda: stored() >= per_round, 60, "the first round")
    api_server.stop()  # the collector goes away while the probe measures
    before_kill = stored()
    _wait_for(lambda: stored() >= before_kill + per_round + 3, 60, "trials measured while the collector is down")
    os.kill(probe.pid, signal.SIGKILL)  # ip netns exec execs python: this is the probe itself
    probe.wait(timeout=10)
    killed_at = stored()
    assert killed_at < rounds * per_round, "the probe finished before it could be killed; make the campaign longer"
    restarted = agents.probe_run("--campaign", str(campaign))
    time.sleep(3.0)  # measuring on with the collector still down
    api_server.start()
    assert restarted.wait(timeout=180) == 0, agents.log()
    rows = _query(database_url, "SELECT trial_id, round, arm_iw, object_size FROM trials WHERE campaign_id = %s", campaign)
    assert len(rows) == rounds * per_round, agents.log()
    assert len({row[0] for row in rows}) == len(rows)
    assert sorted((r[1], r[2], r[3]) for r in rows) == sorted(
        (round_, iw, size) for round_ in range(rounds) for iw in ARMS for size in sizes
    )
    with sqlite3.connect(f"file:{spool_path}?mode=ro", uri=True) as connection:
        assert connection.execute("SELECT count(*) FROM records").fetchone()[0] == 0
        assert connection.execute("SELECT count(*) FROM rejected").fetchone()[0] == 0
    log = (agents.logs / "probe.log").read_text()
    assert "resuming campaign" in log or killed_at % per_round == 0
    assert "upload failed" in log  # it did meet the outage and retried


def test_refused_records_are_isolated_and_the_rest_uploaded(
    api_server: Any, enroll_token: str, database_url: str, tmp_path: Path
) -> None:
    """A 422 stores nothing: the uploader bisects, keeps the bad record aside, uploads the rest."""
    from iwprobe import wire
    from iwprobe._agent import enroll_probe
    from iwprobe._fetch import FetchResult
    from iwprobe._spool import Spool
    from iwprobe._upload import Uploader

    credentials, _ = enroll_probe(
        api_server.url, enroll_token, wire.EnrollRequest(name="uploader-test", region="x"), str(tmp_path)
    )
    spool = Spool(str(tmp_path / "spool.sqlite"))
    good_ids = []
    for index in range(9):
        trial = FetchResult(
            url="http://192.0.2.1:8010/obj/9000",
            started_at=wire.utc_timestamp(),
            dns_us=0,
            connect_us=1000,
            ttfb_us=2000,
            total_us=5000,
            bytes_received=9100,
            body_bytes=9000,
            http_status=200,
        ).to_trial(wire.new_id(), credentials.id, None, None, 0, 10, 9000)
        if index == 4:
            trial.arm_iw = 0  # outside 1..1000: the collector refuses it
            bad_id = trial.trial_id
        else:
            good_ids.append(trial.trial_id)
        spool.add("trial", trial.trial_id, wire.to_dict(trial))
    uploader = Uploader(spool, credentials.client(), "probe", credentials.id)
    assert uploader.drain(deadline=time.monotonic() + 60)
    assert spool.backlog() == 0 and spool.rejected_count() == 1
    stored = {str(row[0]) for row in _query(database_url, "SELECT trial_id FROM trials WHERE probe_id = %s", credentials.id)}
    assert stored == set(good_ids) and bad_id not in stored
    # Resending what the collector already has is harmless: it answers with duplicates.
    for trial_id in good_ids[:2]:
        spool.add("trial", trial_id, {**_query_trial_stub(credentials.id, trial_id)})
    assert uploader.drain(deadline=time.monotonic() + 60) and spool.backlog() == 0
    assert len(_query(database_url, "SELECT trial_id FROM trials WHERE probe_id = %s", credentials.id)) == 8
    spool.close()


def _query_trial_stub(probe_id: str, trial_id: str) -> dict[str, Any]:
    from iwprobe import wire

    return wire.to_dict(
        wire.TrialRecord(
            trial_id=trial_id,
            probe_id=probe_id,
            campaign_id=None,
            origin_id=None,
            round=0,
            arm_iw=10,
            object_size=9000,
            url="http://192.0.2.1:8010/obj/9000",
            started_at=wire.utc_timestamp(),
            dns_us=0,
            connect_us=1000,
            ttfb_us=2000,
            total_us=5000,
            bytes_received=9100,
            http_status=200,
            error_kind=None,
            error_detail=None,
            syn_retrans=0,
        )
    )
