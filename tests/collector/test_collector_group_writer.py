"""The group commit of uploads (``iwscope.trials.writer``, ``services.store_group``) against the
real database: several uploads in one transaction keep every per-upload guarantee -- a
duplicate across uploads is stored once (the first wins), a refused upload stores nothing and
refuses nothing else, and one upload the database refuses does not take the others down.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Iterator

import httpx
import orjson
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from testkit import Enrolled, enroll_origin, enroll_probe, make_batch, make_observation, make_observation_batch, make_trial

from iwscope.db import PING_AFTER_IDLE_S
from iwscope.trials import fastwire, services, validation, writer
from iwscope.trials.validation import BatchRejected


def _trial_upload(probe: Enrolled, trials: list[dict[str, object]]) -> services.Upload:
    body = orjson.dumps(make_batch(probe.id, trials))
    return services.Upload(validation.validate_trial_batch(body, uuid.UUID(probe.id)), uuid.UUID(probe.id))


def _stored(engine: Engine, table: str, trial_ids: list[str]) -> dict[str, int]:
    with engine.connect() as connection:
        rows = connection.execute(
            text(f"SELECT trial_id::text, count(*) FROM {table} WHERE trial_id = ANY(CAST(:ids AS uuid[])) GROUP BY 1"),
            {"ids": trial_ids},
        ).all()
    return {row[0]: row[1] for row in rows}


def test_a_group_stores_each_upload_as_alone(
    client: httpx.Client, enroll_token: str, origin_token: str, db_engine: Engine
) -> None:
    first, second, third = (enroll_probe(client, enroll_token) for _ in range(3))
    origin = enroll_origin(client, origin_token)
    a = [make_trial(first.id) for _ in range(5)]
    b = [make_trial(second.id) for _ in range(3)]
    b_again = {**a[4], "probe_id": second.id}  # the same UUID as a's last trial, in another upload
    refused = [make_trial(third.id), make_trial(third.id, campaign_id=2_000_000_000)]  # an unknown campaign
    # Observations of trials this test never stores (a sweep would otherwise find them to join).
    observed = [make_trial(first.id) for _ in range(2)]
    observations = [make_observation(trial, origin.id) for trial in observed]
    upload_a = _trial_upload(first, a)
    upload_b = _trial_upload(second, [*b, b_again])
    upload_refused = _trial_upload(third, refused)
    upload_obs = services.Upload(
        validation.validate_observation_batch(
            orjson.dumps(make_observation_batch(origin.id, [*observations, observations[0]])), uuid.UUID(origin.id)
        ),
        uuid.UUID(origin.id),
    )

    services.store_group(db_engine, [upload_a, upload_refused, upload_b, upload_obs])

    assert isinstance(upload_a.outcome, services.IngestResult) and isinstance(upload_b.outcome, services.IngestResult)
    assert (upload_a.outcome.accepted, upload_a.outcome.duplicates) == (5, 0)
    assert (upload_b.outcome.accepted, upload_b.outcome.duplicates) == (3, 1)  # the first upload of a UUID wins
    assert sorted(upload_b.outcome.new_trial_ids) == sorted(trial["trial_id"] for trial in b)
    assert isinstance(upload_refused.outcome, BatchRejected) and upload_refused.outcome.status_code == 422
    assert [error.field for error in upload_refused.outcome.errors] == ["campaign_id"]
    assert isinstance(upload_obs.outcome, services.IngestResult)
    assert (upload_obs.outcome.accepted, upload_obs.outcome.duplicates) == (2, 1)
    every = [str(trial["trial_id"]) for trial in (*a, *b, *refused)]
    stored = _stored(db_engine, "trials", every)
    assert stored == {str(trial["trial_id"]): 1 for trial in (*a, *b)}  # once each; nothing of the refused upload
    assert _stored(db_engine, "trial_ids", every) == stored
    with db_engine.connect() as connection:
        owner = connection.execute(
            text("SELECT probe_id::text FROM trials WHERE trial_id = CAST(:t AS uuid)"), {"t": a[4]["trial_id"]}
        ).scalar_one()
        seen = connection.execute(
            text("SELECT count(*) FROM probes WHERE id = ANY(CAST(:ids AS uuid[])) AND last_seen_at IS NOT NULL"),
            {"ids": [first.id, second.id]},
        ).scalar_one()
    assert owner == first.id
    assert seen == 2
    assert _stored(db_engine, "origin_observations", [str(trial["trial_id"]) for trial in observed]) == {
        str(trial["trial_id"]): 1 for trial in observed
    }
    # The same group again: nothing new, every record a duplicate.
    again = [_trial_upload(first, a), _trial_upload(second, b)]
    services.store_group(db_engine, again)
    assert [(outcome.accepted, outcome.duplicates) for outcome in (upload.outcome for upload in again)] == [(0, 5), (0, 3)]  # type: ignore[union-attr]


@pytest.fixture
def poisoned_trial(db_engine: Engine) -> Iterator[str]:
    """A trial UUID the database refuses (a trigger on the registry raises for it): a fault
    nothing before the database can see."""
    poisoned = str(uuid.uuid4())
    with db_engine.begin() as connection:
        connection.execute(
            text(
                "CREATE FUNCTION iwscope_test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'refused by the test''s trigger'; END $$"
            )
        )
        connection.execute(
            text(
                "CREATE TRIGGER iwscope_test_refuse BEFORE INSERT ON trial_ids FOR EACH ROW "
                f"WHEN (NEW.trial_id = '{poisoned}') EXECUTE FUNCTION iwscope_test_refuse()"
            )
        )
    try:
        yield poisoned
    finally:
        with db_engine.begin() as connection:
            connection.execute(text("DROP TRIGGER iwscope_test_refuse ON trial_ids"))
            connection.execute(text("DROP FUNCTION iwscope_test_refuse()"))


def test_an_upload_the_database_refuses_fails_alone(
    client: httpx.Client, enroll_token: str, db_engine: Engine, poisoned_trial: str
) -> None:
    probes = [enroll_probe(client, enroll_token) for _ in range(3)]
    trials = [[make_trial(probe.id) for _ in range(4)] for probe in probes]
    trials[1][2]["trial_id"] = poisoned_trial
    bodies = [orjson.dumps(make_batch(probe.id, batch)) for probe, batch in zip(probes, trials, strict=True)]
    work = [(validation.validate_trial_batch, body, uuid.UUID(probe.id)) for probe, body in zip(probes, bodies, strict=True)]
    work.append((validation.validate_trial_batch, b'{"wire_version": 1}', uuid.UUID(probes[0].id)))  # refused by the checks

    outcomes = writer.check_and_store(db_engine, work)

    assert isinstance(outcomes[0], services.IngestResult) and outcomes[0].accepted == 4
    assert isinstance(outcomes[2], services.IngestResult) and outcomes[2].accepted == 4
    assert isinstance(outcomes[1], Exception) and "refused by the test's trigger" in str(outcomes[1])
    assert isinstance(outcomes[3], BatchRejected) and outcomes[3].status_code == 422
    ids = [str(trial["trial_id"]) for batch in trials for trial in batch]
    stored = _stored(db_engine, "trials", ids)
    assert stored == {str(trial["trial_id"]): 1 for trial in (*trials[0], *trials[2])}  # nothing of the refused one


@pytest.fixture
def groups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every group ``services.store_group`` is given while the test runs."""
    sizes: list[int] = []
    store_group = services.store_group

    def counting(database: Engine | psycopg.Connection, uploads: list[services.Upload]) -> None:
        sizes.append(len(uploads))
        store_group(database, uploads)

    monkeypatch.setattr(services, "store_group", counting)
    return sizes


def test_concurrent_uploads_share_groups_and_each_gets_its_own_answer(
    client: httpx.Client, enroll_token: str, db_engine: Engine, in_process: None, groups: list[int]
) -> None:
    probes = [enroll_probe(client, enroll_token) for _ in range(12)]
    batches = [[make_trial(probe.id) for _ in range(3)] for probe in probes]

    async def upload_all() -> list[services.IngestResult | BaseException]:
        group_writer = writer.GroupWriter(lanes=1)
        try:
            return await asyncio.gather(
                *(
                    group_writer.store(
                        validation.validate_trial_batch, orjson.dumps(make_batch(probe.id, batch)), uuid.UUID(probe.id)
                    )
                    for probe, batch in zip(probes, batches, strict=True)
                ),
                return_exceptions=True,
            )
        finally:
            await group_writer.aclose()

    results = asyncio.run(upload_all())
    assert [(result.accepted, result.duplicates) for result in results] == [(3, 0)] * len(probes)  # type: ignore[union-attr]
    assert sum(groups) == len(probes) and len(groups) < len(probes), groups  # grouped, every upload in one group
    ids = [str(trial["trial_id"]) for batch in batches for trial in batch]
    assert _stored(db_engine, "trials", ids) == dict.fromkeys(ids, 1)


def _lane_backends(engine: Engine) -> list[int]:
    """Backend pids of this process's upload lanes."""
    with engine.connect() as connection:
        found = connection.execute(
            text("SELECT pid FROM pg_stat_activity WHERE application_name = :name"),
            {"name": f"iwscope-upload-lane[{os.getpid()}]"},
        )
        return [row[0] for row in found]


def test_a_lane_replaces_a_connection_that_broke_and_closes_it_when_done(
    client: httpx.Client, enroll_token: str, db_engine: Engine, in_process: None
) -> None:
    """A lane's connection killed while idle (a PostgreSQL restart, a proxy's cut) is replaced
    before the next group; closing the writer closes it and ends the lane's thread."""
    probe = enroll_probe(client, enroll_token)

    async def scenario() -> tuple[list[int], list[int], list[tuple[int, int]], threading.Thread | None]:
        group_writer = writer.GroupWriter(lanes=1, engine=db_engine)
        answers = []
        try:
            for _ in range(2):
                body = orjson.dumps(make_batch(probe.id, [make_trial(probe.id) for _ in range(2)]))
                result = await group_writer.store(validation.validate_trial_batch, body, uuid.UUID(probe.id))
                answers.append((result.accepted, result.duplicates))
                if len(answers) == 1:
                    first = _lane_backends(db_engine)
                    with db_engine.connect() as connection:
                        connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first[0]})
                    await asyncio.sleep(PING_AFTER_IDLE_S + 0.2)  # idle: the lane pings before its next group
            second = _lane_backends(db_engine)
            thread = group_writer._all[0].thread
        finally:
            await group_writer.aclose()
        return first, second, answers, thread

    first, second, answers, thread = asyncio.run(scenario())
    assert answers == [(2, 0), (2, 0)]
    assert len(first) == 1 and len(second) == 1 and first != second  # a new connection served the second group
    assert thread is not None and not thread.is_alive()
    assert _lane_backends(db_engine) == []


def test_an_idle_lane_ends_its_thread_and_a_new_group_starts_it_again(db_engine: Engine) -> None:
    lane = writer.Lane(db_engine, idle_s=0.2)

    async def one_group() -> writer.Outcomes:
        return await lane.run([])

    assert asyncio.run(one_group()) == []
    thread = lane.thread
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive() and lane.thread is None
    assert asyncio.run(one_group()) == []  # started again
    lane.close()
    assert lane.thread is None


def test_a_group_waits_for_more_uploads_until_full_or_the_linger_ends(
    client: httpx.Client, enroll_token: str, db_engine: Engine, in_process: None, groups: list[int]
) -> None:
    """Uploads arriving one after another (not at once, as under a fleet's steady rate) share a
    group while the first lingers; a group that reaches ``group_uploads`` goes at once; and a
    lone upload is stored once the linger ends, not held longer."""
    probes = [enroll_probe(client, enroll_token) for _ in range(5)]

    async def upload(group_writer: writer.GroupWriter, probe: Enrolled, after_s: float) -> services.IngestResult:
        await asyncio.sleep(after_s)
        body = orjson.dumps(make_batch(probe.id, [make_trial(probe.id) for _ in range(2)]))
        return await group_writer.store(validation.validate_trial_batch, body, uuid.UUID(probe.id))

    async def scenario() -> tuple[list[services.IngestResult], float, float]:
        group_writer = writer.GroupWriter(lanes=2, engine=db_engine, linger_s=2.0, group_uploads=4)
        loop = asyncio.get_running_loop()
        try:
            started = loop.time()
            # four uploads 50 ms apart: one group, gone as the fourth arrives (well before 2 s)
            staggered = await asyncio.gather(*(upload(group_writer, probe, 0.05 * i) for i, probe in enumerate(probes[:4])))
            full_after = loop.time() - started
            group_writer.linger_s = 0.3
            started = loop.time()
            lone = await upload(group_writer, probes[4], 0)
            lone_after = loop.time() - started
        finally:
            await group_writer.aclose()
        return [*staggered, lone], full_after, lone_after

    results, full_after, lone_after = asyncio.run(scenario())
    assert [(result.accepted, result.duplicates) for result in results] == [(2, 0)] * 5
    assert groups == [4, 1], groups  # without the linger the staggered four were four groups
    assert full_after < 1.5, full_after  # left when full, not at the linger's end (2 s)
    assert 0.3 <= lone_after < 1.5, lone_after  # waited out its linger, then went alone


def test_without_a_linger_each_upload_leaves_at_once(
    client: httpx.Client, enroll_token: str, db_engine: Engine, in_process: None, groups: list[int]
) -> None:
    probes = [enroll_probe(client, enroll_token) for _ in range(3)]

    async def scenario() -> None:
        group_writer = writer.GroupWriter(lanes=1, engine=db_engine, linger_s=0)
        try:
            for probe in probes:
                body = orjson.dumps(make_batch(probe.id, [make_trial(probe.id)]))
                await group_writer.store(validation.validate_trial_batch, body, uuid.UUID(probe.id))
        finally:
            await group_writer.aclose()

    asyncio.run(scenario())
    assert groups == [1, 1, 1]


def test_observation_uploads_take_one_lane_at_a_time_and_trials_the_other(
    client: httpx.Client, enroll_token: str, origin_token: str, db_engine: Engine, in_process: None
) -> None:
    """An origin's observation uploads (thousands of records, statements of hundreds of ms) are
    stored by one lane at a time: while one lane holds some, trial uploads keep the other and
    further observation uploads wait for the first lane -- at the fleet's shape both lanes busy
    with observations had trial uploads queue for a second and the door turn others away."""
    probes = [enroll_probe(client, enroll_token) for _ in range(3)]
    origin = enroll_origin(client, origin_token)
    release = threading.Event()
    checked: list[str] = []

    def held_observations(body: bytes, identity: uuid.UUID) -> fastwire.FastObservationBatch:
        checked.append(threading.current_thread().name)
        assert release.wait(30), "never released"
        return validation.validate_observation_batch(body, identity)

    def observations_body() -> bytes:
        return orjson.dumps(make_observation_batch(origin.id, [make_observation(make_trial(probes[0].id), origin.id)]))

    async def scenario() -> tuple[list[services.IngestResult], list[bool]]:
        group_writer = writer.GroupWriter(lanes=2, engine=db_engine, linger_s=0)
        try:
            first = asyncio.ensure_future(
                group_writer.store(held_observations, observations_body(), uuid.UUID(origin.id), observations=True)
            )
            while not checked:  # the first observation upload is in a lane, held there
                await asyncio.sleep(0.01)
            second = asyncio.ensure_future(
                group_writer.store(held_observations, observations_body(), uuid.UUID(origin.id), observations=True)
            )
            trials = [
                await asyncio.wait_for(
                    group_writer.store(
                        validation.validate_trial_batch,
                        orjson.dumps(make_batch(probe.id, [make_trial(probe.id)])),
                        uuid.UUID(probe.id),
                    ),
                    10,
                )
                for probe in probes
            ]  # stored by the other lane while the first holds its observations
            waiting = [first.done(), second.done(), len(checked) == 1]
            release.set()
            return [*trials, await first, await second], waiting
        finally:
            release.set()
            await group_writer.aclose()

    results, waiting = asyncio.run(scenario())
    assert waiting == [False, False, True], waiting  # the second observation upload was not given the free lane
    assert [(result.accepted, result.duplicates) for result in results] == [(1, 0)] * 5
    assert len(checked) == 2 and checked[0] == checked[1]  # both observation uploads in the same lane's thread
