"""The join at write (``services._STORE_GROUP``): a trial whose origin observation is stored
already is stored joined by its own upload; an observation asks the worker's join for its trial
(stored earlier, in the same statement, or not yet), and a trial never asks.  Against the real
database, the worker's join called in-process.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import orjson
from prometheus_client import REGISTRY
from sqlalchemy import text
from sqlalchemy.engine import Engine
from testkit import Enrolled, enroll_origin, enroll_probe, make_batch, make_observation, make_observation_batch, make_trial

from iwscope.auth.dependencies import Identity, IdentityKind
from iwscope.trials import ingest, rows, tasks, writer

Upload = tuple[str, Enrolled, bytes]


def _trials(probe: Enrolled, trials: list[dict[str, Any]]) -> Upload:
    return ingest.TRIALS_PATH, probe, orjson.dumps(make_batch(probe.id, trials))


def _observations(origin: Enrolled, observations: list[dict[str, Any]]) -> Upload:
    return ingest.OBSERVATIONS_PATH, origin, orjson.dumps(make_observation_batch(origin.id, observations))


def _store(*uploads: Upload) -> list[tuple[dict[str, Any], list[str] | None]]:
    """Each upload through the API's own store (:func:`ingest.store_upload`; sent together, they
    share one group and one statement): its answer and the trial ids it asks the worker to join."""

    async def store_all() -> list[ingest.UploadAnswer]:
        try:
            return await asyncio.gather(
                *(
                    ingest.store_upload(path, Identity(KINDS[path], uuid.UUID(sender.id), "test", "test"), body)
                    for path, sender, body in uploads
                )
            )
        finally:
            await writer.close_group_writer()

    answers = asyncio.run(store_all())
    assert all(answer.status == 200 for answer in answers), answers
    return [(orjson.loads(answer.body), answer.join_ids) for answer in answers]


KINDS: dict[str, IdentityKind] = {ingest.TRIALS_PATH: "probe", ingest.OBSERVATIONS_PATH: "origin"}


def _joined_at_ingest() -> float:
    return REGISTRY.get_sample_value("iwscope_trials_joined_at_ingest_total") or 0.0


def _joined(engine: Engine, trial_ids: list[str]) -> dict[str, tuple[Any, ...]]:
    """Per trial: (trial joined_at set, observation joined_at set, server_latency_us, server_snd_cwnd_at_accept)."""
    with engine.connect() as connection:
        found = connection.execute(
            text(
                "SELECT t.trial_id::text, t.joined_at IS NOT NULL, o.joined_at IS NOT NULL, t.server_latency_us,"
                " t.server_snd_cwnd_at_accept FROM trials t LEFT JOIN origin_observations o USING (trial_id)"
                " WHERE t.trial_id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": trial_ids},
        )
        return {row[0]: tuple(row[1:]) for row in found}


def test_an_observation_after_its_trial_asks_the_worker_which_joins_it(
    client: httpx.Client, enroll_token: str, origin_token: str, db_engine: Engine, in_process: None
) -> None:
    probe, origin = enroll_probe(client, enroll_token), enroll_origin(client, origin_token)
    trials = [make_trial(probe.id, origin.id, arm_iw=iw) for iw in (3, 10, 32)]
    ids = [trial["trial_id"] for trial in trials]
    ((stored, asks),) = _store(_trials(probe, trials))
    assert stored["accepted"] == 3 and asks == []  # a trial asks only for the refresh, no join
    assert _joined(db_engine, ids) == dict.fromkeys(ids, (False, False, None, None))

    observations = [make_observation(trial, origin.id, response_latency_us=50_000 + i) for i, trial in enumerate(trials)]
    ((answer, asks),) = _store(_observations(origin, observations))
    assert answer["accepted"] == 3 and sorted(asks or []) == sorted(ids)
    assert tasks._join(asks or []) == 3
    assert _joined(db_engine, ids) == {
        trial["trial_id"]: (True, True, 50_000 + i, trial["arm_iw"]) for i, trial in enumerate(trials)
    }
    ((again, asks),) = _store(_observations(origin, observations))  # duplicates: nothing to ask
    assert (again["accepted"], again["duplicates"], asks) == (0, 3, None)
    assert tasks._join(ids) == 0  # joined_at is set once


def test_a_trial_after_its_observation_is_stored_joined(
    client: httpx.Client, enroll_token: str, origin_token: str, db_engine: Engine, in_process: None
) -> None:
    probe, origin = enroll_probe(client, enroll_token), enroll_origin(client, origin_token)
    trials = [make_trial(probe.id, origin.id, arm_iw=10) for _ in range(2)]
    ids = [trial["trial_id"] for trial in trials]
    ((_, asks),) = _store(_observations(origin, [make_observation(trial, origin.id) for trial in trials]))
    assert sorted(asks or []) == sorted(ids)  # no trial yet: the observations ask the worker
    assert tasks._join(ids) == 0  # which finds nothing to join

    before = _joined_at_ingest()
    ((stored, asks),) = _store(_trials(probe, trials))
    assert stored["accepted"] == 2 and asks == []
    assert _joined(db_engine, ids) == dict.fromkeys(ids, (True, True, 90_000, 10))
    assert _joined_at_ingest() - before == 2
    assert tasks._join(ids) == 0  # nothing left for the worker
    with db_engine.connect() as connection:  # the trial's row equals the worker's join, column by column
        columns = ", ".join(rows.SERVER_SIDE_COLUMNS)
        values = connection.execute(
            text(f"SELECT {columns} FROM trials WHERE trial_id = CAST(:id AS uuid)"), {"id": ids[0]}
        ).one()
        sources = ", ".join(rows.SERVER_SIDE_COLUMNS.values())
        observed = connection.execute(
            text(f"SELECT {sources} FROM origin_observations WHERE trial_id = CAST(:id AS uuid)"), {"id": ids[0]}
        ).one()
    assert tuple(values) == tuple(observed)


def test_a_pair_in_one_group_is_left_to_the_worker_which_joins_it(
    client: httpx.Client, enroll_token: str, origin_token: str, db_engine: Engine, in_process: None
) -> None:
    probe, origin = enroll_probe(client, enroll_token), enroll_origin(client, origin_token)
    trial = make_trial(probe.id, origin.id, arm_iw=10)
    # one statement cannot see its own rows: neither side is joined at write
    (_, trial_asks), (_, observation_asks) = _store(
        _trials(probe, [trial]), _observations(origin, [make_observation(trial, origin.id)])
    )
    assert trial_asks == [] and observation_asks == [trial["trial_id"]]
    assert _joined(db_engine, [trial["trial_id"]]) == {trial["trial_id"]: (False, False, None, None)}
    assert tasks._join(observation_asks) == 1
    assert _joined(db_engine, [trial["trial_id"]]) == {trial["trial_id"]: (True, True, 90_000, 10)}


def test_an_observation_of_another_origin_is_not_joined(
    client: httpx.Client, enroll_token: str, origin_token: str, db_engine: Engine, in_process: None
) -> None:
    probe = enroll_probe(client, enroll_token)
    origin, other = enroll_origin(client, origin_token), enroll_origin(client, origin_token)
    early, late = make_trial(probe.id, origin.id), make_trial(probe.id, origin.id)
    _store(_observations(other, [make_observation(early, other.id)]))
    _store(_trials(probe, [early, late]))
    ((_, asks),) = _store(_observations(other, [make_observation(late, other.id)]))
    assert asks == [late["trial_id"]]  # not joined at write; the worker's rule refuses it too
    assert tasks._join([early["trial_id"], late["trial_id"]]) == 0
    assert _joined(db_engine, [early["trial_id"], late["trial_id"]]) == {
        early["trial_id"]: (False, False, None, None),
        late["trial_id"]: (False, False, None, None),
    }
