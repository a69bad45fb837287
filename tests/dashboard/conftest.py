"""Fixtures of the dashboard's browser tests.

* ``dashboard_db``: a database of its own (``iwscope_test_dash_<id>``, migrated to head with
  Alembic, dropped at the end) holding the seeded study, committed, with the roll-ups built by
  the analysis module's real refresh. Its own database, not the session's ``database_url``:
  the dashboard runs in another process, so the seed must be committed, and committed rows
  would change what other parts' tests compute from the shared database.
* ``dashboard_server``: ``iwscope dashboard --port <free>`` (gunicorn) as a subprocess.
* ``browser``: Debian's Chromium driven headless by Playwright (never ``playwright install``),
  launched as the page check launches it (``iwscope_dashboard.pagecheck``).
* ``pages``: page modules imported for their callbacks, without a server or a browser.
"""

from __future__ import annotations

import importlib
import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

import dash
import httpx
import pytest
from study_seed import SeededDatabase

from iwscope_dashboard.pagecheck import CHROMIUM, CHROMIUM_ARGS

REPO = pathlib.Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "artifacts" / "screenshots"
STARTUP_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def dashboard_db(study_db: SeededDatabase) -> SeededDatabase:
    """The seeded study (tests/conftest.py ``study_db``) the dashboard's figures are checked on."""
    return study_db


@dataclass
class DashboardServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: pathlib.Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@pytest.fixture(scope="session")
def dashboard_server(dashboard_db: SeededDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardServer]:
    port = _free_port()
    log_path = tmp_path_factory.mktemp("dashboard") / "dashboard.log"
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env |= {"DATABASE_URL": dashboard_db.url, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "iwscope.cli", "dashboard", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    server = DashboardServer(f"http://127.0.0.1:{port}", process, log_path)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"iwscope dashboard exited with {process.returncode}:\n{server.log()}")
            try:
                if httpx.get(server.url + "/_dash-layout", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"iwscope dashboard not up within {STARTUP_TIMEOUT_S} s:\n{server.log()}")
            time.sleep(0.2)
        yield server
    finally:
        _stop(process)


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs Debian's chromium")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS), headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="session")
def browser_context(browser: object) -> Iterator[object]:
    """One context for the session, so the pages share the HTTP cache (Dash's bundles load once)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
    try:
        yield context
    finally:
        context.close()


@pytest.fixture
def page(browser_context: object, dashboard_server: DashboardServer) -> Iterator[object]:
    """A fresh browser tab; console errors and failed requests are collected on it."""
    tab = browser_context.new_page()  # type: ignore[attr-defined]
    problems: list[str] = []
    tab.on(
        "console", lambda message: problems.append(f"console {message.type}: {message.text}") if message.type == "error" else None
    )
    tab.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    tab.on("requestfailed", lambda request: problems.append(f"request failed: {request.url}"))
    tab.problems = problems  # type: ignore[attr-defined]
    try:
        yield tab
    finally:
        tab.close()


@pytest.fixture(scope="session")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModuleType]:
    """The page modules whose callbacks tests call in process (``dash.register_page`` needs an app
    with pages: one with an empty pages folder)."""
    if not dash.page_registry:
        empty: pathlib.Path = tmp_path_factory.mktemp("no-pages")
        dash.Dash("iwscope_page_modules_test", use_pages=True, pages_folder=str(empty))
    names = ("overview", "latency", "regions", "cost", "fairness")
    return {name: importlib.import_module(f"iwscope_dashboard.pages.{name}") for name in names}


@pytest.fixture(scope="session", autouse=True)
def _screenshot_dir() -> pathlib.Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
