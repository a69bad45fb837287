"""The Cost page's figures and tables from a hand-made CostReport (no database, no browser)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import plotly.graph_objects as go
import pytest

from iwscope.analysis import CostCampaign, CostFlows, CostInteractive, CostInterference, CostReport
from iwscope_dashboard import pagekit


@pytest.fixture()
def cost(pages: dict[str, ModuleType]) -> ModuleType:
    return pages["cost"]


def campaign(
    campaign_id: int,
    arms: list[str],
    shares: list[float] | None = None,
    *,
    region: str = "lab-a",
    background: bool = True,
    interactive: bool = True,
    pages: int | None = None,
    rate: float = 8.0,
) -> CostCampaign:
    mix = (
        " + ".join(arms) if not shares else " + ".join(f"{a} {s * 100:.0f}%" for a, s in zip(arms, shares, strict=False) if s > 0)
    )
    return CostCampaign(
        campaign_id=campaign_id,
        name=f"phase {campaign_id}",
        region=region,
        arms=arms,
        shares=shares,
        arrival_rate_per_s=rate,
        background_bytes=50_000_000 if background else None,
        interactive=interactive,
        page_connections=pages,
        mix=mix,
    )


def flows(
    campaign_id: int,
    role: str,
    arm: str,
    *,
    n: int = 40,
    p50: float | None = 120.0,
    mean: float | None = 130.0,
    share: float | None = None,
    throughput: float | None = None,
    retrans: float | None = 0.01,
    region: str = "lab-a",
) -> CostFlows:
    return CostFlows(
        campaign_id=campaign_id,
        region=region,
        role=role,
        arm=arm,
        iw=int(arm.rstrip("p")) if arm[0].isdigit() else 10,
        share=share,
        n=n,
        errors=0,
        fct_p50_ms=p50,
        fct_p50_ci_ms=None if p50 is None else (p50 - 10.0, p50 + 12.0),
        fct_mean_ms=mean,
        fct_mean_ci_ms=None if mean is None else (mean - 8.0, mean + 8.0),
        fct_p90_ms=None if p50 is None else p50 * 2,
        throughput_bps=throughput,
        throughput_ci_bps=None if throughput is None else (throughput * 0.9, throughput * 1.1),
        retrans_flow_share=0.1,
        retrans_flow_share_ci=(0.05, 0.2),
        bytes_retrans_share=retrans,
        bytes_retrans_share_ci=None if retrans is None else (retrans / 2, retrans * 2),
        joined_flows=n,
    )


def interactive(
    campaign_id: int, *, samples: int = 3000, p50: float | None = 4.0, p99: float | None = 38.0, region: str = "lab-a"
) -> CostInteractive:
    return CostInteractive(
        campaign_id=campaign_id,
        region=region,
        flows=1,
        sent=samples + 12,
        received=samples,
        loss_share=12 / (samples + 12),
        loss_ci=(0.001, 0.009),
        base_rtt_ms=100.0,
        samples=samples,
        delay_p50_ms=p50,
        delay_p50_ci_ms=None if p50 is None else (p50 - 0.5, p50 + 0.7),
        delay_p99_ms=p99,
        delay_p99_ci_ms=None if p99 is None else (p99 - 3.0, p99 + 5.0),
    )


def small_report() -> CostReport:
    """Two phases: #1 has numbers; #2 has too few short flows, interactive packets and no bulk throughput."""
    return CostReport(
        campaigns=[campaign(1, ["10"]), campaign(2, ["32p"])],
        flows=[
            flows(1, "short", "10"),
            flows(1, "background", "10", throughput=2.0e6, n=6),
            flows(1, "background-alone", "10", throughput=3.9e6, n=6),
            flows(2, "short", "32p", n=4, p50=None, mean=None),
            flows(2, "background", "10", throughput=None, n=1, retrans=None),
            flows(2, "background-alone", "10", throughput=3.8e6, n=6),
        ],
        interactive=[interactive(1), interactive(2, samples=30, p50=None, p99=None)],
        interference=[
            CostInterference(
                region="lab-a",
                baseline="10",
                treatment="32p",
                treatment_share=0.5,
                mixed_campaign_id=3,
                all_baseline_campaign_id=1,
                all_treatment_campaign_id=2,
                ab_ms=4.5,
                ab_ci_ms=(-3.0, 12.5),
                total_ms=21.0,
                total_ci_ms=(9.25, 33.0),
                bias_ms=-16.5,
                bias_ci_ms=(-30.0, -2.5),
                n=(30, 31, 40, 40),
            )
        ],
    )


def sweep_report() -> CostReport:
    """A share sweep on one bottleneck: pure 10, 75/25, 50/50, 25/75 (10 vs 32p), pure 32p.

    The all-baseline phase names both arms with shares 100/0 (so its flows carry share 1.0 of
    the *baseline*); the all-treatment phase runs its one arm (share ``None``)."""
    phases = [
        campaign(11, ["10", "32p"], [1.0, 0.0]),
        campaign(12, ["10", "32p"], [0.75, 0.25]),
        campaign(13, ["10", "32p"], [0.5, 0.5]),
        campaign(14, ["10", "32p"], [0.25, 0.75]),
        campaign(15, ["32p"]),
    ]
    short = [
        flows(11, "short", "10", share=1.0, mean=100.0),
        flows(12, "short", "10", share=0.75, mean=104.0),
        flows(12, "short", "32p", share=0.25, mean=90.0),
        flows(13, "short", "10", share=0.5, mean=110.0),
        flows(13, "short", "32p", share=0.5, mean=92.0),
        flows(14, "short", "10", share=0.25, mean=118.0),
        flows(14, "short", "32p", share=0.75, mean=95.0),
        flows(15, "short", "32p", mean=99.0),
    ]
    return CostReport(campaigns=phases, flows=short)


def y_axes(fig: go.Figure) -> list[Any]:
    return [fig.layout[key] for key in fig.layout if key.startswith("yaxis")]


def bars(fig: go.Figure) -> list[go.Bar]:
    return [trace for trace in fig.data if trace.type == "bar"]


def test_a_missing_number_says_n_too_small_with_its_n(cost: ModuleType) -> None:
    report = small_report()
    rows = {row["phase"].value: row for row in cost.cost_rows(report)}
    keys = [key for key, _ in cost.cost_columns(report)]
    assert {"short:10", "short:32p", "bulk", "delay_p50", "delay_p99", "loss"} <= set(keys)

    good, small = rows["#1"], rows["#2"]
    assert good["short:10"].text == "120 [110, 132], n=40 flows"
    assert good["delay_p50"].text == "4.0 [3.5, 4.7], n=3,000 packets"
    assert good["delay_p99"].text == "38.0 [35.0, 43.0], n=3,000 packets"
    assert good["loss"].value == "0.40" and "[0.10, 0.90]" in good["loss"].note and "n=3,012" in good["loss"].note
    assert good["bulk"].value == "2.00 / 3.90"
    assert good["bulk"].note == "[1.80, 2.20], n=6 flows / [3.51, 4.29], n=6 flows"
    assert good["short:32p"].value == "—"  # the arm did not run in phase 1: no number, and not "0"

    assert small["short:32p"].value == "n too small" and small["short:32p"].too_small
    assert small["short:32p"].note == "n=4 flows"
    assert small["delay_p50"].text == "n too small n=30 packets"
    assert small["delay_p99"].text == "n too small n=30 packets"
    assert small["bulk"].value == "n too small / 3.80" and small["bulk"].too_small
    assert small["bulk"].note.startswith("n=1 flows")
    # No cell of the too-small phase shows a zero where the report has no number.
    assert not any(cell.value in ("0", "0.0", "0.00") for cell in small.values())

    table = cost.html_table(cost.cost_columns(report), cost.cost_rows(report), "t")
    too_small_cells = [
        td for tr in table.children[1].children for td in tr.children if getattr(td, "className", None) == "iw-too-small"
    ]
    assert len(too_small_cells) == 4
    assert all(td.children[0] == "n too small" for td in too_small_cells[:3])


def test_no_bar_is_drawn_for_a_missing_number(cost: ModuleType) -> None:
    report = small_report()
    delay = cost.delay_figure(report)
    assert {trace.name for trace in bars(delay)} == {"delay p50", "delay p99"}
    for trace in bars(delay):
        regions, phases = trace.x
        assert list(phases) == ["#1 10, 8/s"] and list(regions) == ["lab-a"], trace.x
        assert all(value is not None and value > 0 for value in trace.y)
    assert list(bars(delay)[0].y) == [4.0] and list(bars(delay)[1].y) == [38.0]
    assert list(bars(delay)[1].error_y.arrayminus) == [3.0] and list(bars(delay)[1].error_y.array) == [5.0]
    note = " ".join(annotation.text for annotation in delay.layout.annotations)
    assert "n too small" in note and "#2 32p, 8/s (n=30 packets)" in note

    bulk = cost.bulk_figure(report)
    traces = {trace.name: trace for trace in bars(bulk)}
    assert list(traces["background alone"].x) == ["#1 10, 8/s", "#2 32p, 8/s"]
    assert list(traces["background alone"].y) == pytest.approx([3.9, 3.8])
    assert list(traces["background alone"].error_y.array) == pytest.approx([0.39, 0.38])  # the CI, not a bare bar
    # phase 2's competing throughput and its retransmissions are unknown: no bar, not a zero bar
    assert list(traces["background with short flows"].x) == ["#1 10, 8/s"]
    assert list(traces["background retrans"].x) == ["#1 10, 8/s"]
    assert all(value is not None for trace in bars(bulk) for value in trace.y)


def test_y_axes_start_at_zero(cost: ModuleType) -> None:
    # Large intervals (a mean CI reaching below 0) must not pull the axis below zero.
    report = sweep_report()
    wide = CostReport(campaigns=report.campaigns, flows=[flows(11, "short", "10", mean=5.0)] + report.flows[1:])
    for fig in (cost.delay_figure(small_report()), cost.sweep_figure(wide), cost.bulk_figure(small_report())):
        axes = y_axes(fig)
        assert axes and fig.data
        for axis in axes:
            assert axis.range is not None and axis.range[0] == 0 and axis.range[1] > 0, axis


def test_share_sweep_places_phases_at_the_treatment_share(cost: ModuleType) -> None:
    report = sweep_report()
    # Pure phases of another design on the same bottleneck (no interactive flow) are no part of the sweep.
    other = [campaign(16, ["3"], interactive=False), campaign(17, ["10"], interactive=False)]
    fig = cost.sweep_figure(
        CostReport(
            campaigns=report.campaigns + other,
            flows=report.flows + [flows(16, "short", "3"), flows(17, "short", "10", mean=500.0)],
        )
    )
    lines = {trace.name: trace for trace in fig.data}
    assert set(lines) == {"IW10", "IW32p"}
    assert list(lines["IW10"].x) == [0, 25, 50, 75]
    assert list(lines["IW32p"].x) == [25, 50, 75, 100]
    assert sorted({x for trace in fig.data for x in trace.x}) == [0, 25, 50, 75, 100]
    assert list(lines["IW10"].y) == [100.0, 104.0, 110.0, 118.0]
    assert list(lines["IW32p"].y) == [90.0, 92.0, 95.0, 99.0]
    assert list(lines["IW32p"].error_y.array) == [8.0] * 4
    assert list(fig.layout.xaxis.tickvals) == [0, 25, 50, 75, 100]


def test_share_sweep_leaves_out_a_mean_that_is_too_small(cost: ModuleType) -> None:
    report = sweep_report()
    thin = CostReport(
        campaigns=report.campaigns,
        flows=[
            f if f.campaign_id != 13 else flows(13, "short", f.arm, n=3, share=f.share, p50=None, mean=None) for f in report.flows
        ],
    )
    lines = {trace.name: trace for trace in cost.sweep_figure(thin).data}
    assert list(lines["IW10"].x) == [0, 25, 75] and None not in list(lines["IW10"].y)


def test_share_sweep_keeps_loads_apart_and_puts_the_paired_design_at_half(cost: ModuleType) -> None:
    """The fairness experiment's phases: IW3, IW10 and both arms paired (half the flows each), at two loads."""
    phases, short = [], []
    for first, rate in ((21, 2.0), (24, 3.6)):
        phases += [
            campaign(first, ["3"], rate=rate, region="fairness", interactive=False),
            campaign(first + 1, ["10"], rate=rate, region="fairness", interactive=False),
            campaign(first + 2, ["3", "10"], rate=rate, region="fairness", interactive=False),
        ]
        short += [
            flows(first, "short", "3", mean=300.0 * rate),
            flows(first + 1, "short", "10", mean=200.0 * rate),
            flows(first + 2, "short", "3", mean=310.0 * rate),
            flows(first + 2, "short", "10", mean=190.0 * rate),
        ]
    lines = {trace.name: trace for trace in cost.sweep_figure(CostReport(campaigns=phases, flows=short)).data}
    assert set(lines) == {"IW3, 2/s, bulk", "IW10, 2/s, bulk", "IW3, 3.6/s, bulk", "IW10, 3.6/s, bulk"}
    assert list(lines["IW3, 2/s, bulk"].x) == [0, 50] and list(lines["IW3, 2/s, bulk"].y) == [600.0, 620.0]
    assert list(lines["IW10, 3.6/s, bulk"].x) == [50, 100]
    assert list(lines["IW10, 3.6/s, bulk"].y) == pytest.approx([190.0 * 3.6, 200.0 * 3.6])


def test_interference_rows_show_the_intervals(cost: ModuleType) -> None:
    [row] = cost.interference_rows(small_report().interference)
    assert row["arms"].value == "IW10 vs IW32p" and row["share"].value == "50 %"
    assert row["ab"].text == "+4.5 [-3.0, 12.5], n=30/31 flows"
    assert row["total"].text == "+21.0 [9.2, 33.0], n=40/40 flows"
    assert row["bias"].text == "-16.5 [-30.0, -2.5], n=30/31/40/40 flows"
    unknown = CostInterference(
        region="lab-b",
        baseline="10",
        treatment="10p",
        treatment_share=0.25,
        mixed_campaign_id=7,
        all_baseline_campaign_id=5,
        all_treatment_campaign_id=6,
        ab_ms=None,
        ab_ci_ms=None,
        total_ms=None,
        total_ci_ms=None,
        bias_ms=None,
        bias_ci_ms=None,
        n=(3, 2, 40, 40),
    )
    [row] = cost.interference_rows([unknown])
    assert row["ab"].text == "n too small n=3/2 flows"
    assert row["bias"].value == "n too small"


def test_the_callback_fills_every_section(cost: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    small, sweep_phases = small_report(), sweep_report()
    both = CostReport(
        campaigns=small.campaigns + sweep_phases.campaigns,
        flows=small.flows + sweep_phases.flows,
        interactive=small.interactive,
        interference=small.interference,
    )
    monkeypatch.setattr(pagekit, "query", lambda function, *args, **kwargs: both)  # what read() asks
    table, delay, sweep, interference, bulk, message, search = cost.update(None, None, None, None, None, None, 3, 10, "server")
    assert table.id == "cost-cost-table" and interference.id == "cost-interference-table"
    assert bars(delay) and {trace.name for trace in sweep.data} == {"IW10", "IW32p"} and bars(bulk)
    assert "7 phases on 1 bottleneck (lab-a)" in message.children
    assert search.startswith("?")

    monkeypatch.setattr(pagekit, "query", lambda function, *args, **kwargs: CostReport())
    table, *_, message, _search = cost.update(None, None, None, None, None, None, 3, 10, "server")
    assert "iwscope lab reproduce --only cost" in table.children
    assert message.children == "No cost campaigns recorded yet."


def test_the_fairness_address_links_to_cost_with_its_filters(pages: dict[str, ModuleType]) -> None:
    fairness = pages["fairness"]
    assert fairness.cost_href({}) == "/cost"
    assert (
        fairness.cost_href({"campaign": "3,4", "region": ["africa", "europe"]})
        == "/cost?campaign=3,4&region=africa&region=europe"
    )
    page = fairness.layout(campaign="3")
    link = page.children[1].children[1]
    assert link.href == "/cost?campaign=3" and link.children == "Cost page"


def test_legends_stay_clear_of_the_titles(cost: ModuleType) -> None:
    """A legend above the plot (``style_figure``'s) would sit on the subplot titles: the figures
    with subplots put theirs at the bottom of the figure; the others have nothing above the plot."""
    report = sweep_report()
    two_bottlenecks = CostReport(
        campaigns=report.campaigns
        + [campaign(41, ["10", "32p"], [0.5, 0.5], region="lab-b"), campaign(42, ["32p"], region="lab-b")],
        flows=report.flows
        + [
            flows(41, "short", "10", share=0.5, region="lab-b"),
            flows(41, "short", "32p", share=0.5, region="lab-b"),
            flows(42, "short", "32p", region="lab-b"),
        ],
    )
    for fig in (cost.bulk_figure(small_report()), cost.sweep_figure(report), cost.sweep_figure(two_bottlenecks)):
        assert fig.data and any(trace.showlegend is not False for trace in fig.data)
        legend = fig.layout.legend
        assert (legend.orientation, legend.yref, legend.y, legend.yanchor) == ("h", "container", 0, "bottom"), (
            fig.layout.title.text
        )
        # the subplot titles are annotations above the plot area, where the legend no longer is
        assert [a.text for a in fig.layout.annotations if a.yref == "paper" and a.y >= 1]
    delay = cost.delay_figure(small_report())
    assert delay.layout.legend.y >= 1  # above the plot, under the figure's title ...
    assert not [a for a in delay.layout.annotations if a.yref == "paper" and a.y >= 1]  # ... where nothing else is
    # the share sweep names its x axis once per panel, short enough for two panels side by side
    titles = [axis.title.text for axis in axes_named(cost.sweep_figure(two_bottlenecks), "xaxis")]
    assert titles == ["treatment share", "treatment share"]


def axes_named(fig: go.Figure, prefix: str) -> list[Any]:
    """The layout's axes whose key starts with ``prefix`` (``xaxis``, ``xaxis2``, ...), in order."""
    return [fig.layout[key] for key in sorted(fig.layout) if key.startswith(prefix)]
