"""The hot paths (``iwscope.hotpaths.HotPaths``: uploads, a probe's unchanged schedule) answer
exactly what FastAPI's routes answer: the same requests sent to one in-process app with the
layer and to one without it (the routes through FastAPI's router and dependencies), every
status, body and the headers that matter compared; the request metrics see the route, not
``unmatched``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import pytest
from sqlalchemy.engine import Engine
from testkit import Enrolled, make_batch, make_observation, make_observation_batch, make_trial

from iwprobe import wire
from iwscope.api import create_app
from iwscope.hotpaths import HotPaths
from iwscope.metrics import REQUESTS


def _apps() -> tuple[Any, Any]:
    fast = create_app()
    reference = create_app(hot_paths=False)
    assert isinstance(fast._app.app.app, HotPaths) and not isinstance(reference._app.app.app, HotPaths)
    return fast, reference


def _send_all(app: Any, requests: list[dict[str, Any]]) -> list[tuple[int, Any, str | None]]:
    async def run() -> list[tuple[int, Any, str | None]]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://collector") as client:
            answers = []
            for request in requests:
                response = await client.request(**{"method": "POST", **request})
                body = response.json() if response.headers.get("content-type") == "application/json" else response.text
                answers.append((response.status_code, body, response.headers.get("www-authenticate")))
            return answers

    return asyncio.run(run())


def _schedule_answers(app: Any, probe: Enrolled, other: Enrolled) -> list[tuple[int, Any, dict[str, str]]]:
    """Every kind of schedule request: the first (200, its ETag), then the same ETag asked in
    every way the hot path must answer (304) or leave to the route."""

    async def run() -> list[tuple[int, Any, dict[str, str]]]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://collector") as client:
            path = f"/api/v1/probes/{probe.id}/schedule"
            first = await client.get(path, params={"wire_version": wire.WIRE_VERSION}, headers=probe.headers)
            etag = first.headers["etag"]
            own = {**probe.headers, "If-None-Match": etag}
            current = f"?wire_version={wire.WIRE_VERSION}"
            requests: list[tuple[str, dict[str, str], str]] = [
                (path, probe.headers, current),  # no If-None-Match: 200
                (path, own, current),  # unchanged: 304
                (path, {**own, "If-None-Match": f'W/{etag}, "x"'}, current),
                (path, own, ""),  # the default wire version: another ETag, 200
                (path, own, f"{current}&wire_version=1"),  # 200 (version 1)
                (path, own, "?wire_version=0"),  # 422
                (path, own, f"?wire_version={wire.WIRE_VERSION + 1}"),  # 422
                (path, own, "?wire_version=x"),  # 422
                (path, own, f"?other=1&wire_version={wire.WIRE_VERSION}"),
                (path, {"If-None-Match": etag}, current),  # 401
                (path, {**other.headers, "If-None-Match": etag}, current),  # 403
                (path.replace(probe.id, probe.id.replace("-", "")), own, current),
                (path, {**own, "If-None-Match": "x" * 1025}, current),  # 422
            ]
            answers = [(first.status_code, first.json()["campaigns"], {"etag": etag})]
            for url, headers, query in requests:
                response = await client.get(url + query, headers=headers)
                body = response.json() if response.content else None
                if isinstance(body, dict):
                    body.pop("generated_at", None)
                kept = {
                    name: response.headers[name]
                    for name in ("etag", "cache-control", "www-authenticate")
                    if name in response.headers
                }
                answers.append((response.status_code, body, kept))
            return answers

    return asyncio.run(run())


def _requests(probe: Enrolled, origin: Enrolled, other_probe: Enrolled) -> list[dict[str, Any]]:
    """One of every kind of answer, fresh records each call (so both apps store the same kinds)."""
    good = make_batch(probe.id, [make_trial(probe.id) for _ in range(3)])
    bad = [make_trial(probe.id) for _ in range(3)]
    bad[1]["total_us"] = -5
    del bad[2]["arm_iw"]
    trial = make_trial(probe.id, origin.id)
    observations = make_observation_batch(origin.id, [make_observation(trial, origin.id)])
    json_headers = {**probe.headers, "Content-Type": "application/json"}
    return [
        {"url": wire.TRIALS_BATCH_PATH, "json": good},  # no credential
        {"url": wire.TRIALS_BATCH_PATH, "json": good, "headers": {"Authorization": "Basic " + probe.credential}},
        {"url": wire.TRIALS_BATCH_PATH, "json": good, "headers": {"Authorization": "Bearer"}},
        {"url": wire.TRIALS_BATCH_PATH, "json": good, "headers": {"Authorization": f"Bearer {probe.id}.wrong"}},
        {"url": wire.TRIALS_BATCH_PATH, "json": good, "headers": origin.headers},  # an origin is no probe
        {"url": wire.TRIALS_BATCH_PATH, "json": good, "headers": {"Authorization": "bearer " + probe.credential}},
        {"url": wire.TRIALS_BATCH_PATH, "json": good, "headers": probe.headers},  # a duplicate of the previous
        {"url": wire.TRIALS_BATCH_PATH, "json": make_batch(probe.id, bad), "headers": probe.headers},
        {"url": wire.TRIALS_BATCH_PATH, "json": good, "headers": other_probe.headers},  # another probe's records
        {"url": wire.TRIALS_BATCH_PATH, "content": b"{not json", "headers": probe.headers},
        {"url": wire.TRIALS_BATCH_PATH, "content": b"x" * (wire.MAX_BODY_BYTES + 1), "headers": json_headers},
        {"url": wire.OBSERVATIONS_BATCH_PATH, "json": observations, "headers": origin.headers},
        {"url": wire.OBSERVATIONS_BATCH_PATH, "json": observations, "headers": origin.headers},
        {"url": wire.OBSERVATIONS_BATCH_PATH, "json": observations, "headers": probe.headers},
        {"url": wire.OBSERVATIONS_BATCH_PATH, "content": b"[]", "headers": origin.headers},
    ]


def _comparable(answer: tuple[int, Any, str | None]) -> tuple[int, Any, str | None]:
    """The answer without what differs by construction between two fresh batches (their ids)."""
    status, body, authenticate = answer
    if isinstance(body, dict) and "batch_id" in body:
        body = {**body, "batch_id": "<id>"}
    if isinstance(body, dict) and isinstance(body.get("detail"), dict):
        body = {
            **body,
            "detail": {**body["detail"], "errors": [{**e, "record_id": "<id>"} for e in body["detail"].get("errors", [])]},
        }
        body["detail"].pop("batch_id", None)
    return status, body, authenticate


def test_fast_path_answers_every_kind_of_upload_like_the_fastapi_routes(
    in_process: None, client: httpx.Client, probe: Enrolled, origin: Enrolled, enroll_token: str, db_engine: Engine
) -> None:
    from testkit import enroll_probe

    other_probe = enroll_probe(client, enroll_token)
    fast, reference = _apps()
    fast_answers = _send_all(fast, _requests(probe, origin, other_probe))
    reference_answers = _send_all(reference, _requests(probe, origin, other_probe))
    statuses = [answer[0] for answer in fast_answers]
    # Every kind of answer happened (so the comparison below compared them all).
    assert statuses == [401, 401, 401, 401, 401, 200, 200, 422, 403, 422, 413, 200, 200, 401, 422], fast_answers
    assert fast_answers[5][1]["accepted"] == 3 and fast_answers[6][1]["duplicates"] == 3
    assert fast_answers[11][1]["accepted"] == 1 and fast_answers[12][1]["duplicates"] == 1
    assert fast_answers[0][2] == "Bearer" and fast_answers[0][1] == {"detail": "missing credentials"}
    for index, (mine, theirs) in enumerate(zip(fast_answers, reference_answers, strict=True)):
        assert _comparable(mine) == _comparable(theirs), index


def test_fast_path_is_counted_under_its_route(in_process: None, probe: Enrolled) -> None:
    fast, _ = _apps()
    before = REQUESTS.labels("POST", wire.TRIALS_BATCH_PATH, "200")._value.get()
    unmatched = REQUESTS.labels("POST", "unmatched", "200")._value.get()
    answers = _send_all(
        fast, [{"url": wire.TRIALS_BATCH_PATH, "json": make_batch(probe.id, [make_trial(probe.id)]), "headers": probe.headers}]
    )
    assert answers[0][0] == 200
    assert REQUESTS.labels("POST", wire.TRIALS_BATCH_PATH, "200")._value.get() == before + 1
    assert REQUESTS.labels("POST", "unmatched", "200")._value.get() == unmatched


def test_other_methods_and_paths_still_reach_fastapi(in_process: None) -> None:
    fast, _ = _apps()

    async def run() -> tuple[int, int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=fast), base_url="http://collector") as client:
            return (await client.get(wire.TRIALS_BATCH_PATH)).status_code, (
                await client.post("/api/v1/trials/batch/x")
            ).status_code

    assert asyncio.run(run()) == (405, 404)


@dataclass
class JoinsSent:
    """The ids each ``ingest.queue_join`` call was handed, and what "Redis" answers the next
    calls (taken from the front; ``True`` once none is left)."""

    sent: list[list[str]] = field(default_factory=list)
    answers: list[bool] = field(default_factory=list)


@pytest.fixture
def joins_sent(monkeypatch: pytest.MonkeyPatch) -> JoinsSent:
    from iwscope.trials import ingest

    joins = JoinsSent()

    def recorded(ids: list[str]) -> bool:
        joins.sent.append(list(ids))
        return joins.answers.pop(0) if joins.answers else True

    monkeypatch.setattr(ingest, "queue_join", recorded)
    return joins


def test_joins_of_one_window_go_as_one_message(joins_sent: JoinsSent) -> None:
    from iwscope.trials import ingest

    async def run() -> None:
        batcher = ingest.JoinBatcher(window_s=0.2)
        async with anyio.create_task_group() as group:
            for index in range(10):
                group.start_soon(batcher.add, [f"t{index}"])
            group.start_soon(batcher.add, [])  # path samples only: this window's message asks for the drain
        await batcher.add(["late"])  # a new window

    asyncio.run(run())
    assert joins_sent.sent == [[f"t{index}" for index in range(10)], ["late"]]


def test_joins_redis_did_not_take_are_sent_with_the_next_window(joins_sent: JoinsSent) -> None:
    from iwscope.trials import ingest

    joins_sent.answers = [False, False, True]

    async def run() -> None:
        batcher = ingest.JoinBatcher(window_s=0.01, max_kept=3)
        await batcher.add(["a", "b"])  # Redis down: kept
        await batcher.add(["c", "d"])  # down again: a-d, the newest 3 kept
        await batcher.add(["e"])  # up: b-e go

    asyncio.run(run())
    assert joins_sent.sent == [["a", "b"], ["a", "b", "c", "d"], ["b", "c", "d", "e"]]


def test_a_drain_asked_without_ids_waits_for_other_asks_outside_its_request(joins_sent: JoinsSent) -> None:
    from iwscope.trials import ingest

    sent = joins_sent.sent

    async def run() -> list[list[str]]:
        batcher = ingest.JoinBatcher(window_s=0.01, refresh_window_s=0.2)
        for _ in range(5):  # trial uploads: each returns at once, one message for all of them
            await asyncio.wait_for(batcher.add([]), timeout=0.05)
        assert sent == []
        await asyncio.sleep(0.3)
        after_refresh = list(sent)
        await batcher.add([])  # a new refresh window ...
        await batcher.add(["t1"])  # ... whose drain this window's message asks for
        await asyncio.sleep(0.3)
        return after_refresh

    assert asyncio.run(run()) == [[]]
    assert sent == [[], ["t1"]]
