"""The chart upgraded to a collector build with a new migration while a probe uploads: ``helm
upgrade`` rehearsed with ``podman kube play`` (tests/deploy/kubeplay.py), so that an upgrade
is known to lose no trial in flight, not assumed to.

Release 1 is the chart with the collector image under test, played as a cluster installs it
(tests/deploy/test_chart_kubeplay.py).  Release 2 is "the next build": an image made FROM
release 1's with one more Alembic migration (a nullable column and an index on ``trials``,
revising the repository's head as it is when the test runs).  Throughout, the probe's real
upload code -- ``iwprobe``'s SQLite :class:`Spool` and :class:`Uploader`, looped as the agent
loops them between rounds -- and an origin's (its uploader's ``run_forever``) send what a
producer spools: 10 trials and their 10 observations every half second.  The upgrade in
``helm upgrade``'s order: release 2's migration Job (the ``pre-upgrade`` hook) while release
1's pods serve, release 2's init containers (``wait-for-schema``: they must see the new
head), then each Deployment's pod replaced -- kube play cannot roll, so the API is down from
the old pod's stop until the new one listens, and the uploaders must ride that out.  Then
the producer stops, the spools drain, and every trial produced must be in the database once,
joined by the worker, with nothing logged as an error.

Marked ``deploy`` (``make deploy-check``); the numbers it prints (retries, the window the API
did not answer, trials produced and stored) are in docs/deployment.md and
``artifacts/deploy-upgrade.json``.
"""

from __future__ import annotations

import collections
import json
import re
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
import pytest
from alembic.script import ScriptDirectory
from chartrender import REPO, ensure_helm, helm_template
from conftest import Built
from kubeplay import PlayedChart, Replaced, podman
from testenv import libpq_url
from testkit import enroll_origin, enroll_probe, free_port, make_observation, make_trial, wait_for

from iwprobe._collector import CollectorClient, CollectorError
from iwprobe._spool import Spool
from iwprobe._upload import Uploader

pytestmark = pytest.mark.deploy

#: Release 2's image: release 1's plus the new migration.
UPGRADE_IMAGE = "localhost/iwscope-collector:check-upgrade"
#: What the producer spools each round, and how often.
TRIALS_PER_ROUND = 10
ROUND_S = 0.5
#: Trials acknowledged in each phase before the next begins (release 1, release 1 on the new
#: schema, release 2): counts, so that each phase has carried uploads however slow the box is.
UPLOADED_PER_PHASE = 50
#: Generous bounds for a contended 2-core box; none of them is asserted as a duration.
PHASE_TIMEOUT_S = 600
#: What an error looks like in uvicorn's and Celery's logs.
ERROR_LINE = re.compile(r"\bERROR\b|\bCRITICAL\b|Traceback \(most recent call last\)")
#: Where the measured numbers go (docs/deployment.md cites them).
UPGRADE_ARTIFACT = REPO / "artifacts" / "deploy-upgrade.json"

MIGRATION = '''"""upgrade rehearsal: trials.agent_build, the build of the agent that measured a trial

Written by tests/deploy/test_chart_upgrade.py into an image built FROM the collector image under
test: the kind of change a next release makes -- a nullable column without a default and an
index -- which PostgreSQL applies without rewriting the table, so the release before keeps
inserting while and after it runs.

Revision ID: {revision}
Revises: {down_revision}
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "{revision}"
down_revision = "{down_revision}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("trials", sa.Column("agent_build", sa.Text(), nullable=True))
    op.create_index("ix_trials_agent_build", "trials", ["agent_build"])


def downgrade() -> None:
    op.drop_index("ix_trials_agent_build", table_name="trials")
    op.drop_column("trials", "agent_build")
'''


def repository_head() -> str:
    """The head of migrations/ as the repository has it now (what release 1's image holds)."""
    (head,) = ScriptDirectory(str(REPO / "migrations")).get_heads()
    return head


@dataclass
class UpgradeImage:
    """Release 2's image and the migration it adds (revision, and the head it revises)."""

    image: str
    revision: str
    down_revision: str


@pytest.fixture(scope="module")
def upgrade_image(built_images: dict[str, Built], tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpgradeImage]:
    """Release 2's image: FROM release 1's (by id, so a concurrent rebuild of the tag cannot slip
    in) with one more migration in /app/migrations/versions; removed at the end."""
    base = podman("image", "inspect", "--format", "{{.Id}}", built_images["collector"].image)
    assert base.returncode == 0, base.stderr
    revision, down_revision = f"rehearsal_{secrets.token_hex(4)}", repository_head()
    context = tmp_path_factory.mktemp("upgrade-image")
    (context / f"{revision}.py").write_text(MIGRATION.format(revision=revision, down_revision=down_revision))
    (context / "Containerfile").write_text(
        f"FROM {base.stdout.strip()}\nCOPY --chown=root:root {revision}.py /app/migrations/versions/{revision}.py\n"
    )
    build = podman("build", "--pull=never", "-f", str(context / "Containerfile"), "-t", UPGRADE_IMAGE, str(context), timeout=600)
    assert build.returncode == 0, (build.stdout + build.stderr)[-3000:]
    try:
        yield UpgradeImage(UPGRADE_IMAGE, revision, down_revision)
    finally:
        podman("rmi", "--force", UPGRADE_IMAGE)


@pytest.fixture(scope="module")
def values(empty_database_url: str, redis_url: str) -> dict[str, Any]:
    """The release's values but for the image: ``helm upgrade`` with the same values and a new tag."""
    return {
        # Names of its own: test_chart_kubeplay.py's release may be playing at the same time.
        "fullnameOverride": "iwt-upgrade",
        "postgresql": {"url": empty_database_url, "builtin": {"enabled": False}},
        "redis": {"url": redis_url, "builtin": {"enabled": False}},
        "secret": {"adminToken": secrets.token_hex(20), "enrollToken": secrets.token_hex(20)},
        "config": {"celeryQueue": f"iwt-upgrade-{secrets.token_hex(3)}"},
        "api": {"containerPort": free_port()},
        "dashboard": {"containerPort": free_port()},
    }


def render(image: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    repository, tag = image.rsplit(":", 1)
    return helm_template(ensure_helm(), [], {**values, "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"}})


def answered(url: str) -> int | None:
    """The status ``url`` answers with, ``None`` when nothing answers."""
    try:
        return httpx.get(url, timeout=2.0).status_code
    except httpx.TransportError:
        return None


@pytest.fixture(scope="module")
def release_one(
    built_images: dict[str, Built],
    upgrade_image: UpgradeImage,
    values: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PlayedChart]:
    """Release 1 installed as test_chart_kubeplay.py installs it, its API ready; everything
    played (both releases) is removed at the end -- before release 2's image, built first for
    that (as a registry holds the next build before anyone upgrades to it)."""
    chart = PlayedChart(render(built_images["collector"].image, values), tmp_path_factory.mktemp("upgrade"))
    try:
        chart.create_secrets()
        code, log = chart.run_job("migrate")
        assert code == 0, log
        initialized = chart.run_init_containers()
        for name, (code, log) in initialized.items():
            assert code == 0 and f"database at head ({repository_head()})" in log, f"{name}: {log}"
        chart.play_workloads()
        api = f"http://127.0.0.1:{chart.http_port('api')}"
        wait_for(lambda: answered(f"{api}/readyz") == 200, timeout=PHASE_TIMEOUT_S, what="release 1's /readyz")
        yield chart
    finally:
        chart.down()


# ----------------------------------------------------------------------------- the uploads
@dataclass
class Attempt:
    """One upload the real client made: when (monotonic), to which path, and its outcome
    (the HTTP status, or ``None``: nothing answered)."""

    at: float
    path: str
    status: int | None


class RecordingClient(CollectorClient):
    """The agent's collector client, every request's outcome noted (the uploader's retries)."""

    def __init__(self, base_url: str, credential: str) -> None:
        super().__init__(base_url, credential)
        self.attempts: list[Attempt] = []

    def request(self, method: str, path: str, body: bytes | None = None, token: str | None = None) -> tuple[int, Any]:
        at = time.monotonic()
        try:
            status, answer = super().request(method, path, body, token)
        except CollectorError as error:
            self.attempts.append(Attempt(at, path, error.status))
            raise
        self.attempts.append(Attempt(at, path, status))
        return status, answer


@dataclass
class Uploads:
    """The probe and the origin uploading what the producer spools, each with its real uploader."""

    probe: Uploader
    origin: Uploader
    produced: list[str] = field(default_factory=list)
    readiness: list[tuple[float, int | None]] = field(default_factory=list)
    halt_production: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    producer: threading.Thread | None = None
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self, api: str) -> None:
        self.producer = threading.Thread(target=self._produce, daemon=True)
        self.threads = [
            self.producer,
            threading.Thread(target=self._agent_uploads, daemon=True),
            # The origin's own loop (``iwprobe origin``: ``run_forever(stop, 1.0)``).
            threading.Thread(target=self.origin.run_forever, args=(self.stop, 1.0), daemon=True),
            threading.Thread(target=self._watch, args=(api,), daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _produce(self) -> None:
        """A round of trials every ``ROUND_S``, each committed to the probe's spool and its
        observation to the origin's, as the agent and the origin do before any upload."""
        while not self.halt_production.is_set():
            for _ in range(TRIALS_PER_ROUND):
                trial = make_trial(self.probe.owner_id, self.origin.owner_id)
                self.probe.spool.add("trial", trial["trial_id"], trial)
                self.origin.spool.add("observation", trial["trial_id"], make_observation(trial, self.origin.owner_id))
                self.produced.append(trial["trial_id"])
            self.halt_production.wait(ROUND_S)

    def _agent_uploads(self) -> None:
        """The agent's upload between rounds (``Agent.run``): drain until the next round is due
        (at least 1 s), then wait for it; the uploader's backoff carries over between calls."""
        while not self.stop.is_set():
            self.probe.drain(deadline=time.monotonic() + max(1.0, min(ROUND_S, 30.0)), stop=self.stop)
            self.stop.wait(ROUND_S)

    def _watch(self, api: str) -> None:
        """``/readyz`` every 0.2 s: when the API was draining (503) or not there at all."""
        while not self.stop.is_set():
            self.readiness.append((time.monotonic(), answered(f"{api}/readyz")))
            self.stop.wait(0.2)

    def stop_producing(self) -> None:
        self.halt_production.set()
        if self.producer is not None:
            self.producer.join(timeout=120)

    def finish(self) -> None:
        self.halt_production.set()
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)

    def attempts(self) -> list[Attempt]:
        clients = [self.probe.client, self.origin.client]
        return sorted((a for c in clients if isinstance(c, RecordingClient) for a in c.attempts), key=lambda a: a.at)


def taken(attempt: Attempt) -> bool:
    return attempt.status is not None and 200 <= attempt.status < 300


def longest_refusal(attempts: list[Attempt]) -> float:
    """The longest time an uploader went from its first refused upload to its next one taken."""
    longest = 0.0
    for path in {attempt.path for attempt in attempts}:
        refused_since = None
        for attempt in (attempt for attempt in attempts if attempt.path == path):
            if not taken(attempt):
                refused_since = attempt.at if refused_since is None else refused_since
            elif refused_since is not None:
                longest, refused_since = max(longest, attempt.at - refused_since), None
    return longest


def longest_gap(samples: list[tuple[float, Any]], good: Any) -> tuple[float, int]:
    """The longest time from the last ``good`` sample before a run of others to the first
    ``good`` one after it, and how many samples in all were not ``good``."""
    longest, bad, last_good, in_gap = 0.0, 0, None, False
    for at, value in samples:
        if value == good:
            if in_gap and last_good is not None:
                longest = max(longest, at - last_good)
            last_good, in_gap = at, False
        else:
            bad, in_gap = bad + 1, True
    return longest, bad


@dataclass
class Rehearsal:
    """What the upgrade did and what it measured."""

    probe_id: str
    produced: list[str]
    job: tuple[int, str]
    initialized: dict[str, tuple[int, str]]
    replaced: dict[str, Replaced]
    attempts: list[Attempt]
    readiness: list[tuple[float, int | None]]
    backlog: int
    rejected: int
    #: Seconds each step took, in order (for the docs; nothing is asserted of them).
    phases: dict[str, float]


@pytest.fixture(scope="module")
def rehearsal(
    release_one: PlayedChart, upgrade_image: UpgradeImage, values: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Rehearsal:
    """helm upgrade's steps, in its order, while the probe and the origin upload."""
    chart = release_one
    api = f"http://127.0.0.1:{chart.http_port('api')}"
    tokens = {kind: chart.create_token(kind, "upgrade") for kind in ("enroll", "origin")}
    with httpx.Client(base_url=api, timeout=30.0) as client:
        probe = enroll_probe(client, tokens["enroll"])
        origin = enroll_origin(client, tokens["origin"])
    spools = tmp_path_factory.mktemp("spools")
    # The agent's and the origin's settings: backoff from 1 s, capped at 60 s.
    uploads = Uploads(
        Uploader(
            Spool(str(spools / "probe.sqlite")), RecordingClient(api, probe.credential), "probe", probe.id, backoff_cap_s=60
        ),
        Uploader(
            Spool(str(spools / "origin.sqlite")), RecordingClient(api, origin.credential), "origin", origin.id, backoff_cap_s=60
        ),
    )

    def uploaded_beyond(count: int, what: str) -> None:
        """Until the probe's uploader had ``count`` trials acknowledged in all."""
        wait_for(
            lambda: uploads.probe.uploaded >= count, timeout=PHASE_TIMEOUT_S, what=what, detail=lambda: chart.logs("api", "api")
        )

    phases: dict[str, float] = {}
    started = time.monotonic()

    def phase(name: str) -> None:
        nonlocal started
        phases[name] = round(time.monotonic() - started, 1)
        started = time.monotonic()

    try:
        uploads.start(api)
        uploaded_beyond(UPLOADED_PER_PHASE, "uploads to release 1")
        phase("release 1")
        # helm upgrade: the pre-upgrade hook while release 1 serves, then the new pods.
        chart.upgrade(render(upgrade_image.image, values))
        job = chart.run_job("migrate")
        assert job[0] == 0, job[1]
        phase("migration job")
        uploaded_beyond(uploads.probe.uploaded + UPLOADED_PER_PHASE, "uploads to release 1 on the new schema")
        phase("release 1 on the new schema")
        initialized = chart.run_init_containers()
        phase("init containers")
        replaced = chart.replace_workloads()
        phase("pods replaced")
        uploaded_beyond(uploads.probe.uploaded + UPLOADED_PER_PHASE, "uploads to release 2")
        phase("release 2")
        # The producer stops; the uploaders drain the spools in their own loops, backoff as it stands.
        uploads.stop_producing()
        wait_for(
            lambda: uploads.probe.backlog() == 0 and uploads.origin.backlog() == 0,
            timeout=PHASE_TIMEOUT_S,
            what="the spools drained",
            detail=lambda: chart.logs("api", "api"),
        )
        phase("spools drained")
    finally:
        uploads.finish()
    return Rehearsal(
        probe.id,
        list(uploads.produced),
        job,
        initialized,
        replaced,
        uploads.attempts(),
        uploads.readiness,
        uploads.probe.backlog() + uploads.origin.backlog(),
        uploads.probe.spool.rejected_count() + uploads.origin.spool.rejected_count(),
        phases,
    )


# ----------------------------------------------------------------------------- the checks
def test_the_pre_upgrade_job_applies_the_new_migration(
    rehearsal: Rehearsal, upgrade_image: UpgradeImage, empty_database_url: str
) -> None:
    code, log = rehearsal.job
    assert code == 0, log
    with psycopg.connect(libpq_url(empty_database_url)) as connection:
        versions = [row[0] for row in connection.execute("select version_num from alembic_version")]
        column = connection.execute(
            "select is_nullable from information_schema.columns where table_name = 'trials' and column_name = 'agent_build'"
        ).fetchone()
        index = connection.execute("select indexdef from pg_indexes where indexname = 'ix_trials_agent_build'").fetchone()
    assert versions == [upgrade_image.revision]
    assert column == ("YES",)
    assert index is not None and "(agent_build)" in index[0]


def test_release_two_init_containers_see_the_new_head(rehearsal: Rehearsal, upgrade_image: UpgradeImage) -> None:
    assert {name.rsplit("-", 1)[-1] for name in rehearsal.initialized} == {"api", "worker", "beat", "dashboard"}
    for name, (code, log) in rehearsal.initialized.items():
        assert code == 0 and f"database at head ({upgrade_image.revision})" in log, f"{name}: {log}"


def test_release_two_runs_the_new_image(rehearsal: Rehearsal, release_one: PlayedChart, upgrade_image: UpgradeImage) -> None:
    """Every Deployment's pod was replaced by one of the new image (not left running the old)."""
    assert {name.rsplit("-", 1)[-1] for name in rehearsal.replaced} == {"api", "worker", "beat", "dashboard"}
    for deployment in ("api", "worker", "beat", "dashboard"):
        image = podman("inspect", "--format", "{{.ImageName}}", release_one.container(deployment, deployment))
        assert image.stdout.strip() == upgrade_image.image, (deployment, image.stdout, image.stderr)


def test_every_trial_in_flight_is_stored_once(rehearsal: Rehearsal, empty_database_url: str) -> None:
    """Nothing left in the spools, nothing refused, and the database holds each trial the
    producer made exactly once: none lost in the swap, none doubled by a retried batch."""
    assert rehearsal.backlog == 0 and rehearsal.rejected == 0
    with psycopg.connect(libpq_url(empty_database_url)) as connection:
        stored = [
            str(row[0]) for row in connection.execute("select trial_id from trials where probe_id = %s", (rehearsal.probe_id,))
        ]
    assert len(stored) == len(rehearsal.produced) == len(set(stored))
    assert set(stored) == set(rehearsal.produced)


def test_every_trial_in_flight_is_joined(rehearsal: Rehearsal, release_one: PlayedChart, empty_database_url: str) -> None:
    """The worker's queue (Redis) outlives the worker: what release 1 received and did not join
    yet, release 2's worker joins."""

    def joined() -> bool:
        with psycopg.connect(libpq_url(empty_database_url)) as connection:
            row = connection.execute("select count(joined_at) from trials where probe_id = %s", (rehearsal.probe_id,)).fetchone()
        return row is not None and row[0] == len(rehearsal.produced)

    wait_for(
        joined, timeout=PHASE_TIMEOUT_S, what="every trial joined", detail=lambda: release_one.logs("worker", "worker")[-3000:]
    )


def test_no_release_logs_an_error(rehearsal: Rehearsal, release_one: PlayedChart) -> None:
    """Release 1 -- on the new schema from the hook on, then stopped -- and release 2 log no error
    in any container (the API's, the worker's, beat's and the dashboard's)."""
    logs = {}
    for deployment, replaced in rehearsal.replaced.items():
        for container, log in replaced.old_logs.items():
            logs[f"release 1 {container}"] = log
            logs[f"release 2 {container}"] = release_one.logs(deployment, container)
    assert len(logs) == 8
    for name, log in logs.items():
        errors = [line for line in log.splitlines() if ERROR_LINE.search(line)]
        assert not errors, f"{name}:\n" + "\n".join(errors[:20])


def test_the_swap_is_transient_and_measured(rehearsal: Rehearsal) -> None:
    """The uploads the API did not take were retried until taken (the spools drained, above);
    how many, with what, and how long the API was not there, for docs/deployment.md."""
    failed = [attempt for attempt in rehearsal.attempts if not taken(attempt)]
    # Refused for being away or busy, never for the batch (4xx) or a fault (500).
    assert all(attempt.status in (None, 502, 503, 504) for attempt in failed), collections.Counter(a.status for a in failed)
    # Each uploader's last upload was taken: every retried batch got through in the end.
    for path in {attempt.path for attempt in rehearsal.attempts}:
        assert taken([attempt for attempt in rehearsal.attempts if attempt.path == path][-1]), path
    unreachable_s, unreachable_polls = longest_gap([(at, status is not None) for at, status in rehearsal.readiness], True)
    not_ready_s, not_ready_polls = longest_gap(rehearsal.readiness, 200)
    measured = {
        "trials_produced": len(rehearsal.produced),
        "uploads": len(rehearsal.attempts),
        "retries": len(failed),
        "retries_by_outcome": {
            str(status or "unreachable"): count for status, count in collections.Counter(a.status for a in failed).items()
        },
        "uploads_refused_longest_s": round(longest_refusal(rehearsal.attempts), 1),
        "api_unreachable_longest_s": round(unreachable_s, 1),
        "api_not_ready_longest_s": round(not_ready_s, 1),
        "readyz_polls": len(rehearsal.readiness),
        "readyz_unreachable_polls": unreachable_polls,
        "readyz_not_200_polls": not_ready_polls,
        "phases_s": rehearsal.phases,
        "replaced_s": {name.rsplit("-", 1)[-1]: round(r.seconds, 1) for name, r in rehearsal.replaced.items()},
    }
    UPGRADE_ARTIFACT.parent.mkdir(exist_ok=True)
    UPGRADE_ARTIFACT.write_text(json.dumps(measured, indent=2) + "\n")
    print(f"\nchart upgrade rehearsal: {json.dumps(measured)}")
