"""Less work per probe cycle (fleet scale): the schedule's ETag and 304, the heartbeat folded into
an upload, the credential cache and how soon a revocation still takes effect; with the probe's
own client and agent where the probe's side is concerned."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import psycopg
import pytest
from testenv import libpq_url
from testkit import (
    Enrolled,
    bearer,
    enroll_origin,
    enroll_probe,
    make_batch,
    make_observation,
    make_observation_batch,
    make_trial,
    revoke_unnoticed,
)

from iwprobe import wire
from iwprobe._agent import Credentials, ProbeAgent

HEARTBEAT = {"version": "cycle-test", "spool_backlog": 7, "spool_bytes": 4096, "uptime_s": 12.5, "trials_measured": 3}


@pytest.fixture
def server(joinless_api_factory):
    """An API whose credential cache lasts 1 s, notified or not."""
    return joinless_api_factory(IWSCOPE_CREDENTIAL_CACHE_S="1", IWSCOPE_CREDENTIAL_CACHE_NOTIFIED_S="1")


@pytest.fixture
def new_campaign(server, admin_token: str) -> Iterator[Callable[[Enrolled, str], int]]:
    """``new_campaign(origin, name)``: a running campaign of ``origin`` open to every region, ended
    after the test (else it would stand in the schedule of every probe the session enrolls later)."""
    created: list[int] = []

    def create(origin: Enrolled, name: str) -> int:
        now = dt.datetime.now(dt.UTC)
        answer = httpx.post(
            f"{server.url}/api/v1/campaigns",
            headers=bearer(admin_token),
            timeout=30,
            json={
                "name": name,
                "origin_ids": [origin.id],
                "arms": [3, 10],
                "sizes": [10_000],
                "repetitions": 1,
                "interval_s": 1.0,
                "starts_at": (now - dt.timedelta(minutes=1)).isoformat(),
                "ends_at": (now + dt.timedelta(hours=1)).isoformat(),
            },
        )
        assert answer.status_code == 201, answer.text
        created.append(int(answer.json()["id"]))
        return created[-1]

    yield create
    ended = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)).isoformat()
    for campaign_id in created:
        answer = httpx.patch(
            f"{server.url}/api/v1/campaigns/{campaign_id}", headers=bearer(admin_token), timeout=30, json={"ends_at": ended}
        )
        assert answer.status_code == 200, answer.text


def _probe_row(database_url: str, probe_id: str) -> tuple[Any, ...]:
    with psycopg.connect(libpq_url(database_url)) as connection:
        row = connection.execute("SELECT version, last_heartbeat, last_seen_at FROM probes WHERE id = %s", (probe_id,)).fetchone()
    assert row is not None
    return tuple(row)


def test_schedule_has_an_etag_and_answers_304_until_it_changes(
    server, enroll_token: str, origin_token: str, new_campaign
) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        probe = enroll_probe(client, enroll_token)
        origin = enroll_origin(client, origin_token)
        path = wire.PROBE_SCHEDULE_PATH.format(probe_id=probe.id) + "?wire_version=3"
        first = client.get(path, headers=probe.headers)
        assert first.status_code == 200 and first.headers["etag"].startswith('"'), first.headers
        etag = first.headers["etag"]
        # Unchanged: 304, no body, the same ETag (generated_at moved on; it is not part of the tag).
        again = client.get(path, headers={**probe.headers, "If-None-Match": etag})
        assert (again.status_code, again.content, again.headers["etag"]) == (304, b"", etag)
        assert client.get(path, headers={**probe.headers, "If-None-Match": f'W/{etag}, "other"'}).status_code == 304
        # A probe speaking wire v2 is told something else (no paced listeners, no v3 campaigns): its own tag.
        older = client.get(wire.PROBE_SCHEDULE_PATH.format(probe_id=probe.id), headers=probe.headers)
        assert older.status_code == 200
        # A campaign created through this process shows at once, under a new tag.
        campaign_id = new_campaign(origin, "etag test")
        changed = client.get(path, headers={**probe.headers, "If-None-Match": etag})
        assert changed.status_code == 200 and changed.headers["etag"] != etag
        assert campaign_id in [entry["campaign_id"] for entry in changed.json()["campaigns"]]
        # Another probe, same tag rules: its If-None-Match with this probe's old tag is not a match.
        other = enroll_probe(client, enroll_token)
        other_path = wire.PROBE_SCHEDULE_PATH.format(probe_id=other.id) + "?wire_version=3"
        assert client.get(other_path, headers={**other.headers, "If-None-Match": etag}).status_code == 200


def test_the_probe_agent_keeps_its_schedule_on_a_304_and_folds_its_heartbeat_into_uploads(
    server, enroll_token: str, origin_token: str, new_campaign, database_url: str, tmp_path
) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        probe = enroll_probe(client, enroll_token)
        origin = enroll_origin(client, origin_token)
    campaign_id = new_campaign(origin, "agent cycle")
    agent = ProbeAgent(str(tmp_path), Credentials("probe", probe.id, probe.credential, server.url), heartbeat_s=60.0)
    first = agent.schedule()
    assert first is not None and campaign_id in [entry.campaign_id for entry in first.campaigns]
    before = _answers(server.url, "304")
    second = agent.schedule()
    assert _answers(server.url, "304") == before + 1  # the collector said "unchanged" ...
    assert second == first  # ... and the agent ran the schedule it had on disk
    # Nothing posted to /heartbeat: an upload carries the heartbeat, the collector stores it.
    assert agent.heartbeat_due()
    trial = make_trial(probe.id)
    agent.spool.add("trial", trial["trial_id"], trial)
    assert agent.uploader.upload_once() == 1
    assert not agent.heartbeat_due()
    version, last_heartbeat, last_seen = _probe_row(database_url, probe.id)
    assert last_heartbeat["spool_backlog"] == 1 and last_heartbeat["trials_measured"] == 0, last_heartbeat
    assert version == last_heartbeat["version"] and last_seen is not None
    assert _answers(server.url, "204", "/api/v1/probes/{probe_id}/heartbeat") == 0
    # One heartbeat per interval: the next upload within it carries none (no extra write per batch).
    for _ in range(2):
        trial = make_trial(probe.id)
        agent.spool.add("trial", trial["trial_id"], trial)
    assert agent.uploader.upload_once() == 2
    assert _probe_row(database_url, probe.id)[1] == last_heartbeat


def test_a_trial_upload_names_the_schedule_etag_and_the_agent_then_skips_its_poll(
    server, enroll_token: str, origin_token: str, new_campaign, tmp_path
) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        probe = enroll_probe(client, enroll_token)
        origin = enroll_origin(client, origin_token)
    new_campaign(origin, "piggyback one")
    agent = ProbeAgent(str(tmp_path), Credentials("probe", probe.id, probe.credential, server.url), heartbeat_s=60.0)
    first = agent.schedule()
    assert first is not None
    route_etag = httpx.get(
        f"{server.url}{wire.PROBE_SCHEDULE_PATH.format(probe_id=probe.id)}?wire_version={wire.WIRE_VERSION}",
        headers=probe.headers,
        timeout=30,
    ).headers["etag"]

    def polls() -> float:
        return _answers(server.url, "200") + _answers(server.url, "304")

    def upload_one() -> None:
        trial = make_trial(probe.id)
        agent.spool.add("trial", trial["trial_id"], trial)
        assert agent.uploader.upload_once() == 1

    upload_one()
    assert agent.uploader.schedule_etag == route_etag  # the answer names the route's own ETag
    before = polls()
    assert agent.schedule() == first and polls() == before  # confirmed by the upload: no request
    # A new campaign: the next answer names another ETag, and the agent asks again and sees it.
    campaign_id = new_campaign(origin, "piggyback two")
    upload_one()
    assert agent.uploader.schedule_etag != route_etag
    changed = agent.schedule()
    assert polls() == before + 1 and changed is not None
    assert campaign_id in [entry.campaign_id for entry in changed.campaigns]
    # An observation batch's answer names no schedule.
    with httpx.Client(base_url=server.url, timeout=30) as client:
        observed = client.post(
            wire.OBSERVATIONS_BATCH_PATH,
            json=make_observation_batch(origin.id, [make_observation(make_trial(probe.id), origin.id)]),
            headers=origin.headers,
        )
    assert observed.status_code == 200 and "schedule_etag" not in observed.json()


def _answers(url: str, status: str, route: str = "/api/v1/probes/{probe_id}/schedule") -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("iwscope_http_requests_total{") and f'route="{route}"' in line and f'status="{status}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_folded_heartbeat_is_validated_with_the_batch(server, enroll_token: str, database_url: str) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        probe = enroll_probe(client, enroll_token)
        trials = [make_trial(probe.id) for _ in range(3)]
        bad = client.post(
            wire.TRIALS_BATCH_PATH,
            headers=probe.headers,
            content=orjson.dumps({**make_batch(probe.id, trials), "heartbeat": {**HEARTBEAT, "spool_backlog": -1}}),
        )
        assert bad.status_code == 422 and "heartbeat" in bad.text, bad.text
        with psycopg.connect(libpq_url(database_url)) as connection:
            stored = connection.execute(
                "SELECT count(*) FROM trials WHERE trial_id = ANY(%s::uuid[])", ([trial["trial_id"] for trial in trials],)
            ).fetchone()
        assert stored == (0,)  # a refused heartbeat refuses the batch: nothing stored
        good = client.post(
            wire.TRIALS_BATCH_PATH,
            headers=probe.headers,
            content=orjson.dumps({**make_batch(probe.id, trials), "heartbeat": HEARTBEAT}),
        )
        assert good.status_code == 200 and good.json()["accepted"] == 3, good.text
    version, last_heartbeat, _ = _probe_row(database_url, probe.id)
    assert version == "cycle-test" and {key: last_heartbeat[key] for key in HEARTBEAT} == HEARTBEAT


def test_revocation_takes_effect_within_the_credential_cache_time(server, enroll_token: str, database_url: str) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        probe = enroll_probe(client, enroll_token)
        path = wire.PROBE_HEARTBEAT_PATH.format(probe_id=probe.id)
        assert client.post(path, headers=probe.headers, json=HEARTBEAT).status_code == 204  # now cached
        # The cache never answers for a wrong secret, even right after the right one succeeded.
        wrong = {"Authorization": f"Bearer {probe.id}.{'x' * 43}"}
        assert client.post(path, headers=wrong, json=HEARTBEAT).status_code == 401
        revoke_unnoticed(database_url, probe.id)  # no notification: only the entry's expiry refuses it
        revoked_at = time.monotonic()
        statuses = []
        while time.monotonic() - revoked_at < 10:
            statuses.append(client.post(path, headers=probe.headers, json=HEARTBEAT).status_code)
            if statuses[-1] == 401:
                break
            time.sleep(0.2)
    # Refused once the 1 s cache entry expired (allowing the loaded box its scheduling delays).
    assert statuses[-1] == 401, statuses
    assert set(statuses[:-1]) <= {204}, statuses
