"""Analysis functions against hand-computed values on the fixed data set (real PostgreSQL).

See ``datasets.insert_fixed`` for the data.  Means/std are exact (from sums); medians and
percentiles come from 2 %-wide histogram bins, so they are checked to within 1 %.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import json
import math
import pathlib
import random
import statistics
import types
import uuid

import numpy as np
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from iwscope.analysis import (
    Filters,
    compare_by,
    cost,
    filter_options,
    fleet,
    headline,
    iter_trials_csv,
    latency_cdf,
    latency_vs_iw,
    loss_summary,
    pathcopy,
    percentile_table,
    reads,
    rebuild_rollups,
    region_summary,
    trials_page,
)
from iwscope.analysis import buckets as bk
from iwscope.analysis.paired import paired_interval
from iwscope.analysis.raw import FULL_CSV, PAGE_CSV
from iwscope.analysis.stats import MIN_CLUSTERS
from iwscope.metrics import ANALYSIS_PATH_READS
from iwscope.trials.models import Trial

from .datasets import (
    DAY,
    Fixed,
    add_path,
    add_probe,
    add_slow_start_pairs,
    add_trial,
    insert_cost_phase,
    insert_fixed,
    new_campaign_id,
)

REL = 0.01


@pytest.fixture
def fixed(db_session: Session) -> Fixed:
    data = insert_fixed(db_session)
    rebuild_rollups(db_session)
    return data


def by_bucket(results: list) -> dict[str, object]:
    return {result.bucket: result for result in results}


def test_compare_by_rtt(db_session: Session, fixed: Fixed) -> None:
    results = compare_by(db_session, Filters(campaign_ids=(fixed.campaign_id,)), "rtt")
    # south-america has no path estimate: only two RTT buckets
    assert [(r.bucket, r.order) for r in results] == [("<=50 ms", 1), ("<=500 ms", 4)]
    europe, africa = results
    assert (europe.lower, europe.upper) == (20, 50)
    assert europe.baseline.n == 2 and europe.baseline.mean_ms == pytest.approx(110.0)
    assert europe.baseline.median_ms == pytest.approx(100.0, rel=REL)  # nearest rank of {100, 120}
    assert europe.baseline.std_ms == pytest.approx(statistics.stdev([100, 120]))
    # the bucket with one trial: mean = median = the trial, no std, no interval
    assert europe.treatment.n == 1 and europe.treatment.mean_ms == pytest.approx(80.0)
    assert europe.treatment.median_ms == pytest.approx(80.0, rel=REL)
    assert europe.treatment.std_ms is None
    # one (path, size) cell with 2 baseline and 1 treatment trial: 1 pair -> "n too small", no number
    assert (europe.n_pairs, europe.n_paths, europe.too_small) == (1, 1, True)
    assert europe.abs_ms is None and europe.pct is None and europe.abs_ci_low is None and europe.pct_ci_high is None
    assert europe.note is not None and "MIN_PAIRS" in europe.note

    assert africa.baseline.n == 3 and africa.baseline.mean_ms == pytest.approx(1000.0)
    assert africa.baseline.std_ms == pytest.approx(100.0)
    assert africa.treatment.mean_ms == pytest.approx(700.0)
    assert (africa.n_pairs, africa.n_paths, africa.too_small, africa.abs_ms) == (3, 1, True, None)
    json.dumps([dataclasses.asdict(r) for r in results])  # JSON-serialisable


def test_compare_by_bandwidth_bdp_loss(db_session: Session, fixed: Fixed) -> None:
    filters = Filters(campaign_ids=(fixed.campaign_id,))
    bandwidth = by_bucket(compare_by(db_session, filters, "bandwidth"))
    assert set(bandwidth) == {"<=1Mbit/s", "<=10Mbit/s"}
    assert bandwidth["<=1Mbit/s"].n_pairs == 3 and bandwidth["<=1Mbit/s"].abs_ms is None
    # both paths have BDP 37500 B -> one bucket (10000, 50000] with all five trials per arm
    bdp = compare_by(db_session, filters, "bdp")
    assert [(r.bucket, r.baseline.n, r.treatment.n) for r in bdp] == [("<=50000 B", 5, 4)]
    assert bdp[0].baseline.mean_ms == pytest.approx((900 + 1000 + 1100 + 100 + 120) / 5)
    assert bdp[0].treatment.mean_ms == pytest.approx((600 + 700 + 800 + 80) / 4)
    loss = by_bucket(compare_by(db_session, filters, "loss"))
    assert set(loss) == {"0%", "<=3%"}
    assert loss["0%"].n_pairs == 1 and loss["0%"].too_small


def test_compare_by_region_with_an_arm_without_data(db_session: Session, fixed: Fixed) -> None:
    regions = by_bucket(compare_by(db_session, Filters(campaign_ids=(fixed.campaign_id,)), "region"))
    assert list(regions) == ["africa", "europe", "south-america"]
    south = regions["south-america"]
    assert south.baseline.n == 0
    assert south.baseline.mean_ms is None and south.baseline.median_ms is None and south.baseline.std_ms is None
    assert south.treatment.n == 1 and south.treatment.mean_ms == pytest.approx(500.0)
    assert south.abs_ms is None and south.pct is None and south.abs_ci_low is None


def test_compare_by_size_and_metric(db_session: Session, fixed: Fixed) -> None:
    base_mean = (900 + 1000 + 1100 + 100 + 120) / 5  # 644
    treat_mean = (600 + 700 + 800 + 80 + 500) / 5  # 536
    server = compare_by(db_session, Filters(campaign_ids=(fixed.campaign_id,)), "size")
    assert [(r.bucket, r.lower, r.upper) for r in server] == [("8 KiB-16 KiB", 8192, 16384)]
    assert server[0].baseline.mean_ms == pytest.approx(base_mean)
    assert server[0].treatment.mean_ms == pytest.approx(treat_mean)
    assert (server[0].n_pairs, server[0].too_small, server[0].abs_ms) == (4, True, None)
    client = compare_by(db_session, Filters(campaign_ids=(fixed.campaign_id,), metric="client"), "size")
    assert client[0].baseline.mean_ms == pytest.approx(base_mean + 10)
    # the size filter is octave-granular on roll-ups: 20-30 KiB excludes the 8-16 KiB octave
    assert compare_by(db_session, Filters(campaign_ids=(fixed.campaign_id,), size_min=20_000, size_max=30_000), "size") == []
    # other arms can be compared: IW16 vs IW10 (africa only has IW16)
    pair = compare_by(db_session, Filters(campaign_ids=(fixed.campaign_id,), baseline_iw=10, treatment_iw=16), "region")
    assert by_bucket(pair)["africa"].baseline.mean_ms == pytest.approx(700.0)
    assert by_bucket(pair)["africa"].treatment.mean_ms == pytest.approx(550.0)
    assert by_bucket(pair)["africa"].n_pairs == 1
    with pytest.raises(ValueError, match="unknown dimension"):
        compare_by(db_session, Filters(), "colour")  # type: ignore[arg-type]


def test_filters_time_region_and_empty(db_session: Session, fixed: Fixed) -> None:
    campaign = (fixed.campaign_id,)
    assert compare_by(db_session, Filters(campaign_ids=campaign, since=DAY + dt.timedelta(days=1)), "rtt") == []
    same_day = Filters(campaign_ids=campaign, since=DAY + dt.timedelta(hours=5), until=DAY)
    assert len(compare_by(db_session, same_day, "rtt")) == 2  # day granularity: the whole day is included
    only_europe = compare_by(db_session, Filters(campaign_ids=campaign, regions=("europe",)), "rtt")
    assert [r.bucket for r in only_europe] == ["<=50 ms"]
    nothing = Filters(campaign_ids=(fixed.campaign_id + 1,))
    assert compare_by(db_session, nothing, "rtt") == []
    assert percentile_table(db_session, nothing)[0].arms[0].n == 0
    assert latency_vs_iw(db_session, nothing) == []
    assert latency_cdf(db_session, nothing) == {}
    empty = headline(db_session, nothing)
    assert (empty.n_trials, empty.abs_ms, empty.pct_ci_low, empty.retrans_increase_pp) == (0, None, None, None)
    assert region_summary(db_session, nothing) == [] and loss_summary(db_session, nothing) == []


def test_percentile_table_ietf_layout(db_session: Session, fixed: Fixed) -> None:
    (table,) = percentile_table(db_session, Filters(campaign_ids=(fixed.campaign_id,)))
    assert table.group == "all"
    treatment, baseline = table.arms
    assert (treatment.iw, baseline.iw) == (10, 3)
    assert baseline.n == 5 and baseline.avg == pytest.approx(644.0)
    # nearest rank over {100, 120, 900, 1000, 1100} and {80, 500, 600, 700, 800}
    expected_base = {"p50": 900, "p75": 1000, "p90": 1100, "p99": 1100}
    expected_treat = {"p50": 600, "p75": 700, "p90": 800, "p99": 800}
    for key in expected_base:
        assert getattr(baseline, key) == pytest.approx(expected_base[key], rel=REL)
        assert getattr(treatment, key) == pytest.approx(expected_treat[key], rel=REL)
    # 4 pairs: the improvement rows say "n too small" instead of numbers
    assert (table.n_pairs, table.too_small) == (4, True)
    assert set(table.improvement.values()) == {None} and set(table.pct_improvement.values()) == {None}
    # retransmissions: IW3 1 of 5 joined trials, 2896 of 50000 bytes; IW10 2 of 5, 2896 of 50000
    assert baseline.retrans_share == pytest.approx(0.2)
    assert baseline.retrans_bytes_share == pytest.approx(2896 / 50000)
    assert treatment.retrans_share == pytest.approx(0.4)
    assert treatment.retrans_bytes_share == pytest.approx(2896 / 50000)
    assert table.retrans_increase_pp == pytest.approx(20.0)

    per_region = {t.group: t for t in percentile_table(db_session, Filters(campaign_ids=(fixed.campaign_id,)), group_by="region")}
    assert list(per_region) == ["africa", "europe", "south-america"]
    assert per_region["africa"].arms[1].avg == pytest.approx(1000.0)
    assert per_region["africa"].arms[1].retrans_share == pytest.approx(1 / 3)
    south = per_region["south-america"]
    assert south.arms[1].n == 0 and south.arms[1].p50 is None and south.improvement["p50"] is None
    assert south.retrans_increase_pp is None


def test_latency_vs_iw_and_cdf(db_session: Session, fixed: Fixed) -> None:
    stats = latency_vs_iw(db_session, Filters(campaign_ids=(fixed.campaign_id,)))
    assert [(s.iw, s.n) for s in stats] == [(3, 5), (10, 5), (16, 1)]
    assert stats[0].mean_ms == pytest.approx(644.0)
    assert stats[0].std_ms == pytest.approx(statistics.stdev([900, 1000, 1100, 100, 120]))
    assert stats[2].mean_ms == pytest.approx(550.0) and stats[2].std_ms is None
    cdf = latency_cdf(db_session, Filters(campaign_ids=(fixed.campaign_id,)))
    assert sorted(cdf) == [3, 10, 16]
    assert [fraction for _, fraction in cdf[3]] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert cdf[3][0][0] == pytest.approx(100.0, rel=0.021)
    assert cdf[16] == [(pytest.approx(550.0, rel=0.021), 1.0)]


def test_headline_region_summary_loss(db_session: Session, fixed: Fixed) -> None:
    filters = Filters(campaign_ids=(fixed.campaign_id,))
    top = headline(db_session, filters)
    assert (top.n_trials, top.n_probes, top.n_regions) == (12, 3, 3)  # 8 africa (incl. the failed fetch and IW16) + 3 + 1
    # europe 1 pair + africa 3 pairs (south-america has no baseline): too few for a number
    assert (top.n_pairs, top.n_paths, top.too_small, top.abs_ms, top.pct_ci_low) == (4, 2, True, None, None)
    assert top.retrans_increase_pp == pytest.approx(20.0)

    regions = {r.region: r for r in region_summary(db_session, filters)}
    assert regions["africa"].n == 6 and (regions["africa"].n_baseline, regions["africa"].n_treatment) == (3, 3)
    assert regions["africa"].baseline_mean_ms == pytest.approx(1000.0)
    assert regions["africa"].too_small and regions["africa"].abs_ms is None and regions["africa"].n_pairs == 3
    assert regions["south-america"].baseline_mean_ms is None and regions["south-america"].pct is None

    loss = {b.bucket: b for b in loss_summary(db_session, filters)}
    assert loss["<=3%"].retrans_share_baseline == pytest.approx(1 / 3)
    assert loss["<=3%"].retrans_share_treatment == pytest.approx(2 / 3)
    assert loss["<=3%"].retrans_increase_pp == pytest.approx(100 / 3)
    assert loss["0%"].retrans_increase_pp == pytest.approx(0.0)
    assert loss["0%"].comparison.n_pairs == 1 and loss["0%"].comparison.abs_ms is None


def test_cost_experiment_trials_stay_out_of_the_benefit_figures_unless_asked(db_session: Session, fixed: Fixed) -> None:
    """A competing-flow phase (Poisson arrivals + a bulk flow: a cost experiment) on its own
    bottleneck region: its short flows under load enter no benefit figure -- not the "all" table,
    not the regions, not Figure 2 -- unless ``include_cost``; the cost analysis still reads them."""
    phase = insert_cost_phase(db_session, fixed.origin_id)
    rebuild_rollups(db_session)
    both = (fixed.campaign_id, phase.campaign_id)
    out, included = Filters(campaign_ids=both), Filters(campaign_ids=both, include_cost=True)
    assert Filters.from_query(included.to_query()) == included and "cost" not in out.to_query()

    assert {r.region for r in region_summary(db_session, out)} == {"africa", "europe", "south-america"}
    assert phase.region in {r.region for r in region_summary(db_session, included)}
    assert phase.region not in {r.bucket for r in compare_by(db_session, out, "region")}
    (table,) = percentile_table(db_session, out)  # the "all" table
    (with_cost,) = percentile_table(db_session, included)
    assert {arm.iw: arm.n for arm in table.arms} == {3: 5, 10: 5}
    assert {arm.iw: arm.n for arm in with_cost.arms} == {3: 13, 10: 13}
    assert with_cost.arms[0].p99 is not None and with_cost.arms[0].p99 > 2900 > (table.arms[0].p99 or 0)
    assert [(s.iw, s.n) for s in latency_vs_iw(db_session, out)] == [(3, 5), (10, 5), (16, 1)]
    assert [(s.iw, s.n) for s in latency_vs_iw(db_session, included)] == [(3, 13), (10, 13), (16, 1)]
    assert max(latency_cdf(db_session, out)[3])[0] < 2000 < max(latency_cdf(db_session, included)[3])[0]
    assert headline(db_session, out).n_trials == 12 and headline(db_session, included).n_trials == 12 + phase.n_trials
    # trials per arm and bucket: the phase's 15 KB and 50 KB flows (4 + 4 per arm) on its 1 %-loss path
    assert {c.bucket: (c.baseline.n, c.treatment.n) for c in compare_by(db_session, out, "size")} == {"8 KiB-16 KiB": (5, 5)}
    assert {c.bucket: (c.baseline.n, c.treatment.n) for c in compare_by(db_session, included, "size")} == {
        "8 KiB-16 KiB": (5 + 4, 5 + 4),
        "32 KiB-64 KiB": (4, 4),
    }
    loss = {b.bucket: (b.comparison.baseline.n, b.comparison.treatment.n) for b in loss_summary(db_session, out)}
    assert loss == {"0%": (2, 1), "<=3%": (3, 3)}
    assert {b.bucket: (b.comparison.baseline.n, b.comparison.treatment.n) for b in loss_summary(db_session, included)} == {
        **loss,
        "<=1%": (8, 8),
    }

    # Named alone, the phase is still left out (the checkbox decides): nothing, not another campaign.
    alone = Filters(campaign_ids=(phase.campaign_id,))
    assert region_summary(db_session, alone) == [] and latency_vs_iw(db_session, alone) == []
    assert headline(db_session, alone).n_trials == 0
    assert headline(db_session, dataclasses.replace(alone, include_cost=True)).n_trials == phase.n_trials
    # No campaign chosen: every other campaign stays, the phase's region does not.
    assert phase.region not in {r.region for r in region_summary(db_session, Filters())}
    assert {"africa", phase.region} <= {r.region for r in region_summary(db_session, Filters(include_cost=True))}
    # The Cost page's reader is not filtered.
    assert [c.campaign_id for c in cost(db_session, alone).campaigns] == [phase.campaign_id]


def test_cost_regions_stay_out_of_the_tables_read_from_the_analysis_copy(
    db_session: Session, fixed: Fixed, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The analysis copy's path frames name every region it knows, the cost phase's bottleneck
    too: the per-region tables list only regions with trials under the filters."""
    phase = insert_cost_phase(db_session, fixed.origin_id)
    rebuild_rollups(db_session)
    directory = tmp_path / "copy"
    assert pathcopy.update(db_session, directory).action == "base"
    monkeypatch.setattr(reads, "get_settings", lambda: types.SimpleNamespace(analysis_copy_dir=directory))
    copy_reads = ANALYSIS_PATH_READS.labels("copy")._value.get()
    both = Filters(campaign_ids=(fixed.campaign_id, phase.campaign_id))
    assert [t.group for t in percentile_table(db_session, both, "region")] == ["africa", "europe", "south-america"]
    assert phase.region in {t.group for t in percentile_table(db_session, dataclasses.replace(both, include_cost=True), "region")}
    assert ANALYSIS_PATH_READS.labels("copy")._value.get() > copy_reads  # the copy answered


def test_percentile_tables_from_the_analysis_copy_equal_postgresqls(
    db_session: Session, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the copy, the per-path histograms of the intervals are read in another thread while
    the table is computed: the tables (numbers, intervals, subsets past the detail limit) are
    the ones PostgreSQL's reads give."""
    from iwscope.analysis import queries

    rng = random.Random(8)
    campaign_id = new_campaign_id()
    origin = uuid.uuid5(uuid.NAMESPACE_URL, "iwscope-test-copy-percentiles-origin")
    for index in range(18):
        region = ("africa", "europe", "asia")[index % 3]
        probe = add_probe(db_session, region, probe_id=uuid.uuid5(uuid.NAMESPACE_URL, f"iwscope-test-copy-percentiles-{index}"))
        rtt = rng.uniform(40, 400)
        add_path(db_session, probe, origin, rtt, 5_000_000, 0.0)
        add_slow_start_pairs(db_session, rng, campaign_id=campaign_id, probe_id=probe, origin_id=origin, rtt_ms=rtt, pairs=8)
    db_session.flush()
    rebuild_rollups(db_session)
    directory = tmp_path / "copy"
    assert pathcopy.update(db_session, directory).action == "base"
    filters = Filters(campaign_ids=(campaign_id,))
    monkeypatch.setattr(queries, "PERCENTILE_MIN_DETAIL_PATHS", 4)
    for detail_paths in (200, 4):  # every path, then a subset of each region's
        monkeypatch.setattr(queries, "PERCENTILE_DETAIL_PATHS", detail_paths)
        monkeypatch.setattr(reads, "get_settings", lambda: types.SimpleNamespace(analysis_copy_dir=None))
        expected = percentile_table(db_session, filters, "region"), percentile_table(db_session, filters)
        monkeypatch.setattr(reads, "get_settings", lambda: types.SimpleNamespace(analysis_copy_dir=directory))
        copy_reads = ANALYSIS_PATH_READS.labels("copy")._value.get()
        got = percentile_table(db_session, filters, "region"), percentile_table(db_session, filters)
        assert ANALYSIS_PATH_READS.labels("copy")._value.get() >= copy_reads + 4  # paths and detail, twice
        assert [t.group for t in got[0]] == ["africa", "asia", "europe"]
        assert all(not table.too_small and table.improvement_ci["p50"] != [None, None] for table in got[0])
        for copied, direct in zip((*got[0], *got[1]), (*expected[0], *expected[1]), strict=True):
            assert copied.improvement == pytest.approx(direct.improvement)
            for key, interval in direct.improvement_ci.items():
                assert copied.improvement_ci[key] == pytest.approx(interval), (detail_paths, copied.group, key)
            assert copied.arms == direct.arms


def test_fleet_and_filter_options(db_session: Session, fixed: Fixed) -> None:
    rows = {row.probe_id: row for row in fleet(db_session, now=DAY + dt.timedelta(days=2))}
    africa = rows[str(fixed.africa)]
    assert africa.region == "africa" and africa.country == "UG" and africa.spool_backlog == 3
    assert africa.trials_total == 8
    assert africa.trials_per_day == pytest.approx(8 / 7)
    assert africa.error_share == pytest.approx(1 / 8)
    assert rows[str(fixed.europe)].error_share == 0.0 and rows[str(fixed.europe)].spool_backlog is None
    assert fleet(db_session, now=DAY + dt.timedelta(days=30))[0].trials_per_day == 0.0
    # trials dated after 'today' (a probe's clock ahead) are not this week's
    assert {row.trials_per_day for row in fleet(db_session, now=DAY - dt.timedelta(days=1))} == {0.0}
    options = filter_options(db_session)
    assert (fixed.campaign_id, f"fixed-{fixed.campaign_id}") in options.campaigns
    assert {"africa", "europe", "south-america"} <= set(options.regions)
    assert {3, 10, 16} <= set(options.arms)
    assert options.size_min is not None and options.size_min <= 9000 <= options.size_max


def test_raw_path_page_and_csv(db_session: Session, fixed: Fixed) -> None:
    filters = Filters(campaign_ids=(fixed.campaign_id,), regions=("africa",))
    rows, total = trials_page(db_session, filters, limit=3, offset=0)
    assert total == 8 and len(rows) == 3
    assert {row["region"] for row in rows} == {"africa"}
    rest, _ = trials_page(db_session, filters, limit=100, offset=3)
    assert len(rest) == 5
    assert {row["trial_id"] for row in rows + rest} <= set(fixed.trial_ids)
    exact = trials_page(db_session, Filters(campaign_ids=(fixed.campaign_id,), size_min=9001), 10)
    assert exact == ([], 0)  # exact on the raw path
    csv_text = "".join(iter_trials_csv(db_session, filters))
    lines = csv_text.strip().split("\n")
    assert lines[0].startswith("trial_id,started_at,campaign_id,probe_id,region")
    assert len(lines) == 1 + 8
    assert sum(",timeout," in line for line in lines) == 1
    assert "".join(iter_trials_csv(db_session, Filters(campaign_ids=(fixed.campaign_id + 1,)))).count("\n") == 1


def test_csv_window_is_inclusive_in_both_layouts(db_session: Session, fixed: Fixed) -> None:
    """One rule for both raw-trials CSVs: a trial started exactly at ``since`` or ``until`` is in."""
    at = Filters(campaign_ids=(fixed.campaign_id,), since=DAY, until=DAY)  # every trial started at DAY
    before = dataclasses.replace(at, since=None, until=DAY - dt.timedelta(microseconds=1))
    for layout in (PAGE_CSV, FULL_CSV):
        rows = list(csv.DictReader(io.StringIO("".join(iter_trials_csv(db_session, at, layout=layout)))))
        assert {uuid.UUID(row["trial_id"]) for row in rows} == set(fixed.trial_ids), layout
        assert "".join(iter_trials_csv(db_session, before, layout=layout)).count("\n") == 1  # header only
    assert {row["trial_id"] for row in trials_page(db_session, at, limit=100)[0]} == set(fixed.trial_ids)


def test_full_csv_layout(db_session: Session, fixed: Fixed) -> None:
    """``/api/v1/trials.csv``'s layout: every column of ``trials``, wire timestamps, JSON as text;
    ``probe_id`` narrows it to one probe."""
    text_csv = "".join(
        iter_trials_csv(db_session, Filters(campaign_ids=(fixed.campaign_id,)), layout=FULL_CSV, probe_id=fixed.europe)
    )
    rows = list(csv.DictReader(io.StringIO(text_csv)))
    assert tuple(rows[0]) == tuple(column.name for column in Trial.__table__.columns)
    assert len(rows) == 3 and {row["probe_id"] for row in rows} == {str(fixed.europe)}
    assert rows[0]["started_at"] == "2026-01-05T10:00:00.000000Z" and rows[0]["tcp_info"] == "{}"
    assert rows[0]["dns_us"] == ""  # NULL
    page = list(csv.DictReader(io.StringIO("".join(iter_trials_csv(db_session, Filters(campaign_ids=(fixed.campaign_id,)))))))
    assert dt.datetime.fromisoformat(page[0]["started_at"]) == DAY and "T" in page[0]["started_at"]


def test_cluster_bootstrap_used_with_many_paths(db_session: Session) -> None:
    """Six paths with exactly 100 ms improvement in every pair: the path-cluster interval is a point."""
    campaign_id = new_campaign_id()
    origin = uuid.uuid4()
    per_path: list[tuple[uuid.UUID, float, float]] = []
    for base_ms in (200.0, 300.0, 500.0, 800.0, 1200.0, 2000.0):
        probe = add_probe(db_session, "europe")
        add_path(db_session, probe, origin, 150, 2_000_000, 0.0)
        for jitter in (-10.0, 10.0, -5.0, 5.0):
            add_trial(db_session, campaign_id=campaign_id, probe_id=probe, origin_id=origin, iw=3, server_ms=base_ms + jitter)
            add_trial(
                db_session, campaign_id=campaign_id, probe_id=probe, origin_id=origin, iw=10, server_ms=base_ms - 100 + jitter
            )
        per_path.append((probe, 4 * 100.0, 4 * base_ms))
    db_session.flush()
    rebuild_rollups(db_session)
    assert MIN_CLUSTERS <= 6
    (result,) = compare_by(db_session, Filters(campaign_ids=(campaign_id,)), "rtt")
    assert (result.n_pairs, result.n_paths, result.method, result.too_small) == (24, 6, "cluster", False)
    assert result.note is not None and "MIN_PATHS" in result.note  # 6 < 25 paths: said, not hidden
    assert result.abs_ms == pytest.approx(100.0)
    assert (result.abs_ci_low, result.abs_ci_high) == (pytest.approx(100.0), pytest.approx(100.0))
    per_path.sort()  # the module numbers paths in (probe_id, origin_id) order
    expected = paired_interval([4] * 6, [d for _, d, _ in per_path], [b for _, _, b in per_path])
    assert expected is not None
    assert (result.pct_ci_low, result.pct_ci_high) == (pytest.approx(expected.pct_low), pytest.approx(expected.pct_high))


def test_paired_improvement_is_within_path_and_size(db_session: Session) -> None:
    """One path, two sizes, arms unbalanced in size mix: the paired estimate compares like with like.

    9 KB: 30 trials per arm, baseline 300 +- 10 ms, treatment 200 +- 10 ms (100 ms better);
    30 KB: 30 baseline trials at 600 +- 10 ms, but only 20 treatment trials at 400 +- 10 ms (200 ms better).
    Paired: (30 x 100 + 20 x 200) / 50 = 140 ms, 100 x 7000 / (30 x 300 + 20 x 600) = 33.3 %.  The arms'
    plain means differ by 450 - 280 = 170 ms, inflated by the treatment arm's smaller share of 30 KB.
    """
    campaign_id = new_campaign_id()
    origin = uuid.uuid4()
    probe = add_probe(db_session, "europe")
    add_path(db_session, probe, origin, 150, 2_000_000, 0.0)
    for size, base_ms, treat_ms, n_treat in ((9_000, 300.0, 200.0, 30), (30_000, 600.0, 400.0, 20)):
        for i in range(30):
            jitter = 10.0 if i % 2 else -10.0
            add_trial(
                db_session, campaign_id=campaign_id, probe_id=probe, origin_id=origin, iw=3, server_ms=base_ms + jitter, size=size
            )
            if i < n_treat:
                add_trial(
                    db_session,
                    campaign_id=campaign_id,
                    probe_id=probe,
                    origin_id=origin,
                    iw=10,
                    server_ms=treat_ms + jitter,
                    size=size,
                )
    db_session.flush()
    rebuild_rollups(db_session)
    (result,) = compare_by(db_session, Filters(campaign_ids=(campaign_id,)), "rtt")
    assert result.baseline.mean_ms - result.treatment.mean_ms == pytest.approx(170.0)
    assert (result.n_pairs, result.n_paths, result.method, result.too_small) == (50, 1, "within-path", False)
    assert result.abs_ms == pytest.approx(140.0)
    assert result.pct == pytest.approx(100 * 7000 / 21000)
    assert result.note is not None and "within-path" in result.note
    assert result.abs_ci_low is not None and result.abs_ci_high is not None
    assert 130.0 < result.abs_ci_low < 140.0 < result.abs_ci_high < 150.0
    (table,) = percentile_table(db_session, Filters(campaign_ids=(campaign_id,)))
    assert (table.n_pairs, table.too_small) == (50, False)
    assert table.improvement["avg"] == pytest.approx(140.0)  # the paired estimate, as in compare_by
    assert table.improvement_ci["avg"] == [pytest.approx(result.abs_ci_low), pytest.approx(result.abs_ci_high)]
    treatment, baseline = table.arms
    for key in ("p50", "p75", "p90", "p99"):
        low, high = table.improvement_ci[key]
        value = table.improvement[key]
        assert value == pytest.approx(getattr(baseline, key) - getattr(treatment, key))
        assert low is not None and high is not None and value is not None and low <= value <= high, key
    # baseline p50 is 310 (30 of 60 at <= 310 ms: 290, 310), treatment p50 210: about 100 ms
    assert table.improvement["p50"] == pytest.approx(100.0, abs=0.03 * 310)


def test_sql_and_python_bins_agree(db_session: Session) -> None:
    values = [1, 10, 11, 137, 9000, 70_000, 1_234_567, 10**12]
    sql_bins = (
        db_session.execute(text(f"SELECT {bk.hist_bin_sql('v')} FROM unnest(CAST(:v AS bigint[])) AS v"), {"v": values})
        .scalars()
        .all()
    )
    assert sql_bins == [bk.hist_bin(v) for v in values]
    assert not math.isnan(float(np.sum(sql_bins)))


@pytest.mark.parametrize(
    ("since", "until"),
    [
        (None, None),
        ("2026-01-31", None),
        (None, "2026-02-01"),
        ("2026-01-31", "2026-02-28"),
        ("2026-02-01", "2026-02-28"),
        ("2026-02-02", "2026-02-02"),
        ("2026-01-01", "2026-03-01"),
        ("2026-03-02", None),
    ],
)
def test_time_ranges_combine_month_and_day_rows(db_session: Session, since: str | None, until: str | None) -> None:
    """Whole months come from month rows, edges from day rows: counts equal the raw trials' per UTC day."""
    campaign_id = new_campaign_id()
    probe = add_probe(db_session, "asia")
    days = ["2026-01-30", "2026-01-31", "2026-02-01", "2026-02-02", "2026-02-28", "2026-03-01", "2026-03-05"]
    for index, day in enumerate(days):
        started = dt.datetime.fromisoformat(day).replace(hour=23, minute=30, tzinfo=dt.UTC)
        for _ in range(index + 1):  # 1, 2, 3, ... trials: every day contributes a distinct count
            add_trial(
                db_session, campaign_id=campaign_id, probe_id=probe, origin_id=None, iw=3, server_ms=100, started_at=started
            )
    db_session.flush()
    rebuild_rollups(db_session)

    def as_time(value):
        return None if value is None else dt.datetime.fromisoformat(value).replace(hour=12, tzinfo=dt.UTC)

    filters = Filters(campaign_ids=(campaign_id,), since=as_time(since), until=as_time(until))
    expected = sum(
        index + 1 for index, day in enumerate(days) if (since is None or day >= since) and (until is None or day <= until)
    )
    assert headline(db_session, filters).n_trials == expected


def test_paired_cells_keep_empty_objects_on_their_own_path(db_session: Session) -> None:
    """Size octave -1 (0-byte objects) must not fold a path's cells into another path's: path A
    has 20 pairs at 9 kB (200 ms vs 100 ms), path B 30 pairs of empty objects (no difference)."""
    campaign_id = new_campaign_id()
    origin = uuid.uuid4()
    probes = [add_probe(db_session, "europe"), add_probe(db_session, "europe")]
    for probe in probes:
        add_path(db_session, probe, origin, 100, 2_000_000, 0.0)
    for probe, size, count, base_ms, treat_ms in ((probes[0], 9000, 20, 200.0, 100.0), (probes[1], 0, 30, 100.0, 100.0)):
        for i in range(count):
            jitter = 1.0 if i % 2 else -1.0
            add_trial(
                db_session, campaign_id=campaign_id, probe_id=probe, origin_id=origin, iw=3, server_ms=base_ms + jitter, size=size
            )
            add_trial(
                db_session,
                campaign_id=campaign_id,
                probe_id=probe,
                origin_id=origin,
                iw=10,
                server_ms=treat_ms + jitter,
                size=size,
            )
    db_session.flush()
    rebuild_rollups(db_session)
    (result,) = compare_by(db_session, Filters(campaign_ids=(campaign_id,)), "region")
    assert (result.n_paths, result.n_pairs) == (2, 50)
    assert result.abs_ms == pytest.approx(20 * 100.0 / 50)
    by_size = {row.bucket: row for row in compare_by(db_session, Filters(campaign_ids=(campaign_id,)), "size")}
    assert {bucket: (row.n_paths, row.n_pairs) for bucket, row in by_size.items()} == {
        "0 B-1 B": (1, 30),
        "8 KiB-16 KiB": (1, 20),
    }


def _count_detail_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record how many paths each per-path histogram read asks for (``path_histograms`` begins
    its read there too)."""
    from iwscope.analysis import reads

    read: list[int] = []
    original = reads.Data.start_path_histograms

    def spy(self: reads.Data, path_codes: np.ndarray) -> object:
        read.append(len(path_codes))
        return original(self, path_codes)

    monkeypatch.setattr(reads.Data, "start_path_histograms", spy)
    return read


def test_percentile_intervals_subsample_paths_past_the_detail_limit(db_session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past PERCENTILE_DETAIL_PATHS paths, the percentile intervals read the histograms of a fixed
    subset of that many paths only, and are put around the all-paths difference, narrowed by
    sqrt(subset / paths)."""
    from iwscope.analysis import queries

    rng = random.Random(5)
    campaign_id = new_campaign_id()
    # fixed ids: the subset is chosen by the paths' UUIDs, so random ones made the width check
    # below depend on which 6 paths a run happened to pick
    origin = uuid.uuid5(uuid.NAMESPACE_URL, "iwscope-test-subsample-origin")
    for index in range(24):
        probe = add_probe(db_session, "europe", probe_id=uuid.uuid5(uuid.NAMESPACE_URL, f"iwscope-test-subsample-{index}"))
        rtt = rng.uniform(40, 400)
        add_path(db_session, probe, origin, rtt, 5_000_000, 0.0)
        add_slow_start_pairs(db_session, rng, campaign_id=campaign_id, probe_id=probe, origin_id=origin, rtt_ms=rtt, pairs=12)
    db_session.flush()
    rebuild_rollups(db_session)
    filters = Filters(campaign_ids=(campaign_id,))
    (everything,) = percentile_table(db_session, filters)
    read = _count_detail_reads(monkeypatch)
    monkeypatch.setattr(queries, "PERCENTILE_DETAIL_PATHS", 6)
    (subsampled,) = percentile_table(db_session, filters)
    assert read == [6]
    assert subsampled.improvement == everything.improvement  # the numbers come from all paths
    for key in ("p50", "p75", "p90"):
        value = subsampled.improvement[key]
        low, high = subsampled.improvement_ci[key]
        assert value is not None and low is not None and high is not None and low <= value <= high, key
        full_low, full_high = everything.improvement_ci[key]
        assert full_low is not None and full_high is not None
        # same order of width as the interval from all 24 paths (both estimate the same spread)
        assert 0.25 < (high - low) / (full_high - full_low) < 4.0, key


def test_percentile_detail_reads_share_one_budget_over_the_groups(db_session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-path histograms come from the paths' raw trials, so one call reads at most
    PERCENTILE_DETAIL_BUDGET paths over all its groups (never fewer than
    PERCENTILE_MIN_DETAIL_PATHS a group), in one read; every group keeps an interval."""
    from iwscope.analysis import queries

    rng = random.Random(9)
    campaign_id = new_campaign_id()
    origin = uuid.uuid4()
    regions = ("europe", "asia", "africa")
    for region in regions:
        for _ in range(12):
            probe = add_probe(db_session, region)
            rtt = rng.uniform(40, 400)
            add_path(db_session, probe, origin, rtt, 5_000_000, 0.0)
            for _ in range(8):
                add_trial(
                    db_session,
                    campaign_id=campaign_id,
                    probe_id=probe,
                    origin_id=origin,
                    iw=3,
                    server_ms=3 * rtt * rng.uniform(0.9, 1.3),
                )
                add_trial(
                    db_session,
                    campaign_id=campaign_id,
                    probe_id=probe,
                    origin_id=origin,
                    iw=10,
                    server_ms=2 * rtt * rng.uniform(0.9, 1.3),
                )
    db_session.flush()
    rebuild_rollups(db_session)
    read = _count_detail_reads(monkeypatch)
    monkeypatch.setattr(queries, "PERCENTILE_DETAIL_BUDGET", 15)
    monkeypatch.setattr(queries, "PERCENTILE_MIN_DETAIL_PATHS", 4)
    tables = percentile_table(db_session, Filters(campaign_ids=(campaign_id,)), group_by="region")
    assert read == [15]  # 3 groups x 5 paths, not 3 x 12
    assert {table.group for table in tables} >= set(regions)
    for table in tables:
        if table.group in regions:
            low, high = table.improvement_ci["p50"]
            assert low is not None and high is not None and low <= table.improvement["p50"] <= high, table.group
    read.clear()
    monkeypatch.setattr(queries, "PERCENTILE_MIN_DETAIL_PATHS", 8)  # the floor wins over the share
    percentile_table(db_session, Filters(campaign_ids=(campaign_id,)), group_by="region")
    assert read == [24]
