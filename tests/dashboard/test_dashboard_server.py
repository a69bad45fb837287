"""The dashboard's server side: the CLI's start-up checks, the WSGI entry point, database loss."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from testenv import drop_database, temporary_database

REPO = pathlib.Path(__file__).resolve().parents[2]


def _env_without_database() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_until_up(url: str, process: subprocess.Popen[bytes], log: pathlib.Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited with {process.returncode}:\n{log.read_text(errors='replace')}")
        try:
            if httpx.get(url + "/_dash-layout", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"server not up in 60 s:\n{log.read_text(errors='replace')}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def test_cli_refuses_to_start_without_a_database() -> None:
    missing = subprocess.run(
        [sys.executable, "-m", "iwscope.cli", "dashboard", "--port", "1"],
        env=_env_without_database(),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert missing.returncode != 0 and "DATABASE_URL" in missing.stderr
    unreachable = subprocess.run(
        [
            sys.executable,
            "-m",
            "iwscope.cli",
            "dashboard",
            "--port",
            "1",
            "--database-url",
            "postgresql+psycopg://postgres@127.0.0.1:9/none?connect_timeout=2",
        ],
        env=_env_without_database(),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert unreachable.returncode != 0 and "cannot reach the database" in unreachable.stderr


def test_wsgi_entry_point_serves_the_app_and_the_csv(dashboard_db: Any, tmp_path: pathlib.Path) -> None:
    """``gunicorn iwscope_dashboard.wsgi:server`` (production) reads DATABASE_URL."""
    port = _free_port()
    log = tmp_path / "gunicorn.log"
    env = _env_without_database() | {"DATABASE_URL": dashboard_db.url}
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "--no-control-socket",
                "--bind",
                f"127.0.0.1:{port}",
                "iwscope_dashboard.wsgi:server",
            ],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_until_up(url, process, log)
        page = httpx.get(url + "/regions", timeout=10.0)
        assert page.status_code == 200 and "iwscope" in page.text
        assert httpx.get(url + "/assets/topojson/world_110m.json", timeout=10.0).json()["type"] == "Topology"
        csv = httpx.get(url + "/download/trials.csv?campaign=" + str(dashboard_db.summary.campaign_ids["pilot"]), timeout=30.0)
        assert csv.status_code == 200
        assert len(csv.text.splitlines()) - 1 == dashboard_db.summary.n_trials_by_campaign["pilot"]
    finally:
        _stop(process)


@pytest.fixture
def doomed_database(test_id: str) -> Iterator[str]:
    """A migrated, empty database the test drops while a dashboard uses it."""
    with temporary_database(f"iwscope_test_dash_doomed_{test_id}", migrated=True) as url:
        yield url


def test_empty_database_then_lost_database_give_messages_not_errors(
    doomed_database: str, browser: Any, tmp_path: pathlib.Path
) -> None:
    port = _free_port()
    log = tmp_path / "dashboard.log"
    env = _env_without_database() | {"DATABASE_URL": doomed_database}
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "iwscope.cli", "dashboard", "--port", str(port)],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    context = browser.new_context()
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_until_up(url, process, log)
        tab = context.new_page()
        tab.goto(url + "/")
        tab.wait_for_selector("#overview-status .iw-status-empty", timeout=20_000)
        assert "No trials match these filters" in tab.inner_text("#overview-status")
        tab.goto(url + "/probes")
        tab.wait_for_selector("#probes-status .iw-status-empty", timeout=20_000)
        assert "No probes enrolled yet" in tab.inner_text("#probes-status")

        drop_database(doomed_database.rsplit("/", 1)[1])
        tab.goto(url + "/sizes")
        tab.wait_for_selector("#sizes-status .iw-status-error", timeout=20_000)
        assert "The database did not answer" in tab.inner_text("#sizes-status")
        assert process.poll() is None  # the server survives and answers
    finally:
        context.close()
        _stop(process)
