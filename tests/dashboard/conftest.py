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
from collections.abc import Iterator
from types import ModuleType

import dash
import pytest
from study_seed import SeededDatabase
from testkit import DashboardServer, running_dashboard

from iwscope_dashboard.pagecheck import CHROMIUM, CHROMIUM_ARGS

REPO = pathlib.Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "artifacts" / "screenshots"


@pytest.fixture(scope="session")
def dashboard_db(study_db: SeededDatabase) -> SeededDatabase:
    """The seeded study (tests/conftest.py ``study_db``) the dashboard's figures are checked on."""
    return study_db


@pytest.fixture(scope="session")
def dashboard_server(dashboard_db: SeededDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardServer]:
    with running_dashboard(dashboard_db.url, tmp_path_factory.mktemp("dashboard") / "dashboard.log") as server:
        yield server


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
