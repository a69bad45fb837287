"""The lab twin's fit (``iwscope_lab.twin.fit_path``) from a path's trials, and its report's marking
of predictions: pure code on hand-made rows (the runs are in docs/reproduction.md)."""

from __future__ import annotations

import json
from typing import Any

import click
import pytest
from pydantic import ValidationError

from iwscope.predictions.schemas import TwinResultIn
from iwscope_lab.cli_campaign import _arm_labels
from iwscope_lab.twin import Estimate, TwinPath, TwinResult, compare, fit_path, overlaps, path_estimate, stratified
from iwscope_lab.twin_report import twin_markdown

pytestmark = pytest.mark.unit


def _row(
    arm: int | str,
    round_: int,
    latency_ms: float,
    *,
    retrans: int = 0,
    origin_rtt_ms: float = 100.0,
    est_rtt_ms: float | None = 100.0,
) -> tuple[Any, ...]:
    """A row of ``twin.read_paths``: the arm by its label (column 4)."""
    sent = 20_000
    return (
        "probe-1",
        "lagos-1",
        "africa",
        "origin-1",
        str(arm),
        round_,
        20_000,
        int(latency_ms * 1000),
        retrans,
        1448 * retrans,
        sent,
        101_000,
        int(origin_rtt_ms * 1000),
        None if est_rtt_ms is None else int(est_rtt_ms * 1000),
        2_000_000,
    )


def test_loss_comes_from_the_baseline_arm_and_an_overflow_fixes_the_buffer_at_the_queue_seen() -> None:
    rows = []
    for round_ in range(40):
        rows.append(_row(3, round_, 500, retrans=1 if round_ % 10 == 0 else 0, origin_rtt_ms=110))
        rows.append(_row(10, round_, 400, retrans=2, origin_rtt_ms=148))  # every IW10 burst overflows
    path = fit_path(rows, 3, 10)
    assert path is not None
    assert (path.rtt_ms, path.rate_bps) == (100.0, 2_000_000.0)
    assert path.loss == pytest.approx(4 * 1448 / (40 * 20_000), abs=1e-5)  # the baseline's 4 retransmissions only
    assert path.buffer_fit == "queue seen"
    assert path.queue_seen_bytes == pytest.approx(48_000 * 2_000_000 / 8e6, rel=0.01)  # 48 ms of queue at 2 Mbit/s
    assert path.buffer_bytes == path.queue_seen_bytes and not path.beyond_fit(32)
    link = path.link()
    assert link.down.buffer_bytes == path.buffer_bytes and link.down.delay_ms == 50.0 and link.up.loss == path.loss


def test_retransmissions_behind_a_queue_longer_than_the_initial_rto_are_timeouts_not_overflow() -> None:
    """eu-modem of make demo: the IW10 arm retransmits more, but its bursts waited 1.3 s in the
    queue -- past the 1 s initial RTO -- so the buffer is not fitted at the queue seen."""
    rows = []
    for round_ in range(40):
        rows.append(_row(3, round_, 2500, retrans=1 if round_ % 10 == 0 else 0, origin_rtt_ms=900))
        rows.append(_row(10, round_, 2400, retrans=2, origin_rtt_ms=1400))  # 1.3 s of queue at the end
    path = fit_path(rows, 3, 10)
    assert path is not None
    assert (path.buffer_bytes, path.buffer_fit) == (None, "timeouts, not overflow")
    assert path.queue_seen_bytes == pytest.approx(1.3 * 2_000_000 / 8, rel=0.01)


def test_without_an_overflow_the_buffer_is_unlimited_and_large_bursts_are_beyond_the_fit() -> None:
    rows = [_row(iw, round_, 400, origin_rtt_ms=104, est_rtt_ms=None) for round_ in range(30) for iw in (3, 10)]
    path = fit_path(rows, 3, 10)
    assert path is not None
    assert path.rtt_ms == 101.0  # the smallest client min RTT, without a path estimate
    assert (path.buffer_bytes, path.buffer_fit, path.loss) == (None, "no overflow seen", 0.0)
    # 2 Mbit/s x 101 ms = 25 KB of BDP plus 0.75 KB seen: IW16 (24 KB) inside, IW32 (48 KB) beyond
    assert not path.beyond_fit(16) and path.beyond_fit(32)


def twin_result(campaign_id: int = 7) -> TwinResult:
    """A whole result as ``run_twin`` builds it (:func:`compare`), from hand-made measured rows
    (arms 3, 10, 16) and twin rows (3, 10, 16, 32): IW16 held out, IW32 a what-if."""
    latency = {3: 600, 10: 400, 16: 350, 32: 330}
    measured = [_row(iw, round_, latency[iw] + round_ % 5) for round_ in range(30) for iw in (3, 10, 16)]
    twin = [
        ("tw0.r1", *row[1:])
        for row in (_row(iw, round_, latency[iw] + 3 + round_ % 7) for round_ in range(30) for iw in (3, 10, 16, 32))
    ]
    path = fit_path(measured, 3, 10)
    assert isinstance(path, TwinPath)
    return compare(TwinResult(campaign_id, 3, 10, ["32", "16"], "16", twin_campaign_id=9), [path], [measured], [twin])


def test_estimates_overlap_and_the_report_marks_every_prediction() -> None:
    rows = [_row(iw, round_, {3: 600, 10: 400, 16: 350}[iw] + round_ % 5) for round_ in range(30) for iw in (3, 10, 16)]
    fit = path_estimate(rows, 3, 10)
    assert fit.n_pairs == 30 and fit.ms == pytest.approx(200.0) and fit.ci_ms is not None
    small = path_estimate(rows[:30], 3, 10)
    assert (small.n_pairs, small.ms) == (10, None)  # n too small
    assert overlaps((1.0, 2.0), (2.0, 3.0)) and not overlaps((1.0, 2.0), (2.5, 3.0)) and overlaps(None, (1.0, 2.0)) is None
    result = twin_result()
    (path,) = result.paths
    assert path["fit"]["measured"]["ms"] == pytest.approx(200.0) and path["fit"]["twin"]["prediction"] is True
    assert path["fit"]["overlap"] is True and path["held_out"]["overlap"] is True
    assert path["predicted"]["32"]["ms"] == pytest.approx(270.0, abs=2.0) and path["predicted"]["32"]["prediction"] is True
    (bucket,) = result.buckets
    assert bucket["bucket"] == "<=100 ms" and bucket["fit"]["twin"]["prediction"] is True
    report = twin_markdown(result)
    assert "IW32 (prediction)" in report and "IW16 (prediction)" in report
    assert "Fit: intervals overlap on 1 of 1 paths" in report and "Held out: intervals overlap on 1 of 1 paths" in report


def test_the_collector_takes_the_result_and_refuses_it_without_its_prediction_marks() -> None:
    """The lab's result passes the collector's check (``TwinResultIn``, the API's and
    ``store_result``'s); the same result with one twin number unmarked does not."""
    document = json.loads(json.dumps(twin_result().to_dict()))
    checked = TwinResultIn.model_validate(document)
    assert (checked.fit_judged, checked.fit_overlapping) == (1, 1)
    del document["buckets"][0]["predicted"]["32"]["prediction"]
    with pytest.raises(ValidationError, match="prediction"):
        TwinResultIn.model_validate(document)


def test_a_bucket_weights_the_twins_as_its_measured_paths_are_weighted() -> None:
    near, far = Estimate(300, 20.0, (19.0, 21.0), None), Estimate(40, 40.0, (36.0, 44.0), None)
    # the twin of the near path ran 300 rounds, the far one 40; measured: 452 and 48 pairs
    combined = stratified([near, far], [452.0, 48.0])
    assert combined.ms == pytest.approx((452 * 20.0 + 48 * 40.0) / 500)
    assert combined.ci_ms is not None and combined.ci_ms[0] < combined.ms < combined.ci_ms[1]
    assert stratified([Estimate(10, None, None, None)], [5.0]).ms is None  # no twin estimate: none


def test_paced_and_learned_arms_are_predicted_by_label() -> None:
    """``--what-if 32,32p,learned``: each arm's twin trials by its label, reported and checked as one."""
    latency = {"3": 600, "10": 400, "32": 330, "32p": 340, "learned": 390}
    measured = [_row(arm, round_, latency[arm] + round_ % 5) for round_ in range(30) for arm in ("3", "10")]
    twin = [
        ("tw0.r1", *row[1:]) for row in (_row(arm, round_, latency[arm] + round_ % 7) for round_ in range(30) for arm in latency)
    ]
    path = fit_path(measured, 3, 10)
    assert path is not None
    result = compare(TwinResult(7, 3, 10, ["32", "32p", "learned"], None), [path], [measured], [twin])
    (reported,) = result.paths
    assert set(reported["predicted"]) == {"32", "32p", "learned"}
    assert reported["predicted"]["32p"]["ms"] == pytest.approx(260.0, abs=3.0)
    assert reported["predicted"]["learned"]["ms"] == pytest.approx(210.0, abs=3.0)
    assert reported["predicted"]["32p"]["beyond_fit"] == path.beyond_fit(32)  # a paced arm's IW counts whole
    report = twin_markdown(result)
    assert "IW32p (prediction)" in report and "learned (prediction)" in report
    checked = TwinResultIn.model_validate(json.loads(json.dumps(result.to_dict())))
    assert checked.what_if == ["32", "32p", "learned"]


def test_arm_labels_are_checked_and_stored_integers_read_as_plain_labels() -> None:
    document = json.loads(json.dumps(twin_result().to_dict()))
    older = {**document, "what_if": [32, 16], "compare_arm": 16}  # a result stored before labels
    checked = TwinResultIn.model_validate(older)
    assert (checked.what_if, checked.compare_arm) == (["32", "16"], "16")
    for bad, reason in (({"what_if": ["32x", "16"]}, "should match pattern"), ({"compare_arm": "10"}, "not among what_if")):
        with pytest.raises(ValidationError, match=reason):
            TwinResultIn.model_validate({**document, **bad})


def test_the_command_takes_arms_as_campaigns_name_them() -> None:
    assert _arm_labels("16, 32p,LEARNED") == ("16", "32p", "learned")
    for bad in ("16,fast", ""):
        with pytest.raises(click.BadParameter):
            _arm_labels(bad)
