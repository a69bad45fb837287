"""Worker effects with a real Celery worker process: the join and the path estimates."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.engine import Engine
from testkit import Enrolled, make_batch, make_observation, make_observation_batch, make_path_sample, make_trial, wait_for

from iwprobe import wire


def test_upload_triggers_join_and_path_estimates(
    celery_worker, client: httpx.Client, probe: Enrolled, origin: Enrolled, db_engine: Engine
) -> None:
    trials = [make_trial(probe.id, origin.id, arm_iw=10) for _ in range(4)]
    trials[0]["tcp_info"]["min_rtt"] = 18_000  # the smallest client min_rtt
    # Observations for three of the four trials arrive first: the trial upload triggers the join.
    observations = [make_observation(trial, origin.id) for trial in trials[:3]]
    observations[1]["tcp_info"].update(bytes_retrans=0, bytes_sent=100_000)
    observations[2].update(response_latency_us=None, cwnd_mismatch=True, snd_cwnd_at_accept=4)
    assert (
        client.post(
            wire.OBSERVATIONS_BATCH_PATH, json=make_observation_batch(origin.id, observations), headers=origin.headers
        ).status_code
        == 200
    )
    samples = [
        make_path_sample(probe.id, origin.id, min_rtt_us=rtt, bottleneck_bps=bps)
        for rtt, bps in ((19_500, 8_000_000), (25_000, 10_000_000), (30_000, 9_000_000))
    ]
    assert (
        client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, trials, samples), headers=probe.headers).status_code == 200
    )

    def joined() -> list[Any]:
        with db_engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT trial_id::text, server_latency_us, server_first_byte_us, server_total_retrans, "
                    "server_bytes_retrans, server_bytes_sent, server_snd_cwnd_at_accept, cwnd_mismatch, rwnd_limited, "
                    "joined_at FROM trials WHERE probe_id = :p"
                ),
                {"p": probe.id},
            ).all()
        return rows if sum(row.joined_at is not None for row in rows) == 3 else []

    rows = {row.trial_id: row for row in wait_for(joined, timeout=60)}
    first = rows[trials[0]["trial_id"]]
    assert (
        first.server_latency_us,
        first.server_first_byte_us,
        first.server_total_retrans,
        first.server_bytes_retrans,
        first.server_bytes_sent,
        first.server_snd_cwnd_at_accept,
        first.cwnd_mismatch,
        first.rwnd_limited,
    ) == (90_000, 150, 1, 1448, 100_250, 10, False, False)
    third = rows[trials[2]["trial_id"]]
    assert third.server_latency_us is None and third.cwnd_mismatch is True and third.server_snd_cwnd_at_accept == 4
    assert rows[trials[3]["trial_id"]].joined_at is None

    def estimate() -> Any:
        with db_engine.connect() as connection:
            row = (
                connection.execute(
                    text("SELECT * FROM path_estimates WHERE probe_id = :p AND origin_id = :o"), {"p": probe.id, "o": origin.id}
                )
                .mappings()
                .first()
            )
        return row if row is not None and row["loss_rate"] is not None else None

    path = wait_for(estimate, timeout=60)
    assert path["min_rtt_us"] == 18_000  # min over samples (19.5 ms) and trials' tcpi_min_rtt (18 ms)
    # 90th percentile (linear interpolation) of 8, 9, 10 Mbit/s = 9.8 Mbit/s.
    assert path["bottleneck_bps"] == 9_800_000
    assert path["bdp_bytes"] == round(9_800_000 * 18_000 / 8_000_000)
    # Retransmitted bytes / bytes sent over the joined trials: (1448 + 0 + 1448) / (100250 + 100000 + 100250).
    assert abs(path["loss_rate"] - 2896 / 300_500) < 1e-12
    assert path["sample_count"] == 3 + 4

    # The late observation of the fourth trial: its upload triggers the join too.
    late = make_observation(trials[3], origin.id, response_latency_us=77_000)
    assert (
        client.post(
            wire.OBSERVATIONS_BATCH_PATH, json=make_observation_batch(origin.id, [late]), headers=origin.headers
        ).status_code
        == 200
    )

    def fourth_joined() -> bool:
        with db_engine.connect() as connection:
            return (
                connection.execute(
                    text("SELECT server_latency_us FROM trials WHERE trial_id = :t"), {"t": trials[3]["trial_id"]}
                ).scalar_one()
                == 77_000
            )

    wait_for(fourth_joined)


def test_tasks_are_idempotent(celery_worker, client: httpx.Client, probe: Enrolled, origin: Enrolled, db_engine: Engine) -> None:
    trial = make_trial(probe.id, origin.id)
    assert client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, [trial]), headers=probe.headers).status_code == 200
    # Store the observation directly (as if its upload's task was lost), then let the sweep find it.
    assert (
        client.post(
            wire.OBSERVATIONS_BATCH_PATH,
            json=make_observation_batch(origin.id, [make_observation(trial, origin.id)]),
            headers=origin.headers,
        ).status_code
        == 200
    )
    first = celery_worker.send("iwscope.trials.tasks.join_observations", [trial["trial_id"]])
    second = celery_worker.send("iwscope.trials.tasks.join_observations", [trial["trial_id"]])
    swept = celery_worker.send("iwscope.trials.tasks.sweep")
    assert second == {"joined": 0} and swept["joined"] == 0
    assert first["joined"] in (0, 1)  # 0 when the upload's own task got there first
    with db_engine.connect() as connection:
        joined_at = connection.execute(
            text("SELECT joined_at FROM trials WHERE trial_id = :t"), {"t": trial["trial_id"]}
        ).scalar_one()
    assert joined_at is not None

    def estimate_after_join() -> Any:  # folded by the refresh the join queued
        with db_engine.connect() as connection:
            return connection.execute(
                text(
                    "SELECT sample_count, loss_rate, updated_at FROM path_estimates WHERE probe_id = :p AND loss_rate IS NOT NULL"
                ),
                {"p": probe.id},
            ).first()

    estimate = wait_for(estimate_after_join)
    pairs = [[probe.id, origin.id]]
    assert celery_worker.send("iwscope.analysis.tasks.rebuild_path_estimates", pairs) == 1
    assert celery_worker.send("iwscope.analysis.tasks.rebuild_path_estimates", pairs) == 1
    with db_engine.connect() as connection:
        again = connection.execute(
            text("SELECT sample_count, loss_rate, updated_at FROM path_estimates WHERE probe_id = :p"), {"p": probe.id}
        ).one()
    assert (again.sample_count, again.loss_rate) == (estimate.sample_count, estimate.loss_rate)
    partitions = celery_worker.send("iwscope.trials.tasks.ensure_partitions")
    assert len(partitions) == 3 and all(name.startswith("trials_p") for name in partitions)
