"""The Real users page (passive, real-user data) in a real dashboard process and headless Chromium.

A database of its own holds the seeded study of ``tests/realusers_seed.py`` (committed: the
dashboard is another process) and tokens of several kinds.  Anonymous requests to the page and
to its Dash callbacks get 401; wrong, revoked or other kinds of token get the same 401; a read
token -- through the sign-in form (an HttpOnly, SameSite=Strict session cookie) or as a bearer
token -- shows the tables and figures with the numbers of a hand computation, and "n too small"
for the arm seeded too small.  Public pages stay public.
"""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from realusers_seed import hand, insert_study
from sqlalchemy import create_engine, pool, text
from sqlalchemy.orm import Session
from testenv import temporary_database
from testkit import running_dashboard

from iwscope.auth.services import create_api_token, hash_secret
from iwscope_dashboard.access import COOKIE, SESSION_SECONDS, protected_callback, protected_path, session_cookie
from iwscope_dashboard.pagecheck import HAS_POINTS_JS

REPO = pathlib.Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "artifacts" / "screenshots"
TIMEOUT_MS = 30_000

TRACES_JS = """
(id) => {
    const plot = document.querySelector('#' + id + ' .js-plotly-plot');
    return plot.data.map((t) => ({name: t.name || '', x: Array.from(t.x || [], String),
                                   y: Array.from(t.y || [], (v) => v === null || v === undefined ? null : Number(v)),
                                   text: Array.isArray(t.text) ? t.text.map(String) : []}));
}
"""


@dataclass(frozen=True)
class Study:
    url: str
    database_url: str
    campaign_id: int
    read_token: str
    admin_token: str
    enroll_token: str
    records: list[dict[str, Any]]


@pytest.fixture(scope="module")
def study(test_id: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Study]:
    with temporary_database(f"iwscope_test_realusers_{test_id}", migrated=True) as url:
        engine = create_engine(url, poolclass=pool.NullPool)
        campaign_id, _server, phase0, phase1 = insert_study(engine)
        with Session(engine) as session:
            tokens = {kind: create_api_token(session, kind, "pytest real users") for kind in ("read", "admin", "enroll")}
            session.commit()
        engine.dispose()
        log = tmp_path_factory.mktemp("realusers") / "dashboard.log"
        with running_dashboard(url, log, "--cache-seconds", "0") as server:
            yield Study(server.url, url, campaign_id, tokens["read"], tokens["admin"], tokens["enroll"], phase0 + phase1)


def callback_body(output: str, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """A Dash callback request as the browser sends it."""
    return {
        "output": output,
        "outputs": {"id": output.split(".")[0], "property": output.split(".")[1]},
        "inputs": inputs,
        "changedPropIds": [],
        "state": [],
    }


REGIONS_CALLBACK = callback_body(
    "realusers-regions.children",
    [
        {"id": "realusers-filter-campaign", "property": "value", "value": None},
        {"id": "realusers-filter-dates", "property": "start_date", "value": None},
        {"id": "realusers-filter-dates", "property": "end_date", "value": None},
        {"id": "realusers-filter-region", "property": "value", "value": []},
        {"id": "realusers-filter-family", "property": "value", "value": ""},
        {"id": "realusers-filter-biased", "property": "value", "value": "include"},
    ],
)
ROUTER_CALLBACK = {
    "output": ".._pages_content.children..._pages_store.data..",
    "outputs": [{"id": "_pages_content", "property": "children"}, {"id": "_pages_store", "property": "data"}],
    "inputs": [
        {"id": "_pages_location", "property": "pathname", "value": "/real-users"},
        {"id": "_pages_location", "property": "search", "value": ""},
    ],
    "changedPropIds": ["_pages_location.pathname"],
    "state": [],
}


def post_callback(study: Study, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(study.url + "/_dash-update-component", json=body, timeout=60, headers=headers)


# ---- access -----------------------------------------------------------------------------------------


def test_which_requests_are_the_pages() -> None:
    for path in ("/real-users", "/real-users/", "/REAL-USERS", "/real%2Dusers", "/real-users/anything", "//real-users"):
        assert protected_path(path), path
    for path in ("/", "/regions", "/real-users/login", "/real-users/logout", "/real-userss", "/realusers"):
        assert not protected_path(path), path
    assert protected_callback(REGIONS_CALLBACK) and protected_callback(ROUTER_CALLBACK)
    for pathname in ("/Real-Users", "/real-users/?x=1", "/real%2dusers"):
        assert protected_callback(
            dict(ROUTER_CALLBACK, inputs=[{"id": "_pages_location", "property": "pathname", "value": pathname}])
        ), pathname
    public = dict(ROUTER_CALLBACK, inputs=[{"id": "_pages_location", "property": "pathname", "value": "/regions"}])
    other = callback_body("regions-tables.children", [{"id": "regions-filter-region", "property": "value", "value": []}])
    assert not protected_callback(public) and not protected_callback(other) and not protected_callback(None)


def test_anonymous_requests_to_the_page_and_its_callbacks_get_401(study: Study) -> None:
    for path in ("/real-users", "/real-users/", "/real-users?campaign=1", "/real-users/anything"):
        answer = httpx.get(study.url + path, timeout=30)
        assert answer.status_code == 401, path
        assert answer.headers["WWW-Authenticate"].startswith("Bearer") and "/real-users/login" in answer.text
        assert "IW=16" not in answer.text and "Impr." not in answer.text
    assert post_callback(study, REGIONS_CALLBACK).status_code == 401
    assert post_callback(study, ROUTER_CALLBACK).status_code == 401
    # the public pages and their router callback stay public; the sign-in form is reachable
    assert httpx.get(study.url + "/", timeout=30).status_code == 200
    public = dict(
        ROUTER_CALLBACK,
        inputs=[
            {"id": "_pages_location", "property": "pathname", "value": "/regions"},
            {"id": "_pages_location", "property": "search", "value": ""},
        ],
    )
    assert post_callback(study, public).status_code == 200
    form = httpx.get(study.url + "/real-users/login", timeout=30)
    assert form.status_code == 200 and 'name="token"' in form.text


def test_wrong_tokens_get_the_same_401_without_saying_why(study: Study) -> None:
    revoked = _revoked_read_token(study)
    answers = [
        httpx.post(study.url + "/real-users/login", data={"token": token}, timeout=30, follow_redirects=False)
        for token in ("garbage", study.enroll_token, revoked, study.read_token + "x", "")
    ]
    assert {answer.status_code for answer in answers} == {401}
    assert len({answer.text for answer in answers}) == 1  # one body for every failure
    assert all(COOKIE not in answer.headers.get("set-cookie", "") for answer in answers)
    for token in ("garbage", study.enroll_token, revoked):
        assert httpx.get(study.url + "/real-users", headers={"Authorization": f"Bearer {token}"}, timeout=30).status_code == 401
        assert post_callback(study, REGIONS_CALLBACK, Authorization=f"Bearer {token}").status_code == 401


def _revoked_read_token(study: Study) -> str:
    engine = create_engine(study.database_url, poolclass=pool.NullPool)
    try:
        with Session(engine) as session:
            token = create_api_token(session, "read", "pytest revoked")
            session.execute(text("UPDATE api_tokens SET revoked_at = now() WHERE token_hash = :h"), {"h": hash_secret(token)})
            session.commit()
    finally:
        engine.dispose()
    return token


def test_a_bearer_token_reads_the_page_and_its_callbacks(study: Study) -> None:
    for token in (study.read_token, study.admin_token):
        bearer = {"Authorization": f"Bearer {token}"}
        assert httpx.get(study.url + "/real-users", headers=bearer, timeout=30).status_code == 200
        answer = post_callback(study, REGIONS_CALLBACK, **bearer)
        assert answer.status_code == 200, answer.text
        regions = json.dumps(answer.json())
        assert "data-group" in regions and '"DE"' in regions and '"BR"' in regions
        assert post_callback(study, ROUTER_CALLBACK, **bearer).status_code == 200


def test_a_forged_or_expired_session_cookie_is_refused(study: Study) -> None:
    engine = create_engine(study.database_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            token_id, stored = connection.execute(
                text("SELECT id, token_hash FROM api_tokens WHERE token_hash = :h"), {"h": hash_secret(study.read_token)}
            ).one()
    finally:
        engine.dispose()
    good = session_cookie(token_id, stored)
    assert httpx.get(study.url + "/real-users", cookies={COOKIE: good}, timeout=30).status_code == 200
    expired = session_cookie(token_id, stored, now=time.time() - 2 * SESSION_SECONDS)
    forged = good[:-4] + ("0000" if not good.endswith("0000") else "1111")
    guessed = session_cookie(token_id, hash_secret("not the token"))
    for cookie in (expired, forged, guessed, "v1.1.9999999999.abc", "garbage"):
        assert httpx.get(study.url + "/real-users", cookies={COOKIE: cookie}, timeout=30).status_code == 401, cookie


# ---- the page ---------------------------------------------------------------------------------------


def _sign_in(context: Any, study: Study, token: str) -> Any:
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    tab.problems = problems
    first = tab.goto(study.url + "/real-users")
    assert first is not None and first.status == 401
    tab.goto(study.url + "/real-users/login")
    tab.fill("#realusers-login-token", token)
    tab.click("#realusers-login-submit")
    tab.wait_for_url(study.url + "/real-users**", timeout=TIMEOUT_MS)
    return tab


def test_signed_in_the_page_draws_the_tables_and_figures(study: Study, browser: Any) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        tab = _sign_in(context, study, study.read_token)
        cookie = next(c for c in context.cookies() if c["name"] == COOKIE)
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and study.read_token not in cookie["value"]
        tab.wait_for_selector("#realusers-percentiles table", timeout=TIMEOUT_MS)
        table = tab.inner_text("#realusers-percentiles")
        for label in ("IW=16", "IW=32", "default (IW=10)", "Impr.", "% Impr.", "Avg.", "99"):
            assert label in table, label
        expected = hand(study.records)
        rows = {
            cells[0]: cells
            for cells in tab.eval_on_selector_all(
                "#realusers-percentiles tr", "rows => rows.map((r) => Array.from(r.children, (c) => c.innerText))"
            )
        }
        assert rows["default (IW=10)"][1] == f"{expected['default'].responses:,} (12 clusters)"
        assert rows["default (IW=10)"][2].startswith(f"{expected['default'].avg_ms:,.1f}\n[")
        assert rows["IW=16"][3].startswith(f"{expected['16'].percentiles_ms['p50']:,.1f}\n[")
        assert rows["IW=32"][1] == f"{expected['32'].responses:,} (3 clusters)"  # 3 clusters < 5
        assert rows["IW=32"][2:] == ["n too small"] * 5
        assert rows["Impr. (IW=16)"][2] != "n too small" and rows["Impr. (IW=32)"][2] == "n too small"
        status_line = tab.inner_text("#realusers-status")
        assert "n too small: IW=32" in status_line and f"{sum(r['connections'] for r in study.records):,}" in status_line
        tab.wait_for_selector("#realusers-retrans td", timeout=TIMEOUT_MS)
        retrans = tab.inner_text("#realusers-retrans")
        assert "baseline" in retrans and f"{100 * (expected['16'].retrans_rate or 0):,.2f} %" in retrans
        assert "Reused after idle" in tab.inner_text("#realusers-biased")
        for dimension, labels in (("rtt", ["<=100 ms", "<=500 ms"]), ("bandwidth", ["<=5Mbit/s"]), ("bdp", ["<=50000 B"])):
            graph_id = f"realusers-{dimension}-graph"
            tab.wait_for_function(HAS_POINTS_JS, arg=graph_id, timeout=TIMEOUT_MS)
            traces = {trace["name"]: trace for trace in tab.evaluate(TRACES_JS, graph_id)}
            assert traces["IW=16 (ms)"]["x"] == labels
            assert all(value is not None for value in traces["IW=16 (ms)"]["y"])
            assert any("n too small" in text for text in traces["n too small"]["text"])  # IW32
        tab.wait_for_function(HAS_POINTS_JS, arg="realusers-days-graph", timeout=TIMEOUT_MS)
        tab.wait_for_function(HAS_POINTS_JS, arg="realusers-sweep-graph", timeout=TIMEOUT_MS)
        sweep = {trace["name"]: trace for trace in tab.evaluate(TRACES_JS, "realusers-sweep-graph")}
        assert sweep["default (IW=10) mean (ms)"]["x"] == ["10 %", "50 %"]
        assert min(value for value in sweep["default (IW=10) mean (ms)"]["y"] if value is not None) > 0
        tab.wait_for_selector("#realusers-sweep-table td", timeout=TIMEOUT_MS)
        assert "reference" in tab.inner_text("#realusers-sweep-table")
        tab.wait_for_selector("#realusers-regions .iw-percentiles", timeout=TIMEOUT_MS)
        groups = tab.eval_on_selector_all("#realusers-regions .iw-percentiles", "els => els.map(e => e.dataset.group)")
        assert groups == ["BR", "DE"]
        tab.wait_for_selector("#realusers-load-note", timeout=TIMEOUT_MS)
        footnote = tab.inner_text("#realusers-footnote")
        assert "cluster bootstrap" in footnote and "+-1 %" in footnote and "aggregate rows" in footnote
        # a filter change goes through the callbacks (and the address bar)
        tab.check("#realusers-filter-biased input[value='exclude']")
        tab.wait_for_function("() => window.location.search.includes('biased=exclude')", timeout=TIMEOUT_MS)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(SCREENSHOTS / "real-users.png"), full_page=True)
        assert tab.problems == []
        # the navigation of the public pages links here
        tab.goto(study.url + "/")
        # The navigation is drawn by the app after the load event: wait for it, then count.
        tab.wait_for_selector("#app-nav >> text=Real users", timeout=TIMEOUT_MS)
        assert tab.locator("#app-nav >> text=Real users").count() == 1
    finally:
        context.close()


def test_revoking_the_token_ends_its_sessions_and_sign_out_clears_the_cookie(study: Study, browser: Any) -> None:
    engine = create_engine(study.database_url, poolclass=pool.NullPool)
    try:
        with Session(engine) as session:
            token = create_api_token(session, "read", "pytest short-lived")
            session.commit()
        context = browser.new_context()
        try:
            tab = _sign_in(context, study, token)
            tab.wait_for_selector("#realusers-percentiles table", timeout=TIMEOUT_MS)
            cookies = {c["name"]: c["value"] for c in context.cookies()}
            with Session(engine) as session:
                session.execute(text("UPDATE api_tokens SET revoked_at = now() WHERE token_hash = :h"), {"h": hash_secret(token)})
                session.commit()
            assert httpx.get(study.url + "/real-users", cookies=cookies, timeout=30).status_code == 401
            assert tab.goto(study.url + "/real-users").status == 401
            signed_out = _sign_in(context, study, study.read_token)
            signed_out.goto(study.url + "/real-users/logout")
            assert all(c["name"] != COOKIE for c in context.cookies())
            assert signed_out.goto(study.url + "/real-users").status == 401
        finally:
            context.close()
    finally:
        engine.dispose()
