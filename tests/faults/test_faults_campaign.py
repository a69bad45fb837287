"""Faults during a lab campaign lose nothing and duplicate nothing (docs/reliability.md, "Faults").

Every case runs a real campaign (one origin, three probes behind the link emulator, the
real API, Celery worker and beat on a throwaway PostgreSQL cluster and Redis server) and,
once every probe has measured a quarter of its trials, injects one fault (or all of them
at once), holds it, and repairs it.  Afterwards it compares the agents' own journals (see
``faults_ledger``) with the database: every measured trial stored exactly once, every
recorded origin observation stored and joined, the incremental roll-ups equal to a
rebuild from the raw rows.  One row per fault goes to ``artifacts/faults.json``.

``IWSCOPE_FAULT_LINK_CUT_S`` (default 120, the issue's two minutes) is how long a probe's
link drops everything; ``IWSCOPE_FAULT_HOLD_S`` (default 5) how long a killed process stays
down; ``IWSCOPE_FAULT_REPETITIONS`` (default 40) the campaign's rounds.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pathlib
import secrets
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from faults_ledger import ORIGIN_SPOOL, PROBE_SPOOL, install_journal, journal
from faults_services import ThrowawayPostgres, ThrowawayRedis, free_port
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from iwscope.analysis.rollups import rebuild_rollups, refresh_rollups, rollup_snapshot
from iwscope_lab.campaign import CampaignPlan, LabCampaign
from iwscope_lab.links import LinkSpec
from iwscope_lab.stack import Stack
from iwscope_lab.topology import Host, Topology

pytestmark = pytest.mark.faults

REPO = pathlib.Path(__file__).resolve().parents[2]
FAULTS_JSON = REPO / "artifacts" / "faults.json"
LINK_CUT_S = float(os.environ.get("IWSCOPE_FAULT_LINK_CUT_S", "120"))
HOLD_S = float(os.environ.get("IWSCOPE_FAULT_HOLD_S", "5"))
REPETITIONS = int(os.environ.get("IWSCOPE_FAULT_REPETITIONS", "40"))
#: name -> (region, RTT ms, rate bit/s): short paths so a campaign takes about half a minute.
PATHS = {"p1": ("europe", 10.0, 20e6), "p2": ("europe", 20.0, 20e6), "p3": ("africa", 40.0, 10e6)}
PLAN = CampaignPlan(name="faults", arms=(3, 10), sizes=(3_000, 20_000), repetitions=REPETITIONS)
#: Longest wait for recovery after a repair (beat's sweep runs every 60 s; the probes back off up to 60 s).
RECOVERY_TIMEOUT_S = 240.0
#: The probe whose process is killed / whose link is cut.
VICTIM = "p3"
#: Results of this session's cases, printed by conftest.py's terminal summary.
RESULTS: dict[str, dict[str, Any]] = {}


@dataclass
class Services:
    postgres: ThrowawayPostgres
    redis: ThrowawayRedis
    stack: Stack


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM (e.g. from ``timeout``) becomes an interrupt, so pytest still tears everything down."""
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """A stack of its own: PostgreSQL, Redis, API, worker, beat (all may be killed by the cases)."""
    root = tmp_path_factory.mktemp("faults")
    postgres = ThrowawayPostgres(pathlib.Path(f"/tmp/iwt-faults-pg-{secrets.token_hex(3)}"))
    redis_server = ThrowawayRedis(pathlib.Path(f"/tmp/iwt-faults-redis-{secrets.token_hex(3)}"))
    saved_env = {key: os.environ.get(key) for key in ("DATABASE_URL", "REDIS_URL")}
    stack: Stack | None = None
    previous_handler = signal.signal(signal.SIGTERM, _interrupt)
    try:
        postgres.start()
        redis_server.start()
        stack = Stack(
            database_url=postgres.url,
            redis_url=redis_server.url,
            api_port=free_port(),
            dashboard_port=None,
            run_dir=root / "stack",
            extra_env={
                "IWSCOPE_CELERY_QUEUE": f"iwscope-faults-{secrets.token_hex(3)}",
                "IWSCOPE_ENV": "development",
                "IWSCOPE_DRAIN_SECONDS": "0.5",
                "IWSCOPE_LOG_LEVEL": "INFO",
                "PYTHONUNBUFFERED": "1",
            },
        )
        stack.run_dir.mkdir(parents=True)
        stack.start(beat=True)
        yield Services(postgres, redis_server, stack)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the teardown short
        if stack is not None:
            stack.stop()
        redis_server.stop()
        postgres.stop()
        signal.signal(signal.SIGTERM, previous_handler)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ----------------------------------------------------------------------------- faults


@dataclass
class Running:
    """What a fault acts on."""

    campaign: LabCampaign
    topology: Topology
    services: Services

    @property
    def stack(self) -> Stack:
        return self.services.stack


def _kill_worker_mid_task(running: Running) -> dict[str, Any]:
    """SIGKILL the worker (and its pool) while Redis holds a task it has taken but not acknowledged."""
    client = redis.Redis.from_url(running.stack.redis_url)
    try:
        deadline = time.monotonic() + 30
        while client.hlen("unacked") == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        in_flight = int(client.hlen("unacked"))
        running.stack.kill("worker")
        return {"tasks_in_flight_at_kill": in_flight}
    finally:
        client.close()


def _restart(name: str) -> Callable[[Running], dict[str, Any]]:
    def restart(running: Running) -> dict[str, Any]:
        running.stack.restart(name)
        return {}

    return restart


def _kill(name: str) -> Callable[[Running], dict[str, Any]]:
    def kill(running: Running) -> dict[str, Any]:
        running.stack.kill(name)
        return {}

    return kill


def _cut_link(running: Running) -> dict[str, Any]:
    link = running.topology.host(VICTIM).link
    running.topology.set_link(VICTIM, LinkSpec.symmetric(rate_bps=link.down.rate_bps, rtt_ms=link.rtt_ms, loss=1.0))
    return {}


def _restore_link(running: Running) -> dict[str, Any]:
    _region, rtt_ms, rate_bps = PATHS[VICTIM]  # set_link replaced the host's spec: restore the configured one
    running.topology.set_link(VICTIM, LinkSpec.symmetric(rate_bps=rate_bps, rtt_ms=rtt_ms))
    return {}


def _restart_redis(running: Running) -> dict[str, Any]:
    running.services.redis.kill_restart(HOLD_S)
    return {}


def _restart_postgres(running: Running) -> dict[str, Any]:
    running.services.postgres.crash_restart(HOLD_S)
    return {}


def _worker_log_size(stack: Stack) -> int:
    log = stack.run_dir / "logs" / "worker.log"
    return log.stat().st_size if log.exists() else 0


def _unrecoverable_worker_error(stack: Stack, since: int) -> str | None:
    """The worker's last 'Unrecoverable error' line written after byte ``since`` of its log."""
    with open(stack.run_dir / "logs" / "worker.log", "rb") as log:
        log.seek(since)
        text_after = log.read().decode(errors="replace")
    lines = [line for line in text_after.splitlines() if "Unrecoverable error" in line]
    return lines[-1][:300] if lines else None


def _nothing(running: Running) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    inject: Callable[[Running], dict[str, Any]]
    repair: Callable[[Running], dict[str, Any]]
    hold_s: float = HOLD_S
    #: Stack processes restarted after the case whatever happened (so a failure does not cascade).
    heal: tuple[str, ...] = ()


def _all_at_once(running: Running) -> dict[str, Any]:
    details = {}
    running.campaign.kill_agent(VICTIM)
    running.campaign.kill_agent("origin")
    details.update(_kill_worker_mid_task(running))
    for name in ("api", "beat"):
        running.stack.kill(name)
    running.services.redis.kill()
    running.services.postgres.stop_immediately()
    _cut_link(running)
    return details


def _repair_all(running: Running) -> dict[str, Any]:
    running.services.postgres.start_again()
    running.services.redis.start()
    for name in ("worker", "beat", "api"):
        running.stack.restart(name)
    running.campaign.restart_agent("origin")
    running.campaign.restart_agent(VICTIM)
    _restore_link(running)
    return {}


FAULTS = [
    Fault(
        "probe",
        f"SIGKILL the probe on {VICTIM}, restart it (iwprobe run --once, same state dir)",
        lambda r: (r.campaign.kill_agent(VICTIM), {})[1],
        lambda r: (r.campaign.restart_agent(VICTIM), {})[1],
    ),
    Fault(
        "origin",
        "SIGKILL the origin, restart it",
        lambda r: (r.campaign.kill_agent("origin"), {})[1],
        lambda r: (r.campaign.restart_agent("origin"), {})[1],
    ),
    Fault("api", "SIGKILL the API process, restart it", _kill("api"), _restart("api")),
    Fault(
        "worker",
        "SIGKILL the Celery worker and its pool while a task is unacknowledged, restart it",
        _kill_worker_mid_task,
        _restart("worker"),
    ),
    Fault("beat", "SIGKILL Celery beat, restart it", _kill("beat"), _restart("beat")),
    # No heal: the worker must reconnect by itself (iwscope.broker), and the later cases run on it.
    Fault("redis", "SIGKILL redis-server, restart it on its append-only file", _nothing, _restart_redis, 0.0),
    Fault("postgres", "crash-stop PostgreSQL (pg_ctl -m immediate), restart it (WAL recovery)", _nothing, _restart_postgres, 0.0),
    Fault("link", f"cut {VICTIM}'s link (emulator drops 100 % both ways), restore it", _cut_link, _restore_link, LINK_CUT_S),
    Fault(
        "all",
        "all of the above at once (probe, origin, API, worker, beat, Redis, PostgreSQL, link)",
        _all_at_once,
        _repair_all,
        heal=("worker",),
    ),
]


# ---------------------------------------------------------------------------- checks


def _query(stack: Stack, sql: str, **params: object) -> list[Any]:
    """Run a read query, retrying while the database is coming back after a fault."""
    deadline = time.monotonic() + 120
    while True:
        try:
            with stack.session() as session:
                return list(session.execute(text(sql), params).all())
        except OperationalError:
            if time.monotonic() > deadline:
                raise
            stack.close_sessions()
            time.sleep(0.5)


def _measured(campaign: LabCampaign) -> tuple[Counter[str], Counter[str]]:
    """(trial ids the probes stored in their spools, observation ids the origin stored)."""
    trials: Counter[str] = Counter()
    for name in PATHS:
        trials.update(journal(campaign.state_dir(name) / PROBE_SPOOL, "trial"))
    return trials, journal(campaign.state_dir("origin") / ORIGIN_SPOOL, "observation")


def _database_state(stack: Stack, campaign: LabCampaign) -> dict[str, Any]:
    trials = _query(
        stack,
        "SELECT trial_id::text AS id, count(*) AS n, bool_and(error_kind IS NULL) AS ok, "
        "min(error_kind) AS error_kind, "
        "bool_and(joined_at IS NOT NULL) AS joined FROM trials "
        "WHERE probe_id = ANY(CAST(:probes AS uuid[])) GROUP BY 1",
        probes=list(campaign.probe_ids.values()),
    )
    observations = _query(
        stack,
        "SELECT trial_id::text AS id, joined_at IS NOT NULL AS joined "
        "FROM origin_observations WHERE origin_id = CAST(:origin AS uuid)",
        origin=campaign.origin_ids["origin"],
    )
    return {"trials": {row.id: row for row in trials}, "observations": {row.id: row.joined for row in observations}}


def _recovered(stack: Stack, campaign: LabCampaign, trials: set[str], observations: set[str]) -> bool:
    """Every trial in ``trials`` stored, every observation in ``observations`` stored and joined."""
    state = _database_state(stack, campaign)
    if not trials <= state["trials"].keys():
        return False
    return all(state["observations"].get(obs) for obs in observations if obs in state["trials"])


def _rollups_match_rebuild(stack: Stack, campaign_id: int) -> tuple[bool, int, list[str]]:
    """Catch the incremental roll-ups up, then compare them with a rebuild from raw rows."""
    time.sleep(1.5)  # past the refresh's safety margin (1 s)
    deadline = time.monotonic() + 120
    while True:
        try:
            with stack.session() as session:
                refresh_rollups(session)
            with stack.session() as session:
                incremental = {k: v for k, v in rollup_snapshot(session).items() if k[0] == campaign_id}
            with stack.session() as session:
                rebuild_rollups(session)
            with stack.session() as session:
                rebuilt = {k: v for k, v in rollup_snapshot(session).items() if k[0] == campaign_id}
            break
        except OperationalError:
            if time.monotonic() > deadline:
                raise
            stack.close_sessions()
            time.sleep(0.5)
    differences = [
        f"{key}: {incremental.get(key)} != {rebuilt.get(key)}"
        for key in sorted(incremental.keys() | rebuilt.keys(), key=str)
        if incremental.get(key) != rebuilt.get(key)
    ]
    return not differences, len(rebuilt), differences[:5]


def _write_results() -> None:
    FAULTS_JSON.parent.mkdir(parents=True, exist_ok=True)
    existing: dict[str, Any] = {}
    if FAULTS_JSON.exists():
        try:
            existing = json.loads(FAULTS_JSON.read_text())
        except ValueError:
            existing = {}
    existing.update(RESULTS)
    FAULTS_JSON.write_text(json.dumps(existing, indent=2, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------- cases


@pytest.mark.parametrize("fault", FAULTS, ids=[fault.name for fault in FAULTS])
def test_fault_loses_and_duplicates_nothing(fault: Fault, services: Services, tmp_path: pathlib.Path) -> None:
    hosts = [Host("origin", role="origin", region="lab", link=LinkSpec.symmetric(rate_bps=1e9, rtt_ms=0))]
    hosts += [
        Host(name, role="probe", region=region, link=LinkSpec.symmetric(rate_bps=rate, rtt_ms=rtt))
        for name, (region, rtt, rate) in PATHS.items()
    ]
    expected = PLAN.trials_per_probe(1)
    with Topology(f"iwt{secrets.token_hex(3)}", hosts) as topology:
        campaign = LabCampaign(topology, services.stack, PLAN, state_root=tmp_path / "agents")
        for host in hosts:
            install_journal(campaign.state_dir(host.name) / (PROBE_SPOOL if host.role == "probe" else ORIGIN_SPOOL))
        running = Running(campaign, topology, services)
        timeout_s = 600 + fault.hold_s
        worker_log_at = _worker_log_size(services.stack)
        try:
            campaign.start(timeout_s=timeout_s)
            started = time.monotonic()
            # Inject once every probe measured a quarter of its trials (the campaign is in full swing).
            while min(sum(journal(campaign.state_dir(n) / PROBE_SPOOL, "trial").values()) for n in PATHS) < expected // 4:
                assert time.monotonic() - started < 180, "the campaign did not get going"
                time.sleep(0.2)
            details = fault.inject(running)
            injected_at = time.monotonic()
            time.sleep(fault.hold_s)
            details.update(fault.repair(running))
            repaired_at = time.monotonic()
            down_s = repaired_at - injected_at
            trials_before, observations_before = _measured(campaign)
            recover_s: float | None = None
            while time.monotonic() - repaired_at < RECOVERY_TIMEOUT_S:
                if _recovered(services.stack, campaign, set(trials_before), set(observations_before)):
                    recover_s = time.monotonic() - repaired_at
                    break
                time.sleep(0.5)
            details["worker_unrecoverable_error"] = _unrecoverable_worker_error(services.stack, worker_log_at)
            # Joins were already awaited above; a killed origin can leave a trial that never gets one.
            result = campaign.finish(timeout_s=timeout_s, show_progress=False, join_timeout_s=5)
            # ... for what was recorded before the repair: the rest of the campaign's observations
            # must be joined too (a drain lost with the worker or Redis delays them: the mark
            # expires in 10 s, the beat sweep joins every minute).
            _, recorded_now = _measured(campaign)
            deadline = time.monotonic() + RECOVERY_TIMEOUT_S
            while not _recovered(services.stack, campaign, set(), set(recorded_now)) and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            campaign.close()
            # A case must not leave a broken stack to the next one (the failure is reported below).
            for name in fault.heal:
                services.stack.kill(name)
                services.stack.restart(name)
        measured, recorded = _measured(campaign)
        state = _database_state(services.stack, campaign)
        stored = state["trials"]
        lost = sorted(set(measured) - stored.keys())
        unexpected = sorted(stored.keys() - set(measured))
        duplicated = sum(row.n - 1 for row in stored.values()) + sum(n - 1 for n in measured.values())
        observations_lost = sorted(set(recorded) - state["observations"].keys())
        observations_unjoined = sorted(obs for obs in recorded if obs in stored and not state["observations"].get(obs))
        orphan_observations = sorted(set(recorded) - set(measured))
        ok_without_observation = sorted(tid for tid, row in stored.items() if row.ok and not row.joined)
        rollups_equal, rollup_keys, rollup_differences = _rollups_match_rebuild(services.stack, result.campaign_id)
        RESULTS[fault.name] = {
            "fault": fault.what,
            "trials_expected": expected * len(PATHS),
            "trials_measured": sum(measured.values()),
            "trials_stored": sum(row.n for row in stored.values()),
            "trials_failed": sum(1 for row in stored.values() if not row.ok),
            "trials_failed_by_kind": dict(Counter(row.error_kind for row in stored.values() if not row.ok)),
            "lost": len(lost),
            "duplicated": duplicated,
            "stored_but_not_measured": len(unexpected),
            "observations_recorded": sum(recorded.values()),
            "observations_stored": len(state["observations"]),
            "observations_lost": len(observations_lost),
            "observations_unjoined": len(observations_unjoined),
            "observations_without_trial": len(orphan_observations),
            "successful_trials_without_observation": len(ok_without_observation),
            "rollups_equal_rebuild": rollups_equal,
            "rollup_keys": rollup_keys,
            "down_s": round(down_s, 1),
            "recover_s": None if recover_s is None else round(recover_s, 1),
            "campaign_s": round(result.seconds, 1),
            "details": details,
            "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }
        _write_results()
    assert recover_s is not None, f"not recovered within {RECOVERY_TIMEOUT_S:.0f} s of the repair: {details}"
    assert not lost, f"trials measured but not stored: {lost[:5]}"
    assert duplicated == 0
    assert not unexpected, f"trials stored that no probe measured: {unexpected[:5]}"
    assert result.stored_per_probe == dict.fromkeys(PATHS, expected), result.stored_per_probe
    assert not observations_lost, f"observations recorded but not stored: {observations_lost[:5]}"
    assert not observations_unjoined, f"observations stored but not joined: {observations_unjoined[:5]}"
    assert rollups_equal, rollup_differences
    if fault.name not in ("origin", "all"):
        # Only a killed origin can lose the server side of a trial that completed on the probe.
        assert not ok_without_observation, ok_without_observation[:5]
    else:
        assert len(ok_without_observation) <= len(PATHS), ok_without_observation[:5]
