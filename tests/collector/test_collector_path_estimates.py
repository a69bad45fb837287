"""Path estimates kept up incrementally equal a rebuild from the pairs' history.

With a real worker: uploads in several batches (trials, path samples, observations before and
after their trials, duplicates), then the row the drains folded up is compared, column by
column, with the row a rebuild (``rebuild_path_estimates``) writes from the same history.
"""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import httpx
import numpy as np
import redis
from sqlalchemy import text
from sqlalchemy.engine import Engine
from testkit import (
    Enrolled,
    make_batch,
    make_observation,
    make_observation_batch,
    make_path_sample,
    make_trial,
    wait_folded,
    wait_for,
)

from iwprobe import wire
from iwscope.analysis.rollups import ADVISORY_LOCK_KEY, PATH_WATERMARK_NAME
from iwscope.paths.services import RECENT_RATES
from iwscope.worker_client import JOIN_DRAIN_QUEUED, JOIN_PENDING

COLUMNS = (
    "min_rtt_us",
    "bottleneck_bps",
    "bdp_bytes",
    "loss_rate",
    "sample_count",
    "trial_count",
    "path_sample_count",
    "bytes_retrans_sum",
    "bytes_sent_sum",
    "recent_sample_bps",
    "recent_server_bps",
)


def _estimate(engine: Engine, probe_id: str, origin_id: str) -> dict[str, Any] | None:
    with engine.connect() as connection:
        row = (
            connection.execute(
                text(f"SELECT {', '.join(COLUMNS)} FROM path_estimates WHERE probe_id = :p AND origin_id = :o"),
                {"p": probe_id, "o": origin_id},
            )
            .mappings()
            .first()
        )
    return dict(row) if row is not None else None


def _all_joined(engine: Engine, probe_id: str, expected: int) -> bool:
    with engine.connect() as connection:
        return (
            connection.execute(text("SELECT count(joined_at) FROM trials WHERE probe_id = :p"), {"p": probe_id}).scalar_one()
            == expected
        )


def _join_state(worker: Any, engine: Engine, probe_id: str) -> str:
    """What a join that did not come shows: the pending list, the drain's queued mark, the
    worker's queue, the joined count, the worker log's tail."""
    client = redis.Redis.from_url(worker.redis_url)
    try:
        prefix = f"iwscope:{worker.queue}:"  # worker_client.key() of the session's queue
        state = (
            f"pending={client.llen(prefix + JOIN_PENDING)} mark_ttl={client.ttl(prefix + JOIN_DRAIN_QUEUED)} "
            f"queue={client.llen(worker.queue)} keys={sorted(k.decode() for k in client.keys(prefix + '*'))}"
        )
    finally:
        client.close()
    with engine.connect() as connection:
        joined = connection.execute(
            text("SELECT count(joined_at), count(*) FROM trials WHERE probe_id = :p"), {"p": probe_id}
        ).one()
    return f"{state} joined/trials={tuple(joined)}\n{worker.log()[-4000:]}"


def _upload(
    client: httpx.Client, probe: Enrolled, origin: Enrolled, rng: random.Random, trials: int, samples: int, observed_first: int
) -> list[dict[str, Any]]:
    """A batch of ``trials`` (the first ``observed_first`` observed before the upload) and ``samples``."""
    batch = [make_trial(probe.id, origin.id, arm_iw=rng.choice((3, 10))) for _ in range(trials)]
    for trial in batch:
        trial["tcp_info"]["min_rtt"] = rng.randint(15_000, 40_000)
    if observed_first:
        assert (
            client.post(
                wire.OBSERVATIONS_BATCH_PATH,
                json=make_observation_batch(origin.id, [_observation(trial, origin, rng) for trial in batch[:observed_first]]),
                headers=origin.headers,
            ).status_code
            == 200
        )
    path_samples = [
        make_path_sample(
            probe.id,
            origin.id,
            min_rtt_us=rng.randint(14_000, 40_000),
            bottleneck_bps=rng.choice((None, rng.randint(5_000_000, 20_000_000))),
        )
        for _ in range(samples)
    ]
    body = make_batch(probe.id, batch, path_samples)
    assert client.post(wire.TRIALS_BATCH_PATH, json=body, headers=probe.headers).json()["duplicates"] == 0
    assert client.post(wire.TRIALS_BATCH_PATH, json=body, headers=probe.headers).json()["accepted"] == 0
    return batch


def _observation(trial: dict[str, Any], origin: Enrolled, rng: random.Random) -> dict[str, Any]:
    observation = make_observation(trial, origin.id)
    observation["tcp_info"].update(
        bytes_retrans=rng.choice((0, 1448, 2896)),
        bytes_sent=rng.randint(90_000, 110_000),
        delivery_rate=rng.choice((0, rng.randint(500_000, 2_500_000))),
    )
    return observation


def test_incremental_estimates_equal_a_rebuild(
    celery_worker, client: httpx.Client, probe: Enrolled, origin: Enrolled, db_engine: Engine
) -> None:
    rng = random.Random(7)
    stored: list[dict[str, Any]] = []
    for trials, samples, observed_first in ((12, 2, 5), (30, 0, 30), (8, 3, 0), (25, 1, 10)):
        stored += _upload(client, probe, origin, rng, trials, samples, observed_first)
    # The late observations (joined through their own upload's drain); one trial stays unjoined.
    late = stored[:-1]  # observations of the observed-first trials again: duplicates, stored once
    assert (
        client.post(
            wire.OBSERVATIONS_BATCH_PATH,
            json=make_observation_batch(origin.id, [_observation(trial, origin, rng) for trial in late]),
            headers=origin.headers,
        ).status_code
        == 200
    )
    wait_for(
        lambda: _all_joined(db_engine, probe.id, len(stored) - 1),
        timeout=60,
        what="every observed trial joined",
        detail=lambda: _join_state(celery_worker, db_engine, probe.id),
    )
    wait_folded(db_engine, probe.id)  # the last joins' server side included
    incremental = _estimate(db_engine, probe.id, origin.id)
    assert incremental is not None and incremental["sample_count"] == len(stored) + 6
    assert incremental["trial_count"] == len(stored) and incremental["path_sample_count"] == 6
    assert 0 < len(incremental["recent_server_bps"]) <= RECENT_RATES
    assert celery_worker.send("iwscope.analysis.tasks.rebuild_path_estimates", [[probe.id, origin.id]]) == 1
    rebuilt = _estimate(db_engine, probe.id, origin.id)
    assert rebuilt is not None
    # The recent rates are kept in the order they were folded in (a rebuild orders by time).
    for column in ("recent_sample_bps", "recent_server_bps"):
        assert sorted(incremental.pop(column)) == sorted(rebuilt.pop(column))
    assert incremental == rebuilt


def test_rows_from_before_the_parts_are_folded_again_from_zero(
    celery_worker, client: httpx.Client, probe: Enrolled, origin: Enrolled, db_engine: Engine
) -> None:
    """As migration 0007 leaves a deployment: rows with parts 0 (``sample_count`` not) and no
    watermark of the estimates yet.  The first refresh folds the whole history in from zero
    instead of adding to what the row says."""
    rng = random.Random(8)
    first = _upload(client, probe, origin, rng, 10, 1, 10)
    wait_for(lambda: (row := _estimate(db_engine, probe.id, origin.id)) is not None and row["sample_count"] == 11)
    with db_engine.begin() as connection:  # as migration 0007 leaves an older row
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
        connection.execute(
            text(
                "UPDATE path_estimates SET trial_count = 0, path_sample_count = 0, "
                "bytes_retrans_sum = 0, bytes_sent_sum = 0, recent_sample_bps = '{}', "
                "recent_server_bps = '{}' WHERE probe_id = :p"
            ),
            {"p": probe.id},
        )
        connection.execute(text("DELETE FROM analysis_watermarks WHERE name = :name"), {"name": PATH_WATERMARK_NAME})
    second = _upload(client, probe, origin, rng, 5, 0, 5)
    row = wait_for(
        lambda: (row := _estimate(db_engine, probe.id, origin.id)) is not None and row["sample_count"] == 16 and row, timeout=60
    )
    assert (row["trial_count"], row["path_sample_count"]) == (len(first) + len(second), 1)
    assert row["bytes_sent_sum"] > 0 and row["loss_rate"] is not None


def test_the_newest_rates_are_kept_in_order_with_the_smallest_rtt(
    celery_worker, client: httpx.Client, probe: Enrolled, origin: Enrolled, db_engine: Engine
) -> None:
    """200 path samples in two uploads: the 128 newest bandwidth estimates, oldest first; their
    90th percentile is the bottleneck; the minimum RTT is over all 200."""
    start = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    samples = [
        make_path_sample(
            probe.id,
            origin.id,
            min_rtt_us=30_000 + index,
            bottleneck_bps=1_000_000 * (index + 1),
            measured_at=wire.utc_timestamp(start + dt.timedelta(seconds=index)),
        )
        for index in range(200)
    ]
    samples[17]["min_rtt_us"] = 12_000
    for part in (samples[:100], samples[100:]):
        assert (
            client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, [], part), headers=probe.headers).json()["accepted"]
            == 100
        )
    row = wait_for(
        lambda: (row := _estimate(db_engine, probe.id, origin.id)) is not None and row["path_sample_count"] == 200 and row,
        timeout=60,
    )
    newest = [1_000_000 * (index + 1) for index in range(200 - RECENT_RATES, 200)]
    assert row["recent_sample_bps"] == newest
    assert row["bottleneck_bps"] == round(float(np.percentile(newest, 90)))
    assert row["min_rtt_us"] == 12_000 and row["sample_count"] == 200 and row["trial_count"] == 0
    assert row["bdp_bytes"] == round(row["bottleneck_bps"] * 12_000 / 8_000_000)
