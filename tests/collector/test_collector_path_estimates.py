"""Path estimates kept up incrementally equal a rebuild from the pairs' history.

With a real worker: uploads in several batches (trials, path samples, observations before and
after their trials, duplicates), then the row the drains folded up is compared, column by
column, with the row a rebuild (``recompute_path_estimates``) writes from the same history.
"""

from __future__ import annotations

import random
from typing import Any

import httpx
import numpy as np
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from collector_helpers import (Enrolled, make_batch, make_observation, make_observation_batch, make_path_sample,
                               make_trial)
from iwprobe import wire
from iwscope.paths.services import RECENT_RATES, PathDelta, fold_path_deltas, recompute_path_estimates
from test_collector_worker import wait_for

COLUMNS = ("min_rtt_us", "bottleneck_bps", "bdp_bytes", "loss_rate", "sample_count", "trial_count",
           "path_sample_count", "bytes_retrans_sum", "bytes_sent_sum", "recent_sample_bps", "recent_server_bps")


def _estimate(engine: Engine, probe_id: str, origin_id: str) -> dict[str, Any] | None:
    with engine.connect() as connection:
        row = connection.execute(text(f"SELECT {', '.join(COLUMNS)} FROM path_estimates "
                                      "WHERE probe_id = :p AND origin_id = :o"),
                                 {"p": probe_id, "o": origin_id}).mappings().first()
    return dict(row) if row is not None else None


def _all_joined(engine: Engine, probe_id: str, expected: int) -> bool:
    with engine.connect() as connection:
        return connection.execute(text("SELECT count(joined_at) FROM trials WHERE probe_id = :p"),
                                  {"p": probe_id}).scalar_one() == expected


def _upload(client: httpx.Client, probe: Enrolled, origin: Enrolled, rng: random.Random, trials: int,
            samples: int, observed_first: int) -> list[dict[str, Any]]:
    """A batch of ``trials`` (the first ``observed_first`` observed before the upload) and ``samples``."""
    batch = [make_trial(probe.id, origin.id, arm_iw=rng.choice((3, 10))) for _ in range(trials)]
    for trial in batch:
        trial["tcp_info"]["min_rtt"] = rng.randint(15_000, 40_000)
    if observed_first:
        assert client.post(wire.OBSERVATIONS_BATCH_PATH, json=make_observation_batch(origin.id, [
            _observation(trial, origin, rng) for trial in batch[:observed_first]]),
            headers=origin.headers).status_code == 200
    path_samples = [make_path_sample(probe.id, origin.id, min_rtt_us=rng.randint(14_000, 40_000),
                                     bottleneck_bps=rng.choice((None, rng.randint(5_000_000, 20_000_000))))
                    for _ in range(samples)]
    body = make_batch(probe.id, batch, path_samples)
    assert client.post(wire.TRIALS_BATCH_PATH, json=body, headers=probe.headers).json()["duplicates"] == 0
    assert client.post(wire.TRIALS_BATCH_PATH, json=body, headers=probe.headers).json()["accepted"] == 0
    return batch


def _observation(trial: dict[str, Any], origin: Enrolled, rng: random.Random) -> dict[str, Any]:
    observation = make_observation(trial, origin.id)
    observation["tcp_info"].update(bytes_retrans=rng.choice((0, 1448, 2896)), bytes_sent=rng.randint(90_000, 110_000),
                                   delivery_rate=rng.choice((0, rng.randint(500_000, 2_500_000))))
    return observation


def test_incremental_estimates_equal_a_rebuild(celery_worker, client: httpx.Client, probe: Enrolled,
                                               origin: Enrolled, db_engine: Engine) -> None:
    rng = random.Random(7)
    stored: list[dict[str, Any]] = []
    for trials, samples, observed_first in ((12, 2, 5), (30, 0, 30), (8, 3, 0), (25, 1, 10)):
        stored += _upload(client, probe, origin, rng, trials, samples, observed_first)
    # The late observations (joined through their own upload's drain); one trial stays unjoined.
    late = stored[:-1]  # observations of the observed-first trials again: duplicates, stored once
    assert client.post(wire.OBSERVATIONS_BATCH_PATH, json=make_observation_batch(origin.id, [
        _observation(trial, origin, rng) for trial in late]), headers=origin.headers).status_code == 200
    wait_for(lambda: _all_joined(db_engine, probe.id, len(stored) - 1), timeout=60)
    incremental = wait_for(lambda: (row := _estimate(db_engine, probe.id, origin.id)) is not None
                           and row["sample_count"] == len(stored) + 6 and row, timeout=60)
    assert incremental["trial_count"] == len(stored) and incremental["path_sample_count"] == 6
    assert 0 < len(incremental["recent_server_bps"]) <= RECENT_RATES
    assert celery_worker.send("iwscope.paths.tasks.recompute_path_estimates", [[probe.id, origin.id]]) == 1
    rebuilt = _estimate(db_engine, probe.id, origin.id)
    assert rebuilt is not None
    # The recent rates are kept in the order they were folded in (a rebuild orders by time).
    for column in ("recent_sample_bps", "recent_server_bps"):
        assert sorted(incremental.pop(column)) == sorted(rebuilt.pop(column))
    assert incremental == rebuilt


def test_a_row_from_before_the_parts_is_rebuilt_on_first_touch(celery_worker, client: httpx.Client, probe: Enrolled,
                                                               origin: Enrolled, db_engine: Engine) -> None:
    """A row written before migration 0007 (parts 0, ``sample_count`` not): adding to its zero
    parts would undercount; the next fold rebuilds it from the history instead."""
    rng = random.Random(8)
    first = _upload(client, probe, origin, rng, 10, 1, 10)
    wait_for(lambda: (row := _estimate(db_engine, probe.id, origin.id)) is not None and row["sample_count"] == 11)
    with db_engine.begin() as connection:  # as migration 0007 leaves an older row
        connection.execute(text("UPDATE path_estimates SET trial_count = 0, path_sample_count = 0, "
                                "bytes_retrans_sum = 0, bytes_sent_sum = 0, recent_sample_bps = '{}', "
                                "recent_server_bps = '{}' WHERE probe_id = :p"), {"p": probe.id})
    second = _upload(client, probe, origin, rng, 5, 0, 5)
    row = wait_for(lambda: (row := _estimate(db_engine, probe.id, origin.id)) is not None
                   and row["sample_count"] == 16 and row, timeout=60)
    assert (row["trial_count"], row["path_sample_count"]) == (len(first) + len(second), 1)
    assert row["bytes_sent_sum"] > 0 and row["loss_rate"] is not None


def test_fold_keeps_the_newest_rates_and_the_smallest_rtt(db_session: Session, probe: Enrolled,
                                                          origin: Enrolled) -> None:
    pair = (probe.id, origin.id)
    older = PathDelta(trials=100, min_rtt_us=30_000, server_bps=list(range(1, 101)))
    newer = PathDelta(trials=50, samples=0, min_rtt_us=40_000, bytes_retrans=10, bytes_sent=1000,
                      server_bps=list(range(101, 201)))
    assert fold_path_deltas(db_session, {pair: older}) == 1
    assert fold_path_deltas(db_session, {pair: newer}) == 1
    row = db_session.execute(text("SELECT * FROM path_estimates WHERE probe_id = :p AND origin_id = :o"),
                             {"p": probe.id, "o": origin.id}).mappings().one()
    assert row["recent_server_bps"] == list(range(200 - RECENT_RATES + 1, 201))  # the newest, oldest first
    assert row["min_rtt_us"] == 30_000 and row["sample_count"] == row["trial_count"] == 150
    assert row["loss_rate"] == 0.01
    expected_p90 = round(float(np.percentile(row["recent_server_bps"], 90)))
    assert row["bottleneck_bps"] == expected_p90
    assert row["bdp_bytes"] == round(expected_p90 * 30_000 / 8_000_000)
    # A rebuild of a pair without history writes nothing (no trials, no samples stored).
    assert recompute_path_estimates(db_session, [list(pair)]) == 0
