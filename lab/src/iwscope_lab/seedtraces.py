"""Seed 002's time-sequence plots rebuilt from traced lab trials (``iwscope lab reproduce --only seed002``).

The seed ("Increasing TCP's initial congestion window") plots data transferred against time, one
point per segment, at the receiver and at the sender, ``initcwnd`` 3 vs 10, for 10 KB and 50 KB
objects over paths of 7, 33 and 255 ms RTT, and reads the time saved off them ("over 50 ms saved
(at the receiver) on a 10 kB object" at 33 ms, "almost an 80 ms difference" at 50 KB).  Here one
probe per RTT fetches both sizes at IW 3 and 10 with every round traced (``trace_share`` 1), at
both ends of the connection; each path x size gets the receiver's and the sender's plot of one
round (its IW 3 and IW 10 trials overlaid, :func:`iwscope_dashboard.trialfigures.trial_figure`),
and the time saved *read off the plot* -- when the last data packet arrived at the receiver, IW 3
minus IW 10, in the round drawn -- is set beside what the trials measured (the paired
difference of their total latencies over every round, mean and 95 % interval): a plot that
disagreed with the measurements would not explain them.

What differs from the seed, on purpose: the links are emulated and lossless (the seed's 3G path
had "extremely high" jitter); the receiver is Linux, whose initial receive window (~64 KB) does
not cap a 50 KB first flight of IW 10 (the seed's Windows XP advertised 65 KB too); the sender's
segments are what this kernel hands the device (the lab's TUN devices have no TSO, so GSO splits
before the capture: the sender plots show MSS-sized segments, not the seed's 10 KB super-segment).
"""

from __future__ import annotations

import pathlib
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from sqlalchemy import text

from iwscope.analysis.stats import mean_interval
from iwscope_lab.campaign import CampaignPlan, LabCampaign
from iwscope_lab.hostspec import probes_per_rtt
from iwscope_lab.links import LinkSpec
from iwscope_lab.stack import Stack
from iwscope_lab.topology import Host, Topology

#: The key of this experiment in ``iwscope lab reproduce`` (``--only seed002``) and its summary.
SEED_TRACES_KEY = "seed002"
RTTS_MS = (7, 33, 255)
SIZES = (10_000, 50_000)
ARMS = (3, 10)
#: The paths' rate: the seed's "paths not saturated" (a 50 KB object is 4 ms of it).
RATE_BPS = 100e6
#: The seed averaged 10 samples per plot.
REPETITIONS = 10
QUICK_REPETITIONS = 4
#: Fewest paired rounds an interval is given from.
MIN_PAIRS = 3


@dataclass
class SeedPoint:
    """One path x size: the plotted round's time saved beside the trials' measured one."""

    rtt_ms: int
    size: int
    #: Rounds with both arms' trials (the paired differences).
    n_pairs: int
    #: Mean of (IW 3 total latency - IW 10 total latency) over the paired rounds, with its 95 % interval.
    measured_saved_ms: float | None
    measured_low_ms: float | None
    measured_high_ms: float | None
    median_iw3_ms: float | None
    median_iw10_ms: float | None
    #: The plotted round: its IW 10 trial, and the time saved read off its receiver plot (when
    #: the last data packet arrived, from each trial's SYN, IW 3 minus IW 10).
    plotted_trial: str | None
    plot_saved_ms: float | None
    #: The figures written for this point (file names in the output directory).
    figures: list[str]
    note: str = ""


def topology(run_id: str | None = None) -> Topology:
    """One origin on a fast link, one probe per RTT (``rtt_ms`` label)."""
    hosts = [Host("origin", role="origin", region="lab", link=LinkSpec.symmetric(rate_bps=1e9, rtt_ms=0))]
    hosts += probes_per_rtt(RTTS_MS, RATE_BPS, "lab-seed002")
    return Topology(run_id, hosts, scenario="reproduce:seed002")


def last_data_ms(trace: dict[str, Any]) -> float | None:
    """When the trace's last server data packet crossed its device, ms since the SYN."""
    times = [t for t, out, length in zip(trace["t_us"], trace["outgoing"], trace["length"], strict=True) if not out and length]
    return max(times) / 1000 if times else None


def _plot_saved_ms(traced: Any) -> float | None:
    """IW 3's last data packet minus IW 10's, in one traced round (receiver side)."""
    last: dict[int, float | None] = {}
    for trial in [traced.trial, *traced.twins]:
        receiver = next((trace for trace in trial.traces if trace.side == "receiver"), None)
        last[trial.arm_iw] = last_data_ms(receiver.trace) if receiver is not None else None
    first, second = last.get(ARMS[0]), last.get(ARMS[1])
    return None if first is None or second is None else first - second


def measure(session: Any, campaign_id: int, probe_id: str, rtt_ms: int, size: int, out_dir: pathlib.Path) -> SeedPoint:
    """The point of one probe (path) and size, and its two figures written to ``out_dir``."""
    from iwscope.traces.services import read_trial_traces
    from iwscope_dashboard.trialfigures import trial_figure

    rows = session.execute(
        text(
            "SELECT trial_id, round, arm_iw, total_us FROM trials WHERE campaign_id = :c AND probe_id = :p "
            "AND object_size = :s AND error_kind IS NULL"
        ),
        {"c": campaign_id, "p": probe_id, "s": size},
    ).all()
    by_round: dict[int, dict[int, Any]] = {}
    for row in rows:
        by_round.setdefault(row.round, {})[row.arm_iw] = row
    pairs = [(arms[ARMS[0]], arms[ARMS[1]]) for arms in by_round.values() if all(iw in arms for iw in ARMS)]
    saved = [(low.total_us - high.total_us) / 1000 for low, high in pairs]
    interval = mean_interval(saved) if len(saved) >= MIN_PAIRS else None
    point = SeedPoint(
        rtt_ms=rtt_ms,
        size=size,
        n_pairs=len(pairs),
        measured_saved_ms=statistics.fmean(saved) if interval else None,
        measured_low_ms=interval[0] if interval else None,
        measured_high_ms=interval[1] if interval else None,
        median_iw3_ms=statistics.median(low.total_us / 1000 for low, _ in pairs) if pairs else None,
        median_iw10_ms=statistics.median(high.total_us / 1000 for _, high in pairs) if pairs else None,
        plotted_trial=None,
        plot_saved_ms=None,
        figures=[],
        note="" if interval else f"n too small ({len(pairs)} paired rounds)",
    )
    if not pairs:
        return point
    # the round drawn: the one whose IW 10 latency is the median's (a typical round, as the seed's averages are)
    middle = statistics.median_low(high.total_us for _, high in pairs)
    _, high = next(pair for pair in pairs if pair[1].total_us == middle)
    traced = read_trial_traces(session, high.trial_id)
    if traced is None:
        return point
    point.plotted_trial = str(high.trial_id)
    point.plot_saved_ms = _plot_saved_ms(traced)
    for side, view in (("receiver", "recv"), ("sender", "xmit")):
        name = f"seed002-{size // 1000}k-{rtt_ms}ms-{view}.html"
        title = f"{size // 1000} KB at {rtt_ms} ms, IW 3 vs IW 10 ({view}: at the {side})"
        trial_figure(traced, side=side, title=title).write_html(
            out_dir / name, include_plotlyjs="directory"
        )  # one plotly.min.js beside them, offline
        point.figures.append(name)
    return point


def run_seed_traces(
    stack: Stack, out_dir: pathlib.Path, *, quick: bool, console: Console | None = None, show_progress: bool = True
) -> list[SeedPoint]:
    """Run the traced campaign in the lab; every path x size point, figures in ``out_dir``."""
    console = console or Console(stderr=True)
    plan = CampaignPlan(
        "reproduce seed 002 time-sequence plots",
        arms=ARMS,
        sizes=SIZES,
        repetitions=QUICK_REPETITIONS if quick else REPETITIONS,
        calibrate=False,
        trace_share=1.0,
    )
    with topology() as topo:
        console.print(
            f"[bold]Seed 002 time-sequence plots[/]: {len(RTTS_MS)} RTTs x {len(SIZES)} sizes x {len(ARMS)} arms, "
            f"{plan.trials_per_probe(1)} traced trials per probe"
        )
        outcome = LabCampaign(topo, stack, plan, console=console).run(show_progress=show_progress)
        probes = {host.name: int(host.labels["rtt_ms"]) for host in topo.hosts_by_role("probe")}
    out_dir.mkdir(parents=True, exist_ok=True)
    with stack.session() as session:
        return [
            measure(session, outcome.campaign_id, outcome.probe_ids[name], rtt_ms, size, out_dir)
            for name, rtt_ms in sorted(probes.items(), key=lambda item: item[1])
            for size in SIZES
        ]


def reproduce_seed_traces(stack: Stack, out_dir: pathlib.Path, *, quick: bool, show_progress: bool = True) -> dict[str, Any]:
    """The seed 002 experiment for ``iwscope lab reproduce``: JSON-ready summary."""
    points = run_seed_traces(stack, out_dir, quick=quick, show_progress=show_progress)
    return {
        "title": "Time-sequence plots, IW 3 vs IW 10 (seed 002), 100 Mbit/s",
        "rate_bps": RATE_BPS,
        "metric": "client total latency (connect to last byte); plot: last data packet at the receiver, from the SYN",
        "points": [asdict(point) for point in points],
    }


def seed_traces_markdown(summary: dict[str, Any]) -> list[str]:
    """The report's table: per path and size, time saved measured and read off the plot."""
    lines = [
        f"## {summary['title']}",
        "",
        "| RTT | size | pairs | IW 3 median | IW 10 median | saved (mean, 95 % CI) | saved on the plot | figures |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for point in summary["points"]:
        measured = (
            f"{point['measured_saved_ms']:.1f} ms [{point['measured_low_ms']:.1f}, {point['measured_high_ms']:.1f}]"
            if point["measured_saved_ms"] is not None
            else point["note"]
        )
        plotted = f"{point['plot_saved_ms']:.1f} ms" if point["plot_saved_ms"] is not None else "-"
        medians = [f"{value:.1f} ms" if value is not None else "-" for value in (point["median_iw3_ms"], point["median_iw10_ms"])]
        lines.append(
            f"| {point['rtt_ms']} ms | {point['size'] // 1000} KB | {point['n_pairs']} | {medians[0]} | {medians[1]} "
            f"| {measured} | {plotted} | {', '.join(point['figures'])} |"
        )
    return [*lines, ""]


def seed_traces_html(summary: dict[str, Any]) -> str:
    """The report's section: the table, each figure a link (the plots are files of their own)."""
    import html

    rows = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape(cell.strip())}</td>" for cell in line.strip("|").split("|")[:-1])
        + "<td>"
        + " ".join(f"<a href='{html.escape(name)}'>{html.escape(name)}</a>" for name in point["figures"])
        + "</td></tr>"
        for line, point in zip(seed_traces_markdown(summary)[4:-1], summary["points"], strict=True)
    )
    header = "".join(f"<th>{html.escape(cell.strip())}</th>" for cell in seed_traces_markdown(summary)[2].strip("|").split("|"))
    return f"<h2>{html.escape(summary['title'])}</h2><table><tr>{header}</tr>{rows}</table>"
