"""The model beside the measurement (``iwscope.analysis.model_fit``): paths built from the model's
own numbers agree with it; paths that depart from it in known ways are odd, each with the reason
its trials show; a handful of pairs is "n too small".  Real PostgreSQL, rolled back."""

from __future__ import annotations

import random
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.analysis import Filters, PathModelFit, model_fit
from iwscope.model import congestion_control, predict, predict_with_loss

from .datasets import add_campaign, add_observation, add_path, add_probe, add_trial, new_campaign_id

RTT_MS, RATE_BPS, SIZE = 100.0, 10e6, 30_000  # 22 segments: IW3 needs 3 more rounds than IW10
ROUNDS = 30


def _model_ms(iw: int) -> float:
    return predict(SIZE, iw, RTT_MS / 1000, RATE_BPS).server_latency_s * 1000


def _path(session: Session, campaign_id: int, region: str, loss: float = 0.0) -> tuple[uuid.UUID, uuid.UUID]:
    probe, origin = add_probe(session, region), uuid.uuid4()
    session.flush()
    add_path(session, probe, origin, RTT_MS, int(RATE_BPS), loss)
    return probe, origin


def _trial(
    session: Session, campaign_id: int, path: tuple[uuid.UUID, uuid.UUID], iw: int, ms: float, round_: int, **extra: int
) -> uuid.UUID:
    return add_trial(
        session,
        campaign_id=campaign_id,
        probe_id=path[0],
        origin_id=path[1],
        iw=iw,
        server_ms=ms,
        size=SIZE,
        round_=round_,
        bytes_sent=SIZE,
        **extra,
    )


def _by_region(fit_paths: list[PathModelFit]) -> dict[str, PathModelFit]:
    return {path.region: path for path in fit_paths}


def test_paths_as_the_model_says_agree_and_departures_are_odd_with_their_reason(db_session: Session) -> None:
    campaign_id = new_campaign_id()
    add_campaign(db_session, campaign_id, "model-fit")
    rng = random.Random(38)
    # 1. Loss-free, exactly the model plus +-1 ms of noise.
    clean = _path(db_session, campaign_id, "mf-clean")
    for round_ in range(ROUNDS):
        for iw in (3, 10):
            _trial(db_session, campaign_id, clean, iw, _model_ms(iw) + rng.uniform(-1, 1), round_)
    # 2. 2 % random loss: latencies drawn from the model's own simulated connections (another
    # seed), with the baseline's retransmitted bytes at 2 % of those sent.
    lossy = _path(db_session, campaign_id, "mf-lossy", loss=0.02)
    drawn = {
        iw: predict_with_loss(SIZE, iw, RTT_MS / 1000, RATE_BPS, 0.02, samples=4 * ROUNDS, seed=11, keep_samples=True).trials
        for iw in (3, 10)
    }
    for round_ in range(4 * ROUNDS):
        for iw in (3, 10):
            simulated = drawn[iw][round_]
            _trial(
                db_session,
                campaign_id,
                lossy,
                iw,
                simulated.server_latency_s * 1000,
                round_,
                retrans=simulated.server_total_retrans,
                bytes_retrans=int(0.02 * SIZE),
            )
    # 3. IW10 gains nothing: the client's receive window holds 4 segments.  Where the origin
    # reported the window, the model plays the cap and agrees; where it only flagged the trials
    # as window-limited, the model expects IW10's gain and the path is odd for that reason.
    capped = _path(db_session, campaign_id, "mf-rwnd-known")
    limited = _path(db_session, campaign_id, "mf-rwnd")
    for round_ in range(ROUNDS):
        for iw in (3, 10):
            trial = _trial(db_session, campaign_id, capped, iw, _model_ms(3) + rng.uniform(-1, 1), round_)
            add_observation(db_session, trial, capped[1], iw, SIZE, peer_rwnd=4 * 1448)
            trial = _trial(db_session, campaign_id, limited, iw, _model_ms(3) + rng.uniform(-1, 1), round_)
            add_observation(db_session, trial, limited[1], iw, SIZE, rwnd_limited=True)
            db_session.flush()
            db_session.execute(text("UPDATE trials SET rwnd_limited = true WHERE trial_id = :id"), {"id": trial})
    # 4. IW10's burst overflows a shallow buffer: it retransmits in every trial, after queueing,
    # and pays an RTO's worth of time.
    shallow = _path(db_session, campaign_id, "mf-shallow")
    for round_ in range(ROUNDS):
        for iw in (3, 10):
            burst = iw == 10
            trial = _trial(
                db_session,
                campaign_id,
                shallow,
                iw,
                _model_ms(iw) + (300 if burst else 0) + rng.uniform(-1, 1),
                round_,
                retrans=2 if burst else 0,
                bytes_retrans=2 * 1448 if burst else 0,
            )
            add_observation(db_session, trial, shallow[1], iw, SIZE, min_rtt_us=100_000, rtt_us=170_000 if burst else 101_000)
    # 5. Six pairs: no verdict.
    few = _path(db_session, campaign_id, "mf-few")
    for round_ in range(6):
        for iw in (3, 10):
            _trial(db_session, campaign_id, few, iw, _model_ms(iw), round_)
    db_session.flush()

    fit = model_fit(db_session, Filters(campaign_ids=(campaign_id,)))
    paths = _by_region(fit.paths)
    assert set(paths) == {"mf-clean", "mf-lossy", "mf-rwnd-known", "mf-rwnd", "mf-shallow", "mf-few"}
    assert {path.bucket for path in fit.paths} == {"<=100 ms"}

    agreeing = paths["mf-clean"]
    assert agreeing.inputs is not None and agreeing.inputs.loss == 0.0 and agreeing.inputs.min_rtt_ms == RTT_MS
    assert agreeing.n_pairs == ROUNDS and not agreeing.too_small
    assert agreeing.predicted_ms == pytest.approx(_model_ms(3) - _model_ms(10), abs=0.01)
    assert agreeing.measured_ms == pytest.approx(agreeing.predicted_ms, abs=1.0)
    assert agreeing.agrees and not agreeing.odd and agreeing.explanations == []
    assert agreeing.residual_ms == pytest.approx(agreeing.measured_ms - agreeing.predicted_ms)
    assert [arm.iw for arm in agreeing.arms] == [3, 10]
    assert all(abs(arm.gap or 1) < 0.01 for arm in agreeing.arms)

    lossy_fit = paths["mf-lossy"]
    assert lossy_fit.inputs is not None and lossy_fit.inputs.loss == pytest.approx(0.02, rel=0.01)
    low, high = lossy_fit.predicted_ci_ms or (0.0, 0.0)
    assert lossy_fit.predicted_ms is not None and low < lossy_fit.predicted_ms < high
    assert lossy_fit.measured_ci_ms is not None
    assert lossy_fit.agrees and not lossy_fit.odd, lossy_fit

    known = paths["mf-rwnd-known"]
    assert known.inputs is not None and known.inputs.rwnd_segments == 4
    # the model itself plays the cap: with 4 segments it predicts (almost) no gain either way
    assert known.predicted_ms is not None and abs(known.predicted_ms) < 0.1 * agreeing.predicted_ms
    assert known.agrees and not known.odd, known
    rwnd = paths["mf-rwnd"]
    assert rwnd.inputs is not None and rwnd.inputs.rwnd_segments is None
    assert rwnd.odd and not rwnd.agrees
    assert "receive window: the origin found 100% of trials limited by the client's window" in rwnd.explanations, rwnd

    shallow_fit = paths["mf-shallow"]
    assert shallow_fit.odd
    assert any(reason.startswith("shallow buffer: IW 10 retransmits in 100% of trials") for reason in shallow_fit.explanations)

    small = paths["mf-few"]
    assert small.too_small and small.predicted_ms is None and small.agrees is None and not small.odd
    assert small.reason and "MIN_PAIRS" in small.reason

    assert fit.odd_paths == 2
    [bucket] = fit.buckets
    assert bucket.n_paths == 6 and bucket.n_pairs == sum(path.n_pairs for path in fit.paths)
    weighted = [(path.n_pairs, path.predicted_ms) for path in fit.paths if path.predicted_ms is not None]
    assert bucket.predicted_ms == pytest.approx(sum(n * ms for n, ms in weighted) / sum(n for n, _ in weighted))
    assert bucket.residual_ms == pytest.approx(bucket.measured_ms - bucket.predicted_ms)
    # the bucket's Monte-Carlo interval: around its prediction, narrower than any one path's
    assert bucket.predicted_ci_ms is not None
    low, high = bucket.predicted_ci_ms
    widths = [path.predicted_ci_ms[1] - path.predicted_ci_ms[0] for path in fit.paths if path.predicted_ci_ms]
    assert low < bucket.predicted_ms < high and 0 < high - low < max(widths)


def test_a_proxy_shows_in_the_round_trip_times_and_the_client_metric_is_modelled_too(db_session: Session) -> None:
    campaign_id = new_campaign_id()
    add_campaign(db_session, campaign_id, "model-fit-proxy")
    proxied = _path(db_session, campaign_id, "mf-proxy")
    for round_ in range(ROUNDS):
        for iw in (3, 10):
            # the proxy's own IW answers both arms: no difference
            trial = _trial(db_session, campaign_id, proxied, iw, 120.0 + round_ % 3, round_)
            add_observation(db_session, trial, proxied[1], iw, SIZE, min_rtt_us=4_000, rtt_us=5_000)
            db_session.flush()
            db_session.execute(text("UPDATE trials SET tcpi_min_rtt_us = 100000 WHERE trial_id = :id"), {"id": trial})
    fit = model_fit(db_session, Filters(campaign_ids=(campaign_id,)))
    [path] = fit.paths
    assert path.odd
    proxy = "proxy: the origin's min RTT 4.0 ms is far below the probe's 100.0 ms"
    assert any(reason.startswith(proxy) for reason in path.explanations), path
    client = model_fit(db_session, Filters(campaign_ids=(campaign_id,), metric="client"))
    assert client.metric == "client" and client.paths[0].predicted_ms is not None
    # the client's total adds the handshake and the request to both arms: the same difference
    assert client.paths[0].predicted_ms == pytest.approx(path.predicted_ms, abs=0.5)


def test_congestion_controls_are_named() -> None:
    assert congestion_control("bbr") == "bbr"
    with pytest.raises(ValueError, match="cubic, reno, bbr"):
        congestion_control("vegas")


def test_large_selections_are_cut_and_say_so(db_session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    from iwscope.analysis import modelfit

    campaign_id = new_campaign_id()
    add_campaign(db_session, campaign_id, "model-fit-cut")
    for region in ("mf-cut-a", "mf-cut-b"):
        path = _path(db_session, campaign_id, region)
        for round_ in range(ROUNDS + (5 if region == "mf-cut-a" else 0)):
            for iw in (3, 10):
                _trial(db_session, campaign_id, path, iw, _model_ms(iw), round_)
    db_session.flush()
    monkeypatch.setattr(modelfit, "MAX_MODELLED_PATHS", 1)
    fit = model_fit(db_session, Filters(campaign_ids=(campaign_id,)))
    paths = _by_region(fit.paths)
    assert paths["mf-cut-a"].predicted_ms is not None  # the path with most trials is modelled
    assert paths["mf-cut-b"].predicted_ms is None and paths["mf-cut-b"].reason
    assert paths["mf-cut-b"].reason.startswith("not modelled: more than 1 paths match")
    assert (fit.trials_read, fit.truncated) == (4 * ROUNDS + 10, False)
    monkeypatch.setattr(modelfit, "MAX_TRIALS", 50)
    cut = model_fit(db_session, Filters(campaign_ids=(campaign_id,)))
    assert (cut.trials_read, cut.truncated) == (50, True)
