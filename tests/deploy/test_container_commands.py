"""Deployment (container images, Helm chart): every container command the chart runs, run natively against the real PostgreSQL
and Redis, exactly as `helm template` renders it (command, environment from the rendered
ConfigMap and Secret, working directory, probes), each in a pod-like sandbox (own hostname,
read-only root filesystem, tmpfs /tmp; see podsim.py).

Order: the wait-for-schema init container loops on an empty database; the migration Job
completes; the init container then passes; the API, worker, beat and dashboard start and
their readiness/liveness probes pass; beat sends a task that the worker runs.
"""

from __future__ import annotations

import os
import pathlib
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import psycopg
import pytest
from chartrender import REPO, Manifest, ensure_helm, find, helm_template
from podsim import PodContainer, wait_until
from testenv import libpq_url

#: Seconds allowed for each process to become ready (includes imports under CPU noise).
READY_TIMEOUT_S = 90.0
#: The sweep task is on a 60 s interval in the collector's beat schedule.
BEAT_TIMEOUT_S = 100.0

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="namespaces for the pod sandbox need root")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Release:
    objects: list[Manifest]
    suffix: str
    log_dir: pathlib.Path

    def container(self, kind: str, workload: str, container: str) -> PodContainer:
        rendered = find(self.objects, kind, workload)
        return PodContainer.from_chart(self.objects, rendered, container, f"iwt{self.suffix}-{workload}", self.log_dir / workload)

    def http_port(self, workload: str) -> int:
        container = find(self.objects, "Deployment", workload)["spec"]["template"]["spec"]["containers"][0]
        return int(next(p["containerPort"] for p in container["ports"] if p["name"] == "http"))

    def probe_url(self, workload: str, probe: str) -> str:
        container = find(self.objects, "Deployment", workload)["spec"]["template"]["spec"]["containers"][0]
        http_get = container[probe]["httpGet"]
        assert http_get["port"] == "http"
        return f"http://127.0.0.1:{self.http_port(workload)}{http_get['path']}"


@pytest.fixture(scope="module")
def release(empty_database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Release:
    """The chart rendered for production shape (external PostgreSQL and Redis by URL, hooks,
    chart-created Secret with tokens), pointed at this test's database, Redis, queue and ports."""
    suffix = secrets.token_hex(3)
    overrides = {
        "postgresql": {"url": empty_database_url, "builtin": {"enabled": False}},
        "redis": {"url": redis_url, "builtin": {"enabled": False}},
        "secret": {"adminToken": secrets.token_hex(20), "enrollToken": secrets.token_hex(20)},
        "config": {"celeryQueue": f"iwt-deploy-{suffix}"},
        # Pods have their own network namespace; natively each listener needs a free port.
        "api": {"containerPort": _free_port(), "workers": 2},
        "dashboard": {"containerPort": _free_port()},
    }
    objects = helm_template(ensure_helm(), [], overrides)
    return Release(objects, suffix, tmp_path_factory.mktemp("pods"))


@dataclass
class SchemaRollout:
    init_before_running_after_s: float
    init_before_log: str
    job: subprocess.CompletedProcess[str]
    job_seconds: float
    init_after: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def schema_rollout(release: Release) -> SchemaRollout:
    """What happens on install: pods wait, the Job migrates, the pods' init containers pass."""
    waiting = release.container("Deployment", "api", "wait-for-schema")
    process = waiting.start(log_name="before")
    observe_s = 6.0
    time.sleep(observe_s)
    still_running = process.poll() is None
    waiting.stop(grace_seconds=5)
    job_container = release.container("Job", "migrate", "migrate")
    started = time.monotonic()
    job = job_container.run(timeout=300)
    job_seconds = time.monotonic() - started
    init_after = release.container("Deployment", "worker", "wait-for-schema").run(timeout=120)
    return SchemaRollout(observe_s if still_running else -1.0, waiting.log("before"), job, job_seconds, init_after)


def test_init_container_waits_on_an_empty_database(schema_rollout: SchemaRollout) -> None:
    assert schema_rollout.init_before_running_after_s > 0, schema_rollout.init_before_log
    assert "waiting for the migration Job" in schema_rollout.init_before_log
    assert "database at nothing" in schema_rollout.init_before_log  # `iwscope db check` said why


def test_migration_job_completes(schema_rollout: SchemaRollout, release: Release, empty_database_url: str) -> None:
    job = schema_rollout.job
    assert job.returncode == 0, job.stdout + job.stderr
    with psycopg.connect(libpq_url(empty_database_url)) as connection:
        tables = {row[0] for row in connection.execute("select tablename from pg_tables where schemaname = 'public'").fetchall()}
    assert {"alembic_version", "probes", "origins", "campaigns", "trials", "api_tokens"} <= tables


def test_init_container_passes_after_the_migration(schema_rollout: SchemaRollout) -> None:
    result = schema_rollout.init_after
    assert result.returncode == 0, result.stdout + result.stderr
    assert "database at head" in result.stdout


def test_the_sandbox_is_read_only_outside_tmp(release: Release) -> None:
    """Control for the pod sandbox: a write outside /tmp fails, inside /tmp succeeds."""
    container = release.container("Deployment", "beat", "beat")
    marker = REPO / f".iwt-readonly-{release.suffix}"
    outside = container.run(["sh", "-c", f"touch {marker}"], timeout=30)
    inside = container.run(["sh", "-c", "touch /tmp/x && hostname"], timeout=30)
    assert outside.returncode != 0 and "Read-only file system" in outside.stderr
    assert not marker.exists()
    assert inside.returncode == 0 and inside.stdout.strip() == f"iwt{release.suffix}-beat"


@dataclass
class Pods:
    api: PodContainer
    worker: PodContainer
    beat: PodContainer
    dashboard: PodContainer


@pytest.fixture(scope="module")
def pods(release: Release, schema_rollout: SchemaRollout) -> Iterator[Pods]:
    """API, worker, beat and dashboard, started together from the rendered commands."""
    assert schema_rollout.init_after.returncode == 0, "schema not at head: see test_migration_job_completes"
    started = Pods(*(release.container("Deployment", name, name) for name in ("api", "worker", "beat", "dashboard")))
    try:
        for container in (started.beat, started.worker, started.api, started.dashboard):
            container.start()
        yield started
    finally:
        for container in (started.api, started.worker, started.beat, started.dashboard):
            container.stop()


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("workload", ["api", "dashboard"])
def test_http_pods_become_ready_and_live(pods: Pods, release: Release, workload: str) -> None:
    container: PodContainer = getattr(pods, workload)
    readiness = release.probe_url(workload, "readinessProbe")
    started = time.monotonic()
    try:
        wait_until(lambda: _http_ok(readiness), READY_TIMEOUT_S, what=f"{workload} readiness {readiness}")
    except TimeoutError:
        pytest.fail(f"{workload} never became ready; log:\n{container.log()[-4000:]}")
    print(f"{workload}: ready after {time.monotonic() - started:.1f} s")
    assert _http_ok(release.probe_url(workload, "livenessProbe"))
    assert container.processes[0].poll() is None
    if workload == "api":
        body = httpx.get(readiness, timeout=5).json()
        assert body["checks"] == {"postgresql": "ok", "redis": "ok"}


def test_worker_liveness_probe_passes_for_this_worker_only(pods: Pods, release: Release) -> None:
    probe = find(release.objects, "Deployment", "worker")["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"][
        "command"
    ]
    started = time.monotonic()

    def probe_passes() -> bool:
        assert pods.worker.processes[0].poll() is None, pods.worker.log()[-4000:]
        return pods.worker.run(probe, timeout=60).returncode == 0

    try:
        wait_until(probe_passes, READY_TIMEOUT_S, interval=2, what="worker liveness probe")
    except TimeoutError:
        pytest.fail(f"worker liveness probe never passed; log:\n{pods.worker.log()[-4000:]}")
    print(f"worker: liveness probe passed after {time.monotonic() - started:.1f} s")
    # The same probe from another pod (another hostname) finds no worker of that name.
    other_pod = PodContainer(
        f"iwt{release.suffix}-elsewhere",
        pods.worker.spec,
        {**pods.worker.environment, "HOSTNAME": f"iwt{release.suffix}-elsewhere"},
        pods.worker.log_dir,
    )
    missed = other_pod.run(probe, timeout=60)
    assert missed.returncode != 0, missed.stdout


def test_notes_commands_enroll_a_probe_that_probes_list_shows(pods: Pods, release: Release, tmp_path: pathlib.Path) -> None:
    """NOTES.txt's `kubectl exec deploy/...-api -c api -- iwscope token create --kind enroll`
    (the same command in the API container's environment), a real `iwprobe enroll` against the
    API with that token, then `iwscope probes list` shows the probe with its region."""
    wait_until(lambda: _http_ok(release.probe_url("api", "readinessProbe")), READY_TIMEOUT_S, what="api ready")
    created = pods.api.run(["iwscope", "token", "create", "--kind", "enroll"], timeout=60)
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert token and "\n" not in token
    name, region = f"iwt-p-{release.suffix}", "iwt-eu"
    enrolled = subprocess.run(
        [
            sys.executable,
            "-m",
            "iwprobe",
            "enroll",
            "--collector",
            f"http://127.0.0.1:{release.http_port('api')}",
            "--token",
            token,
            "--name",
            name,
            "--region",
            region,
            "--state-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert enrolled.returncode == 0, enrolled.stdout + enrolled.stderr
    # A wide virtual terminal so the table does not wrap names (as `kubectl exec` with COLUMNS).
    listing = pods.api.run(["iwscope", "probes", "list"], timeout=60, extra_environment={"COLUMNS": "200"})
    assert listing.returncode == 0, listing.stderr
    row = next((line for line in listing.stdout.splitlines() if name in line), None)
    assert row is not None, listing.stdout
    assert region in row, row
    print(listing.stdout)


def test_beat_schedules_a_task_that_the_worker_runs(pods: Pods) -> None:
    started = time.monotonic()
    try:
        wait_until(lambda: "Sending due task" in pods.beat.log(), BEAT_TIMEOUT_S, interval=1, what="beat sending a task")
    except TimeoutError:
        pytest.fail(f"beat sent nothing; log:\n{pods.beat.log()[-4000:]}")
    print(f"beat: first task sent after {time.monotonic() - started:.1f} s")
    assert pods.beat.processes[0].poll() is None, "beat exited"
    sent = [line for line in pods.beat.log().splitlines() if "Sending due task" in line]
    task_name = sent[0].split("(")[-1].rstrip(")").strip()
    wait_until(
        lambda: f"Task {task_name}[" in pods.worker.log() and "succeeded" in pods.worker.log(),
        60,
        what=f"worker running {task_name}",
    )
    for container in (pods.api, pods.worker, pods.beat, pods.dashboard):
        assert container.processes[0].poll() is None, f"{container.spec['name']} died:\n{container.log()[-3000:]}"
