"""The chart played by a real engine: ``helm template`` of helm/iwscope run by ``podman kube play``
with the image podman built (tests/deploy/kubeplay.py says what kube play does and what
stands in for what it does not).

Install order as on a cluster: the migration Job (a ``pre-install`` hook) on an empty
database, then the API, worker, beat and dashboard Deployments, whose init containers wait
for the schema.  Then the chart's NOTES commands (``iwscope token create`` in the API
container), a probe and an origin enrolled through the played API, a batch of trials and
their observations uploaded, the trials joined by the played worker, the dashboard answering.
Marked ``deploy`` (``make deploy-check``), with the image tests.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from chartrender import ensure_helm, helm_template
from conftest import Built
from kubeplay import LEFT_OUT_KINDS, PlayedChart
from testenv import libpq_url
from testkit import (
    enroll_origin,
    enroll_probe,
    free_port,
    make_batch,
    make_observation,
    make_observation_batch,
    make_trial,
    wait_for,
)

from iwprobe import wire

pytestmark = pytest.mark.deploy


@pytest.fixture(scope="module")
def played(
    built_images: dict[str, Built], empty_database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PlayedChart]:
    repository, tag = built_images["collector"].image.rsplit(":", 1)
    overrides: dict[str, Any] = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "postgresql": {"url": empty_database_url, "builtin": {"enabled": False}},
        "redis": {"url": redis_url, "builtin": {"enabled": False}},
        "secret": {"adminToken": secrets.token_hex(20), "enrollToken": secrets.token_hex(20)},
        "config": {"celeryQueue": f"iwt-kubeplay-{secrets.token_hex(3)}"},
        # Every pod is on the host's network here: each listener on a port of its own.
        "api": {"containerPort": free_port()},
        "dashboard": {"containerPort": free_port()},
    }
    chart = PlayedChart(helm_template(ensure_helm(), [], overrides), tmp_path_factory.mktemp("kubeplay"))
    try:
        chart.create_secrets()
        yield chart
    finally:
        chart.down()


@pytest.fixture(scope="module")
def migrated(played: PlayedChart) -> tuple[int, str]:
    return played.run_job("migrate")


@pytest.fixture(scope="module")
def initialized(played: PlayedChart, migrated: tuple[int, str]) -> dict[str, tuple[int, str]]:
    assert migrated[0] == 0, migrated[1]
    return played.run_init_containers()


@pytest.fixture(scope="module")
def running(played: PlayedChart, initialized: dict[str, tuple[int, str]]) -> PlayedChart:
    assert all(code == 0 for code, _ in initialized.values()), initialized
    played.play_workloads()
    return played


def _answers(url: str) -> httpx.Response | None:
    try:
        answer = httpx.get(url, timeout=2.0)
    except httpx.TransportError:
        return None
    return answer if answer.status_code == 200 else None


def test_every_rendered_object_is_played_or_named(played: PlayedChart) -> None:
    """Nothing of the chart is dropped silently: a kind the harness does not know fails it."""
    assert played.kinds_left_out() <= LEFT_OUT_KINDS  # and no kind unknown (it raises)
    with pytest.raises(AssertionError, match="CronJob"):
        PlayedChart([*played.objects, {"kind": "CronJob", "metadata": {"name": "x"}}], played.directory).kinds_left_out()
    deployments = {obj["metadata"]["name"].rsplit("-", 1)[-1] for obj in played.objects if obj["kind"] == "Deployment"}
    assert deployments == {"api", "worker", "beat", "dashboard"}
    assert [obj["kind"] for obj in played.objects].count("Job") == 1


def test_the_migration_job_creates_the_schema(migrated: tuple[int, str], empty_database_url: str) -> None:
    code, log = migrated
    assert code == 0, log
    with psycopg.connect(libpq_url(empty_database_url)) as connection:
        tables = {row[0] for row in connection.execute("select tablename from pg_tables where schemaname = 'public'")}
    assert {"alembic_version", "probes", "origins", "trials", "api_tokens"} <= tables


def test_the_init_containers_pass_after_the_migration(initialized: dict[str, tuple[int, str]]) -> None:
    assert {name.rsplit("-", 1)[-1] for name in initialized} == {"api", "worker", "beat", "dashboard"}
    for name, (code, log) in initialized.items():
        assert code == 0 and "database at head" in log, f"{name}: {log}"


def test_the_played_collector_enrolls_stores_and_joins(running: PlayedChart, empty_database_url: str) -> None:
    api = f"http://127.0.0.1:{running.http_port('api')}"
    ready = wait_for(
        lambda: _answers(f"{api}/readyz"), timeout=120, what="the played API's /readyz", detail=lambda: running.logs("api", "api")
    )
    assert ready.json()["status"] == "ready"
    # The chart's NOTES: tokens are made in the API container.
    tokens = {kind: running.create_token(kind, "kubeplay") for kind in ("enroll", "origin")}
    with httpx.Client(base_url=api, timeout=30.0) as client:
        probe = enroll_probe(client, tokens["enroll"])
        origin = enroll_origin(client, tokens["origin"])
        trials = [make_trial(probe.id, origin.id) for _ in range(20)]
        stored = client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, trials), headers=probe.headers)
        assert stored.status_code == 200 and stored.json()["accepted"] == 20
        observed = client.post(
            wire.OBSERVATIONS_BATCH_PATH,
            json=make_observation_batch(origin.id, [make_observation(trial, origin.id) for trial in trials]),
            headers=origin.headers,
        )
        assert observed.status_code == 200

    def joined() -> bool:
        with psycopg.connect(libpq_url(empty_database_url)) as connection:
            row = connection.execute("select count(joined_at) from trials where probe_id = %s", (probe.id,)).fetchone()
        return row is not None and row[0] == 20

    wait_for(joined, timeout=120, what="the played worker joining the 20 trials", detail=lambda: running.logs("worker", "worker"))


def test_the_played_dashboard_answers(running: PlayedChart) -> None:
    dashboard = f"http://127.0.0.1:{running.http_port('dashboard')}/"
    wait_for(
        lambda: _answers(dashboard),
        timeout=120,
        what="the played dashboard",
        detail=lambda: running.logs("dashboard", "dashboard"),
    )
