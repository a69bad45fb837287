"""The ``iwscope`` CLI against the session database: tokens, probes list, campaigns create."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import httpx
from testkit import Enrolled, bearer, enroll_probe

IWSCOPE = [sys.executable, "-m", "iwscope.cli"]


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*IWSCOPE, *args], env=env, capture_output=True, text=True, timeout=60)


def test_token_create_prints_the_token_alone_and_it_works(service_env: dict[str, str], client: httpx.Client) -> None:
    completed = run(service_env, "token", "create", "--kind", "enroll", "--label", "cli test")
    assert completed.returncode == 0, completed.stderr
    token = completed.stdout
    assert token.endswith("\n") and token.count("\n") == 1 and " " not in token.strip()
    probe = enroll_probe(client, token.strip(), name="cli-made")
    assert probe.id
    bad = run(service_env, "token", "create", "--kind", "root")
    assert bad.returncode != 0 and bad.stdout == ""


def test_probes_list_shows_fleet(service_env: dict[str, str], client: httpx.Client, enroll_token: str) -> None:
    probe = enroll_probe(client, enroll_token, region="af-south", name="nairobi-7")
    heartbeat = {"version": "9.9.9", "spool_backlog": 4242, "spool_bytes": 1, "uptime_s": 1, "trials_measured": 1}
    assert client.post(f"/api/v1/probes/{probe.id}/heartbeat", json=heartbeat, headers=probe.headers).status_code == 204
    completed = run({**service_env, "COLUMNS": "200"}, "probes", "list")
    assert completed.returncode == 0, completed.stderr
    line = next(row for row in completed.stdout.splitlines() if "nairobi-7" in row)
    assert "af-south" in line and "9.9.9" in line and "4242" in line


def test_campaigns_create(service_env: dict[str, str], client: httpx.Client, origin: Enrolled, admin_token: str) -> None:
    completed = run(
        service_env,
        "campaigns",
        "create",
        "--name",
        "cli",
        "--origin",
        origin.id,
        "--arms",
        "3,10",
        "--sizes",
        "1000,20000",
        "--repetitions",
        "4",
        "--region",
        "eu-west",
    )
    assert completed.returncode == 0, completed.stderr
    campaign_id = int(completed.stdout.strip())
    stored = client.get(f"/api/v1/campaigns/{campaign_id}", headers=bearer(admin_token)).json()
    assert (stored["arms"], stored["sizes"], stored["repetitions"], stored["probe_regions"]) == (
        [3, 10],
        [1000, 20000],
        4,
        ["eu-west"],
    )
    refused = run(service_env, "campaigns", "create", "--name", "x", "--origin", origin.id, "--arms", "3")
    assert refused.returncode != 0 and "exactly one of sizes and size_dist" in refused.stderr
    # labelled arms (wire v9: 10q, IW 10 over HTTP/3) go through as labels
    labelled = run(
        service_env, "campaigns", "create", "--name", "h3", "--origin", origin.id, "--arms", "3,10,10q", "--sizes", "1000"
    )
    assert labelled.returncode == 0, labelled.stderr
    stored = client.get(f"/api/v1/campaigns/{int(labelled.stdout.strip())}", headers=bearer(admin_token)).json()
    assert (stored["arms"], stored["arm_labels"]) == ([3, 10, 10], ["3", "10", "10q"])
    wrong = run(service_env, "campaigns", "create", "--name", "x", "--origin", origin.id, "--arms", "3,q10", "--sizes", "1")
    assert wrong.returncode != 0 and "q10" in wrong.stderr


def test_services_start_on_a_taken_port_says_so_in_one_line_and_exits_non_zero() -> None:
    """Another PostgreSQL (here: any listener) on the stack's port: ``services start`` prints
    nothing on stdout (``scripts/test.sh`` exports what it prints) and one sentence naming the port
    and what to do on stderr -- no traceback -- and exits 1, so the suite does not run against a
    server that is not its own."""
    import os
    import shutil
    import socket
    import uuid

    data_dir = pathlib.Path("/var/lib/iwscope") / f"cli-test-{uuid.uuid4().hex[:8]}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {
            **os.environ,
            "IWSCOPE_SERVICES_DIR": str(data_dir),
            "IWSCOPE_RUN_DIR": str(data_dir / "run"),
            "IWSCOPE_LOCAL_PG_PORT": str(port),
            "IWSCOPE_LOCAL_REDIS_PORT": str(port),
        }
        try:
            completed = subprocess.run([*IWSCOPE, "services", "start"], env=env, capture_output=True, text=True, timeout=120)
        finally:
            shutil.rmtree(data_dir, ignore_errors=True)
    assert completed.returncode == 1, completed
    assert completed.stdout == ""
    assert f"port {port} is taken" in completed.stderr and "IWSCOPE_LOCAL_PG_PORT" in completed.stderr
    assert "Traceback" not in completed.stderr
