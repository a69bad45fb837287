"""Real older probe builds against the newest collector (issue 37, step 4).

Operators do not upgrade every probe VM when the collector is upgraded, so the collector
promises to take uploads of every wire version in ``wire.ACCEPTED_WIRE_VERSIONS`` (the
compatibility window, docs/deployment.md "Older probes and the newest collector").  Hand-made
documents with an older ``wire_version`` (tests/collector) check the models; they cannot show
that the code an operator actually ran still works: its enrollment, its schedule pull (probes
before wire v3 never said their version), the schedule it parses, its uploads.  So for every
older wire version this test checks out the probe's sources as they were in the last commit of
that version (found in git history, so the next version bump adds the current one here by
itself), builds them into a zipapp with ``probe/deploy/build-pyz.sh`` as operators do, runs it
with the operators' ``/usr/bin/python3 -I`` in a network namespace, enrolls it with this
checkout's API, lets it run a campaign against the current origin and checks in PostgreSQL
that its trials were stored and joined by this checkout's worker, and that the schedule it
cached is the one the collector serves a probe of its version.

The origin is the current one for every old probe: an old probe fetches ``/obj/N`` from a
listener per IW, which every origin since wire v1 serves the same way.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import pytest
from testenv import libpq_url
from testkit import create_campaign, stop_process, wait_for

from iwprobe import wire
from iwscope.probes.services import DEFAULT_PROBE_WIRE_VERSION, _level

REPO = pathlib.Path(__file__).resolve().parents[2]
# The namespaces of the probe tests (tests/probe/iwprobe_testkit.py), one set for the module.
sys.path.insert(0, str(REPO / "tests" / "probe"))

from iwprobe_testkit import FleetNet, make_fleet_net, make_netns_pair, wait_for_port  # noqa: E402

WIRE_PY = "probe/src/iwprobe/wire.py"
BUILD_SCRIPT = "probe/deploy/build-pyz.sh"
#: How operators run the zipapp (probe/deploy/systemd/iwprobe.service): Debian's Python, isolated,
#: so nothing of this checkout's virtualenv (where the current iwprobe is installed) is importable.
OPERATOR_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else shutil.which("python3") or "python3"
ARMS = [3, 10]
SIZE = 5000
REPETITIONS = 2
#: Trials one old probe measures: rounds x arms x one size.
EXPECTED_TRIALS = REPETITIONS * len(ARMS)
BASE_PORT = 8500
#: Prints where the zipapp's wire module comes from and its version (``python3 -I -c`` this ``PYZ``).
WIRE_OF_PYZ = "import sys; sys.path.insert(0, sys.argv[1]); from iwprobe import wire; print(wire.__file__, wire.WIRE_VERSION)"
#: Generous bounds (the box may be busy with other suites); none of them is a measured claim.
RUN_TIMEOUT_S = 240.0
JOIN_TIMEOUT_S = 120.0


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True, timeout=60).stdout


def _version_at(commit: str) -> int | None:
    """``WIRE_VERSION`` of the probe's wire module at ``commit`` (``None``: none there)."""
    try:
        source = _git("show", f"{commit}:{WIRE_PY}")
    except subprocess.CalledProcessError:
        return None
    match = re.search(r"^WIRE_VERSION = (\d+)$", source, re.MULTILINE)
    return int(match.group(1)) if match else None


@functools.cache
def older_versions() -> dict[int, str] | str:
    """Each wire version older than the current one -> the newest commit whose wire module has it
    (the parent of the commit that bumped it); or why history cannot say (a shallow clone, no git)."""
    try:
        if _git("rev-parse", "--is-shallow-repository").strip() == "true":
            return "a shallow clone: the older probes' sources are not in its history (clone with full history)"
        bumps = _git("log", "--format=%H", "-G^WIRE_VERSION = ", "--", WIRE_PY).split()
    except (OSError, subprocess.SubprocessError) as error:
        return f"no git history of {WIRE_PY} ({error})"
    found: dict[int, str] = {}
    # A version bump not committed yet (the working tree's wire module is ahead of HEAD's): HEAD is
    # the last commit of the version it has.
    head = _version_at("HEAD")
    if head is not None and head < wire.WIRE_VERSION:
        found[head] = _git("rev-parse", "HEAD").strip()
    for commit in bumps:  # newest first: the first commit seen of a version is its last
        after, before = _version_at(commit), _version_at(f"{commit}^")
        if before is not None and before != after and before < wire.WIRE_VERSION:
            found.setdefault(before, _git("rev-parse", f"{commit}^").strip())
    return dict(sorted(found.items()))


def _params() -> list[Any]:
    """One case per older version the collector accepts (a version dropped from the window is not a
    promise any more).  The window's two ends -- the oldest accepted version and the newest older
    one -- run in ``make test`` and CI; the versions between them are marked ``deploy`` (``make
    deploy-check``): the suite's 20 minutes have no room for seven builds."""
    versions = older_versions()
    if isinstance(versions, str):
        return [pytest.param(0, "", marks=pytest.mark.skip(reason=versions), id="wire-history")]
    accepted = {version: commit for version, commit in versions.items() if version in wire.ACCEPTED_WIRE_VERSIONS}
    ends = {min(accepted), max(accepted)} if accepted else set()
    return [
        pytest.param(version, commit, id=f"wire-v{version}", marks=() if version in ends else pytest.mark.deploy)
        for version, commit in accepted.items()
    ]


def test_history_holds_every_accepted_older_version() -> None:
    """The parametrization is not silently empty or gappy: every accepted version below the current
    one was found in history (one the collector accepts but no probe ever spoke would be a promise
    nothing can check)."""
    versions = older_versions()
    if isinstance(versions, str):
        pytest.skip(versions)
    accepted_older = {version for version in wire.ACCEPTED_WIRE_VERSIONS if version < wire.WIRE_VERSION}
    assert accepted_older and accepted_older <= set(versions), (sorted(accepted_older), versions)


@dataclass
class OldBuild:
    """An older probe's zipapp and what its sources say."""

    version: int
    commit: str
    pyz: pathlib.Path
    #: Which build script made it: the one of its own commit or, before that existed, the current one.
    script: str
    #: Whether its schedule pull says ``?wire_version=`` (probes before wire v3 did not).
    says_version: bool


def build_old_probe(version: int, commit: str, directory: pathlib.Path) -> OldBuild:
    """The probe's sources at ``commit`` built into a zipapp as operators build it."""
    tree = directory / "tree"
    tree.mkdir()
    has_script = (
        subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}:{BUILD_SCRIPT}"], check=False).returncode == 0
    )
    paths = ["probe/src/iwprobe", *([BUILD_SCRIPT] if has_script else [])]
    archive = directory / "tree.tar"
    with open(archive, "wb") as output:
        subprocess.run(["git", "-C", str(REPO), "archive", commit, *paths], stdout=output, check=True, timeout=120)
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    if not has_script:
        (tree / BUILD_SCRIPT).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / BUILD_SCRIPT, tree / BUILD_SCRIPT)
    pyz = directory / f"iwprobe-wire{version}.pyz"
    built = subprocess.run(["sh", str(tree / BUILD_SCRIPT), str(pyz)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    agent = (tree / "probe/src/iwprobe/_agent.py").read_text()
    return OldBuild(version, commit, pyz, f"{commit[:7]}:{BUILD_SCRIPT}" if has_script else "current", "?wire_version=" in agent)


@dataclass
class Collector:
    """The newest collector (this checkout's API and worker), a current origin enrolled with it in
    one namespace, and the namespace the old probes run in."""

    net: FleetNet
    api_url: str
    api_port: int
    admin_token: str
    enroll_token: str
    database_url: str
    origin_id: str
    origin_log: pathlib.Path

    def collector_url(self) -> str:
        return self.net.collector_url(self.net.probe_ns, self.api_port)


@pytest.fixture(scope="module")
def collector(
    _api_server_process: Any,
    celery_worker: Any,
    admin_token: str,
    enroll_token: str,
    origin_token: str,
    database_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Collector]:
    if os.geteuid() != 0:
        pytest.skip("the origin's per-IW routes and the namespaces need root")
    api = _api_server_process
    api.start()
    tmp = tmp_path_factory.mktemp("older-probes-origin")
    state = tmp / "state"
    log_path = tmp / "origin.log"
    common = ["--arms", ",".join(map(str, ARMS)), "--base-port", str(BASE_PORT), "--state-dir", str(state)]
    current = [sys.executable, "-m", "iwprobe", "--log-level", "INFO", "origin"]
    with make_netns_pair() as pair, make_fleet_net(pair) as net:
        enrolled = net.run(
            net.origin_ns,
            [
                *current,
                "enroll",
                *common,
                "--collector",
                net.collector_url(net.origin_ns, api.port),
                "--token",
                origin_token,
                "--name",
                "origin-current",
                "--region",
                "lab",
                "--host",
                net.origin_address,
            ],
        )
        assert enrolled.returncode == 0, enrolled.stderr
        with open(log_path, "ab") as log:
            origin = net.popen(
                net.origin_ns,
                [*current, "serve", "--setup-routes", *common, "--bind", net.origin_address],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        try:
            for iw in ARMS:
                wait_for_port(net, net.probe_ns, net.origin_address, BASE_PORT + iw, timeout_s=30)
            origin_id = json.loads((state / "origin.json").read_text())["id"]
            yield Collector(net, api.url, api.port, admin_token, enroll_token, database_url, origin_id, log_path)
        finally:
            stop_process(origin)


def _query(database_url: str, sql: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(libpq_url(database_url)) as connection:
        return connection.execute(sql, params).fetchall()


def _campaign(collector: Collector, region: str) -> int:
    """A plain paired campaign (no feature of a later wire version) for the old probe's region only."""
    with httpx.Client(base_url=collector.api_url, timeout=60) as client:
        created = create_campaign(
            client,
            collector.admin_token,
            collector.origin_id,
            name=f"older-probe-{secrets.token_hex(3)}",
            arms=ARMS,
            sizes=[SIZE],
            probe_regions=[region],
            repetitions=REPETITIONS,
            interval_s=0.0,
            calibrate=False,
        )
    return int(created["id"])


def _entry(schedule: dict[str, Any], campaign: int) -> dict[str, Any]:
    entries = [entry for entry in schedule["campaigns"] if entry["campaign_id"] == campaign]
    assert len(entries) == 1, schedule
    return entries[0]


@pytest.mark.parametrize(("version", "commit"), _params())
def test_older_probe_uploads_to_the_newest_collector(
    version: int, commit: str, collector: Collector, tmp_path: pathlib.Path
) -> None:
    build = build_old_probe(version, commit, tmp_path)
    old = ["ip", "netns", "exec", collector.net.probe_ns, OPERATOR_PYTHON, "-I", str(build.pyz), "--log-level", "INFO"]
    print(f"wire v{version}: commit {commit[:10]}, built by {build.script}, says its version: {build.says_version}", flush=True)

    # The build is that version's probe, and only it is importable (not this checkout's iwprobe).
    sanity = subprocess.run(
        [OPERATOR_PYTHON, "-I", "-c", WIRE_OF_PYZ, str(build.pyz)], capture_output=True, text=True, timeout=60
    )
    assert sanity.returncode == 0, sanity.stderr
    module_file, said = sanity.stdout.split()
    assert module_file.startswith(str(build.pyz)) and int(said) == version
    for arguments in (["version"], ["--help"]):
        answer = subprocess.run([OPERATOR_PYTHON, "-I", str(build.pyz), *arguments], capture_output=True, text=True, timeout=60)
        assert answer.returncode == 0 and answer.stdout.strip(), answer.stderr
    assert "enroll" in answer.stdout and "run" in answer.stdout

    # Enrolled with the newest API by the old CLI (its flags have not changed since wire v1).
    region = f"old{version}-{secrets.token_hex(3)}"
    state = tmp_path / "probe-state"
    enrolled = subprocess.run(
        [
            *old,
            "enroll",
            "--state-dir",
            str(state),
            "--collector",
            collector.collector_url(),
            "--token",
            collector.enroll_token,
            "--name",
            f"probe-wire{version}",
            "--region",
            region,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert enrolled.returncode == 0, enrolled.stdout + enrolled.stderr
    credentials = json.loads((state / "probe.json").read_text())
    probe_id = credentials["id"]

    # One campaign for its region; the old probe fetches its schedule, measures, uploads, exits.
    campaign = _campaign(collector, region)
    log_path = tmp_path / "probe.log"
    with open(log_path, "wb") as log:
        run = subprocess.Popen(
            [*old, "run", "--once", "--state-dir", str(state), "--campaign", str(campaign), "--upload-timeout", "60"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        returncode = run.wait(timeout=RUN_TIMEOUT_S)
    finally:
        stop_process(run)
    probe_log = log_path.read_text(errors="replace")
    assert returncode == 0, probe_log[-5000:]
    # Nothing went wrong on the way: no failed schedule pull, heartbeat or upload, no rejected record.
    assert not re.search(r" (WARNING|ERROR|CRITICAL) |Traceback", probe_log), probe_log[-5000:]

    # Stored by the newest API: every trial, none failed, under the old probe's id.
    rows = _query(
        collector.database_url,
        "SELECT round, arm_iw, object_size, error_kind, total_us FROM trials WHERE campaign_id = %s AND probe_id = %s",
        campaign,
        probe_id,
    )
    assert len(rows) == EXPECTED_TRIALS, probe_log[-5000:]
    assert sorted(row[:3] for row in rows) == sorted((round_, iw, SIZE) for round_ in range(REPETITIONS) for iw in ARMS)
    assert all(row[3] is None and row[4] > 0 for row in rows), rows
    # ... and joined by the newest worker with the current origin's observations, each arm at its IW.
    wait_for(
        lambda: (
            _query(
                collector.database_url,
                "SELECT count(*) FROM trials WHERE campaign_id = %s AND joined_at IS NOT NULL "
                "AND server_snd_cwnd_at_accept = arm_iw",
                campaign,
            )[0][0]
            == EXPECTED_TRIALS
        ),
        JOIN_TIMEOUT_S,
        0.25,
        f"the join of campaign {campaign}",
        lambda: f"--- origin\n{collector.origin_log.read_text(errors='replace')[-3000:]}",
    )
    assert _query(collector.database_url, "SELECT count(*) FROM trials WHERE probe_id = %s", probe_id)[0][0] == EXPECTED_TRIALS
    # Its heartbeat too (sent after the last upload): everything measured, nothing left in its spool.
    heartbeat = _query(collector.database_url, "SELECT last_heartbeat FROM probes WHERE id = %s", probe_id)[0][0]
    assert heartbeat["trials_measured"] == EXPECTED_TRIALS and heartbeat["spool_backlog"] == 0, heartbeat

    # The schedule it was served (cached in its state directory) is the one the collector gives a
    # probe of its version: probes that do not say theirs are taken for DEFAULT_PROBE_WIRE_VERSION.
    cached = json.loads((state / "schedule.json").read_text())
    served_entry = _entry(cached.get("schedule", cached), campaign)
    said_version = version if build.says_version else DEFAULT_PROBE_WIRE_VERSION
    assert build.says_version == (version >= 3)
    query = {"wire_version": str(version)} if build.says_version else {}
    now = httpx.get(
        f"{collector.api_url}{wire.PROBE_SCHEDULE_PATH.format(probe_id=probe_id)}",
        params=query,
        headers={"Authorization": f"Bearer {credentials['credential']}"},
        timeout=60,
    )
    assert now.status_code == 200, now.text
    assert served_entry == _entry(now.json(), campaign)
    # Level 2 (before v3) leaves out the origin's UDP echo port, which its probes never used.
    level = _level(said_version)
    assert (served_entry["targets"][0]["echo_port"] is not None) == (level >= 3), served_entry
    print(f"wire v{version}: {len(rows)} trials stored and joined, schedule level {level}", flush=True)
