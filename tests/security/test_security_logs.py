"""No secret in any log: a full run (enroll, campaign, fetch, upload, heartbeat, join) with DEBUG
logging of the API, a Celery worker, the origin and the probe; every log is searched for every
token and secret."""

from __future__ import annotations

import datetime as dt
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx
from sqlalchemy import text
from sqlalchemy.engine import Engine
from testkit import bearer, free_base_port, stop_process

REPO = Path(__file__).resolve().parents[2]
IWSCOPE = [sys.executable, "-m", "iwscope.cli"]
IWPROBE = [sys.executable, "-m", "iwprobe", "--log-level", "DEBUG"]


def _token(env: dict[str, str], kind: str) -> str:
    completed = subprocess.run(
        [*IWSCOPE, "token", "create", "--kind", kind, "--label", "log-test"],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=True,
    )
    return completed.stdout.strip()


def test_no_secret_in_debug_logs_of_a_full_run(
    service_env: dict[str, str], api_server_factory, db_engine: Engine, tmp_path: Path
) -> None:
    queue = f"iwscope-sec-logs-{secrets.token_hex(4)}"
    env = {**service_env, "IWSCOPE_LOG_LEVEL": "DEBUG", "IWSCOPE_CELERY_QUEUE": queue}
    api = api_server_factory(IWSCOPE_LOG_LEVEL="DEBUG", IWSCOPE_CELERY_QUEUE=queue)
    logs: dict[str, Path] = {"api": api.log_path}
    logs["worker"] = tmp_path / "worker.log"
    with open(logs["worker"], "wb") as log:
        worker = subprocess.Popen(
            [*IWSCOPE, "worker", "--concurrency", "1"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO
        )
    processes = [worker]
    try:
        enroll_token, origin_token, admin_token = (_token(service_env, kind) for kind in ("enroll", "origin", "admin"))
        region = f"sec-logs-{secrets.token_hex(3)}"
        base = free_base_port()
        origin_dir, probe_dir = tmp_path / "origin", tmp_path / "probe"

        def iwprobe(name: str, *args: str, timeout: float = 120) -> None:
            logs[name] = tmp_path / f"{name}.log"
            with open(logs[name], "wb") as log:
                completed = subprocess.run([*IWPROBE, *args], stdout=log, stderr=subprocess.STDOUT, cwd=REPO, timeout=timeout)
            assert completed.returncode == 0, logs[name].read_text()

        iwprobe(
            "origin-enroll",
            "origin",
            "enroll",
            "--collector",
            api.url,
            "--token",
            origin_token,
            "--name",
            f"log-origin-{region}",
            "--region",
            region,
            "--host",
            "127.0.0.1",
            "--arms",
            "3,10",
            "--base-port",
            str(base),
            "--state-dir",
            str(origin_dir),
        )
        logs["origin"] = tmp_path / "origin.log"
        with open(logs["origin"], "wb") as log:
            origin = subprocess.Popen(
                [
                    *IWPROBE,
                    "origin",
                    "--bind",
                    "127.0.0.1",
                    "--arms",
                    "3,10",
                    "--base-port",
                    str(base),
                    "--state-dir",
                    str(origin_dir),
                    "--request-timeout",
                    "5",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        processes.append(origin)
        iwprobe(
            "probe-enroll",
            "enroll",
            "--collector",
            api.url,
            "--token",
            enroll_token,
            "--name",
            f"log-probe-{region}",
            "--region",
            region,
            "--state-dir",
            str(probe_dir),
        )
        origin_id = (origin_dir / "origin.json").read_text().split('"id": "', 1)[1].split('"', 1)[0]
        now = dt.datetime.now(dt.UTC)
        created = httpx.post(
            f"{api.url}/api/v1/campaigns",
            headers=bearer(admin_token),
            timeout=30,
            json={
                "name": f"log test {region}",
                "origin_ids": [origin_id],
                "arms": [3, 10],
                "sizes": [10_000, 50_000],
                "repetitions": 2,
                "interval_s": 0,
                "probe_regions": [region],
                "calibrate": False,
                "starts_at": (now - dt.timedelta(minutes=1)).isoformat(),
                "ends_at": (now + dt.timedelta(hours=1)).isoformat(),
            },
        )
        assert created.status_code == 201, created.text
        campaign_id = created.json()["id"]
        iwprobe(
            "probe-run",
            "run",
            "--once",
            "--state-dir",
            str(probe_dir),
            "--campaign",
            str(campaign_id),
            "--heartbeat-s",
            "0",
            "--upload-timeout",
            "60",
            "--trial-gap",
            "0",
        )
        # The origin uploads its observations; the worker joins them to the trials.
        deadline = time.monotonic() + 60
        while True:
            with db_engine.connect() as connection:
                trials, joined = connection.execute(
                    text("SELECT count(*), count(joined_at) FROM trials WHERE campaign_id = :c"), {"c": campaign_id}
                ).one()
            if trials == 8 and joined == 8:
                break
            assert time.monotonic() < deadline, (trials, joined, logs["worker"].read_text()[-3000:])
            time.sleep(0.5)
    finally:
        for process in processes:
            stop_process(process, timeout=20)
        api.stop()
    probe_secret = (probe_dir / "probe.json").read_text().split('"credential": "', 1)[1].split('"', 1)[0]
    origin_secret = (origin_dir / "origin.json").read_text().split('"credential": "', 1)[1].split('"', 1)[0]
    secrets_to_find = {
        "enroll token": enroll_token,
        "origin token": origin_token,
        "admin token": admin_token,
        "probe credential": probe_secret.split(".", 1)[1],
        "origin credential": origin_secret.split(".", 1)[1],
    }
    assert all(len(value) >= 40 for value in secrets_to_find.values())
    texts = {name: path.read_text(errors="replace") for name, path in logs.items()}
    # The logs are real DEBUG logs of the run, not empty files.
    # (The API logs little even at DEBUG: no access log, so no request line or header is ever written.)
    assert "Started server process" in texts["api"]
    assert all(texts[name].strip() for name in ("worker", "origin", "probe-run", "probe-enroll"))

    # Both uploaders logged their uploads: 8 trials from the probe, 8 observations from the
    # origin, in however many batches (a round's trials may go up before the next round).
    def uploaded(text: str) -> int:
        return sum(int(count) for count in re.findall(r"uploaded (\d+) records", text))

    assert (uploaded(texts["probe-run"]), uploaded(texts["origin"])) == (8, 8), (texts["probe-run"], texts["origin"])
    debug_lines = {name: content.count(" DEBUG ") + content.count("DEBUG/") for name, content in texts.items()}
    assert "Task" in texts["worker"] or "task" in texts["worker"]
    leaks = [
        (secret_name, log_name)
        for secret_name, value in secrets_to_find.items()
        for log_name, content in texts.items()
        if value in content or value[:16] in content
    ]
    sizes = {name: len(content) for name, content in texts.items()}
    print(f"searched {sum(sizes.values())} bytes of logs {sizes} (DEBUG lines {debug_lines}) for {len(secrets_to_find)} secrets")
    assert leaks == []
