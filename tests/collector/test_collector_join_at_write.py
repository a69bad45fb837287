"""The join at write (``services._STORE_GROUP``): a trial whose origin observation is stored
already is stored joined by its own upload; an observation asks the worker's join for its trial
(stored earlier, in the same statement, or not yet), and a trial never asks.  Against the real
database, the worker's join called in-process.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import orjson
from sqlalchemy import text
from sqlalchemy.engine import Engine
from testkit import Enrolled, enroll_origin, enroll_probe, make_batch, make_observation, make_observation_batch, make_trial

from iwscope.metrics import JOINED_AT_INGEST
from iwscope.trials import rows, services, tasks, validation


def _trials(probe: Enrolled, trials: list[dict[str, Any]]) -> services.Upload:
    body = orjson.dumps(make_batch(probe.id, trials))
    return services.Upload(validation.validate_trial_batch(body, uuid.UUID(probe.id)), uuid.UUID(probe.id))


def _observations(origin: Enrolled, observations: list[dict[str, Any]]) -> services.Upload:
    body = orjson.dumps(make_observation_batch(origin.id, observations))
    return services.Upload(validation.validate_observation_batch(body, uuid.UUID(origin.id)), uuid.UUID(origin.id))


def _store(engine: Engine, *uploads: services.Upload) -> list[services.IngestResult]:
    services.store_group(engine, list(uploads))
    outcomes = [upload.outcome for upload in uploads]
    assert all(isinstance(outcome, services.IngestResult) for outcome in outcomes), outcomes
    return outcomes  # type: ignore[return-value]


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
    (stored,) = _store(db_engine, _trials(probe, trials))
    assert stored.accepted == 3 and stored.join_ids == []  # a trial never asks
    assert _joined(db_engine, ids) == dict.fromkeys(ids, (False, False, None, None))

    observations = [make_observation(trial, origin.id, response_latency_us=50_000 + i) for i, trial in enumerate(trials)]
    (answer,) = _store(db_engine, _observations(origin, observations))
    assert answer.accepted == 3 and sorted(answer.join_ids) == sorted(ids)
    assert tasks._join(answer.join_ids) == 3
    assert _joined(db_engine, ids) == {
        trial["trial_id"]: (True, True, 50_000 + i, trial["arm_iw"]) for i, trial in enumerate(trials)
    }
    (again,) = _store(db_engine, _observations(origin, observations))  # duplicates: nothing to ask
    assert (again.accepted, again.duplicates, again.join_ids) == (0, 3, [])
    assert tasks._join(ids) == 0  # joined_at is set once


def test_a_trial_after_its_observation_is_stored_joined(
    client: httpx.Client, enroll_token: str, origin_token: str, db_engine: Engine, in_process: None
) -> None:
    probe, origin = enroll_probe(client, enroll_token), enroll_origin(client, origin_token)
    trials = [make_trial(probe.id, origin.id, arm_iw=10) for _ in range(2)]
    ids = [trial["trial_id"] for trial in trials]
    (first,) = _store(db_engine, _observations(origin, [make_observation(trial, origin.id) for trial in trials]))
    assert sorted(first.join_ids) == sorted(ids)  # no trial yet: the observations ask the worker
    assert tasks._join(ids) == 0  # which finds nothing to join

    before = JOINED_AT_INGEST._value.get()
    (stored,) = _store(db_engine, _trials(probe, trials))
    assert stored.accepted == 2 and stored.join_ids == []
    assert _joined(db_engine, ids) == dict.fromkeys(ids, (True, True, 90_000, 10))
    assert JOINED_AT_INGEST._value.get() - before == 2
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
    stored, observed = _store(db_engine, _trials(probe, [trial]), _observations(origin, [make_observation(trial, origin.id)]))
    assert stored.join_ids == [] and observed.join_ids == [trial["trial_id"]]
    assert _joined(db_engine, [trial["trial_id"]]) == {trial["trial_id"]: (False, False, None, None)}
    assert tasks._join(observed.join_ids) == 1
    assert _joined(db_engine, [trial["trial_id"]]) == {trial["trial_id"]: (True, True, 90_000, 10)}


def test_an_observation_of_another_origin_is_not_joined(
    client: httpx.Client, enroll_token: str, origin_token: str, db_engine: Engine, in_process: None
) -> None:
    probe = enroll_probe(client, enroll_token)
    origin, other = enroll_origin(client, origin_token), enroll_origin(client, origin_token)
    early, late = make_trial(probe.id, origin.id), make_trial(probe.id, origin.id)
    _store(db_engine, _observations(other, [make_observation(early, other.id)]))
    _store(db_engine, _trials(probe, [early, late]))
    (answer,) = _store(db_engine, _observations(other, [make_observation(late, other.id)]))
    assert answer.join_ids == [late["trial_id"]]  # not joined at write; the worker's rule refuses it too
    assert tasks._join([early["trial_id"], late["trial_id"]]) == 0
    assert _joined(db_engine, [early["trial_id"], late["trial_id"]]) == {
        early["trial_id"]: (False, False, None, None),
        late["trial_id"]: (False, False, None, None),
    }
