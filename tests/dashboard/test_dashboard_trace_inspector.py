"""The trial inspector (issue 35): a stored trial's trace with its twins' overlaid.

* :func:`iwscope_dashboard.trialfigures.trial_figure` on the collector's read model
  (``TrialTracesOut``) built from synthetic fetches -- IW10 and its IW3 twin, the twin losing one
  segment -- made into traces by the probe's own :meth:`iwprobe._trace.Trace.from_packets`:
  points per trace, the first flights, the retransmission, the ACK and receive-window lines,
  the round-trip bands.
* ``iwscope trace plot <trial id>`` against the seeded study, the round's traces stored through
  the collector's own service (``validate_trace_batch`` + ``store_trace_batch``, what
  ``POST /api/v1/traces/batch`` runs): the figure, and one line for an unknown or untraced trial.
* The Trials page: its inspector callback in process (the sentence of an untraced trial) and in
  headless Chromium, opened on ``/trials?trial=<id>`` and by a click on a row.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import importlib.util
import json
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, create_engine, pool, text
from sqlalchemy.orm import Session, sessionmaker

from iwprobe import wire
from iwprobe._capture import ACK, SYN, Packet
from iwprobe._trace import Trace
from iwscope.traces.schemas import TracedTrialOut, TraceOut, TrialTracesOut
from iwscope.traces.services import store_trace_batch
from iwscope.traces.validation import validate_trace_batch
from iwscope_dashboard import db, trialfigures
from iwscope_dashboard.pagecheck import HAS_POINTS_JS, check_pages
from iwscope_dashboard.pagekit import configure_cache
from iwscope_dashboard.trace_cli import trace as trace_group

MSS = 1448
RTT_NS = 80_000_000
SPACING_NS = 100_000
PSH = 0x08
CLIENT_ISN, SERVER_ISN = 7_000, 900_000
WSCALE = 7
WINDOW = 502  # the probe's window field: 502 << 7 bytes
START_NS = 1_764_000_000_000_000_000
TIMEOUT_MS = 20_000
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"

#: The points of each plotly trace of a dcc.Graph: {name: [x count, first x]}.
POINTS_JS = """
(id) => {
    const plot = document.querySelector('#' + id + ' .js-plotly-plot');
    return plot && plot.data ? plot.data.map((t) => [t.name, (t.x || []).length]) : null;
}
"""


def fetch(iw: int, size: int, lose: int | None = None) -> list[Packet]:
    """One fetch as the probe captures it: handshake, request, then slow start from ``iw``
    segments (a flight per RTT, doubling), the probe ACKing each segment; segment ``lose`` is
    lost and arrives again first in the next flight (duplicate ACKs meanwhile)."""
    packets: list[Packet] = []

    def add(t_ns: int, outgoing: bool, seq: int, ack: int, flags: int, window: int, payload: int = 0, **options: int) -> None:
        packets.append(
            Packet(START_NS + t_ns, outgoing, seq, ack, flags, payload, window, options.get("mss"), options.get("wscale"))
        )

    client = CLIENT_ISN + 1
    add(0, True, CLIENT_ISN, 0, SYN, 64240, mss=1460, wscale=WSCALE)
    add(RTT_NS, False, SERVER_ISN, client, SYN | ACK, 65160, mss=1460, wscale=WSCALE)
    add(RTT_NS + 50_000, True, client, SERVER_ISN + 1, ACK, WINDOW)
    add(RTT_NS + 60_000, True, client, SERVER_ISN + 1, ACK | PSH, WINDOW, 120)
    client += 120
    segments = math.ceil(size / MSS)
    pending, again, lost, received = list(range(segments)), [], False, set()
    start, window = 2 * RTT_NS + 60_000, iw
    while pending or again:
        flight = again + pending[: window - len(again)]
        pending = pending[window - len(again) :]
        again = []
        for k, segment in enumerate(flight):
            at = start + k * SPACING_NS
            if segment == lose and not lost:
                lost, again = True, [segment]
                continue
            length = min(MSS, size - segment * MSS)
            add(at, False, SERVER_ISN + 1 + segment * MSS, client, ACK, 128, length)
            received.add(segment)
            contiguous = next(n for n in range(segments + 1) if n not in received)
            add(at + 20_000, True, client, SERVER_ISN + 1 + min(size, contiguous * MSS), ACK, WINDOW)
        start, window = start + RTT_NS, window * 2
    return packets


def trace_dict(iw: int, size: int, lose: int | None = None) -> dict[str, Any]:
    return Trace.from_packets(fetch(iw, size, lose), rcv_mss=MSS, min_rtt_us=RTT_NS // 1000).to_dict()


def traced_trial(iw: int, total_ms: float | None, traces: dict[str, dict[str, Any]], size: int = 30 * MSS) -> TracedTrialOut:
    return TracedTrialOut(
        trial_id=uuid.uuid4(),
        campaign_id=1,
        probe_id=uuid.UUID(int=1),
        round=4,
        arm_iw=iw,
        arm=str(iw),
        object_size=size,
        total_us=None if total_ms is None else round(total_ms * 1000),
        ttfb_us=None if total_ms is None else round(total_ms * 600),
        error_kind=None if total_ms is not None else "timeout",
        client_iw_segments=iw,
        client_iw_status="ok",
        tcp_info={"min_rtt": RTT_NS // 1000, "total_retrans": 0, "rcv_mss": MSS},
        traces=[
            TraceOut(
                side=side,
                captured_at=dt.datetime(2026, 11, 27, tzinfo=dt.UTC),
                packets=trace["packets"],
                dropped=0,
                stored_bytes=0,
                trace=trace,
            )
            for side, trace in traces.items()
        ],
    )


def data_packets(trace: dict[str, Any]) -> list[int]:
    return [i for i in range(trace["packets"]) if not trace["outgoing"][i] and trace["length"][i] > 0]


def by_name(figure: Any) -> dict[str, Any]:
    return {scatter.name: scatter for scatter in figure.data}


# -- the figure ---------------------------------------------------------------------------------


def test_the_trial_and_its_twin_are_overlaid_one_colour_per_arm() -> None:
    size = 30 * MSS
    iw10, iw3 = trace_dict(10, size), trace_dict(3, size, lose=5)
    main = traced_trial(10, 245.3, {"receiver": iw10})
    twin = traced_trial(3, 410.8, {"receiver": iw3})
    untraced = traced_trial(16, 170.0, {})
    figure = trialfigures.trial_figure(TrialTracesOut(trial=main, twins=[twin, untraced]))
    traces = by_name(figure)
    assert set(traces) == {
        "IW10 · 245.3 ms (this trial)",
        "IW10 first flight: 10 segments / 14,480 bytes",
        "IW3 · 410.8 ms",
        "IW3 first flight: 3 segments / 4,344 bytes",
        "IW3 retransmission",
        "ACK (IW10)",
        "receive window (IW10: ack + window)",
    }
    # One point per received data packet, split into first flight, later data, retransmission.
    assert len(traces["IW10 first flight: 10 segments / 14,480 bytes"].x) == 10
    assert len(traces["IW10 · 245.3 ms (this trial)"].x) == 30 - 10
    assert len(traces["IW3 first flight: 3 segments / 4,344 bytes"].x) == 3
    assert len(traces["IW3 · 410.8 ms"].x) == 30 - 3 - 1
    retransmission = traces["IW3 retransmission"]
    assert list(retransmission.y) == [1 + 6 * MSS]  # segment 5's end, below the highest seen
    assert retransmission.x[0] == pytest.approx((4 * RTT_NS + 60_000) / 1e6)  # first in the next flight
    assert sum(len(traces[name].x) for name in traces if name.startswith("IW3")) == len(data_packets(iw3)) == 30
    # The first data packet of the IW10 trial: one RTT after the request, at the end of its bytes.
    first = traces["IW10 first flight: 10 segments / 14,480 bytes"]
    assert first.x[0] == pytest.approx((2 * RTT_NS + 60_000) / 1e6) and first.y[0] == 1 + MSS
    # One colour per arm: a trial's markers share it (the retransmission is red, outlined in it).
    ten, three = traces["IW10 · 245.3 ms (this trial)"].marker.color, traces["IW3 · 410.8 ms"].marker.color
    assert ten != three
    assert traces["IW10 first flight: 10 segments / 14,480 bytes"].marker.color == ten
    assert retransmission.marker.color == trialfigures.RETRANSMISSION_COLOUR and retransmission.marker.line.color == three
    # Legend in arm order, the main trial drawn last (on top).
    assert traces["IW3 · 410.8 ms"].legendrank < traces["IW10 · 245.3 ms (this trial)"].legendrank
    assert figure.data[-3].name == "IW10 first flight: 10 segments / 14,480 bytes"
    assert "not traced: IW16" in figure.layout.title.text and "twins IW3, IW16" in figure.layout.title.text


def test_the_acks_the_receive_window_and_the_round_trips_are_the_main_trials() -> None:
    size = 30 * MSS
    iw10, iw3 = trace_dict(10, size), trace_dict(3, size, lose=5)
    traced = TrialTracesOut(trial=traced_trial(10, 245.3, {"receiver": iw10}), twins=[traced_trial(3, 410.8, {"receiver": iw3})])
    figure = trialfigures.trial_figure(traced)
    traces = by_name(figure)
    acks = [i for i in range(iw10["packets"]) if iw10["outgoing"][i] and iw10["flags"][i] & ACK and not iw10["flags"][i] & SYN]
    assert len(acks) == 2 + 30  # the handshake's ACK, the request, one per segment
    assert list(traces["ACK (IW10)"].y) == [iw10["ack"][i] for i in acks]
    window = traces["receive window (IW10: ack + window)"]
    assert list(window.y) == [iw10["ack"][i] + iw10["window"][i] for i in acks]
    assert {y - a for y, a in zip(window.y, traces["ACK (IW10)"].y, strict=True)} == {WINDOW << WSCALE}
    # The window (64 KB) was above the 43 KB object all along: the y axis is the data's.
    assert min(window.y) > 1 + 30 * MSS
    assert figure.layout.yaxis.range == (0, (1 + 30 * MSS) * 1.08)
    assert "receive window above the plot all along" in figure.layout.title.text
    # Alternate round trips of the trial's min_rtt_us from the SYN to the last packet of any trial
    # (the IW3 twin's, four flights and a retransmission later).
    rtt_ms, end_ms = RTT_NS / 1e6, max(iw3["t_us"]) / 1000
    assert end_ms > max(iw10["t_us"]) / 1000
    bands = [(shape.x0, shape.x1) for shape in figure.layout.shapes if shape.type == "rect"]
    assert bands == [(k * 2 * rtt_ms, min((2 * k + 1) * rtt_ms, end_ms)) for k in range(math.ceil(end_ms / (2 * rtt_ms)))]
    assert len(bands) == 3
    cutoffs = [shape for shape in figure.layout.shapes if shape.type == "line"]
    assert len(cutoffs) == 1 and cutoffs[0].x0 == iw10["first_flight"]["cutoff_us"] / 1000
    assert "alternate round trips of 80.0 ms" in figure.layout.xaxis.title.text


def test_a_trial_without_a_trace_says_why_and_the_summaries() -> None:
    untraced = TrialTracesOut(trial=traced_trial(10, 245.3, {}), twins=[])
    with pytest.raises(trialfigures.NoTrace, match="trace_share was 0") as raised:
        trialfigures.trial_figure(untraced)
    assert "\n" not in str(raised.value) and str(untraced.trial.trial_id) in str(raised.value)
    sender_only = TrialTracesOut(trial=traced_trial(10, 245.3, {"sender": trace_dict(10, 4 * MSS)}), twins=[])
    with pytest.raises(trialfigures.NoTrace, match=r"no receiver trace \(stored: sender\)"):
        trialfigures.trial_figure(sender_only)

    traced = TrialTracesOut(
        trial=traced_trial(10, 245.3, {"receiver": trace_dict(10, 30 * MSS)}),
        twins=[traced_trial(3, 410.8, {}), traced_trial(16, None, {})],
    )
    assert trialfigures.trial_summary(traced) == (
        "IW10 · 43,440 bytes · total 245.3 ms (TTFB 147.2 ms) · first flight 10 segments / 14,480 bytes"
        " · client IW 10 segments (ok)"
    )
    assert trialfigures.trial_summary(untraced).count("first flight not traced") == 1
    assert trialfigures.twins_summary(traced) == (
        "Twins (total latency, and against this trial): IW3 410.8 ms (+165.5 ms), IW16 failed (timeout)"
    )
    assert trialfigures.tcp_info_rows({"total_retrans": 2, "min_rtt": 80_000, "rcv_mss": 1448}) == [
        ("min_rtt", "80,000 µs"),
        ("rcv_mss", "1,448"),
        ("total_retrans", "2"),
    ]


def test_the_page_keeps_the_trial_in_its_url(pages: dict[str, ModuleType]) -> None:
    trials = importlib.import_module("iwscope_dashboard.pages.trials")
    trial = uuid.uuid4()
    assert trials.page_query("?campaign=2&base=3", str(trial).upper()) == f"?campaign=2&base=3&trial={trial}"
    assert trials.page_query("", str(trial)) == f"?trial={trial}"
    assert trials.page_query("?campaign=2", "not-a-trial") == "?campaign=2"
    assert trials.page_query("?campaign=2", None) == "?campaign=2"


def test_the_details_say_how_the_origin_sent_the_response(pages: dict[str, ModuleType]) -> None:
    """Wire v8: the observation's send path and segmentation offload beside TCP_INFO; "not said"
    for an older origin, a sentence for a trial without an observation."""
    trials = importlib.import_module("iwscope_dashboard.pages.trials")
    trial = traced_trial(10, 245.3, {})
    sent = trial.model_copy(update={"send_path": "sendfile", "segmentation_offload": "gso"})
    assert trials.sending_rows(sent) == [("send path", "sendfile"), ("segmentation offload", "gso")]
    older = trial.model_copy(update={"send_path": "", "segmentation_offload": ""})
    assert trials.sending_rows(older) == [("send path", trials.NOT_SAID), ("segmentation offload", trials.NOT_SAID)]
    assert trial.send_path is None and trials.sending_rows(trial) == []
    details = repr(trials._details(TrialTracesOut(trial=sent, twins=[]), trialfigures.RECEIVER))
    assert "sendfile" in details and "gso" in details
    assert details.index("Send path (the origin's)") < details.index("TCP_INFO (the probe's")
    assert "No origin observation of this trial" in repr(trials._details(TrialTracesOut(trial=trial, twins=[]), "receiver"))


# -- the stored round: CLI, page callback, browser ---------------------------------------------


@dataclass(frozen=True)
class StoredRound:
    """A round of the seeded study with its IW10 and IW3 trials' traces stored."""

    trial: uuid.UUID
    twin: uuid.UUID
    untraced: uuid.UUID
    campaign: int
    #: Received data packets of the trial's and the twin's traces.
    points: int
    twin_points: int


@pytest.fixture(scope="module")
def stored_round(dashboard_db: Any) -> Iterator[StoredRound]:
    """An IW10 trial of the three-arm campaign and its IW3 twin, traced as the probe uploads
    them (a ``TraceBatch``, through the collector's validation and store); the IW16 twin left
    untraced.  Removed at the end (the seeded database is shared), ``last_seen_at`` restored."""
    engine = create_engine(dashboard_db.url, poolclass=pool.NullPool)
    campaign = dashboard_db.summary.campaign_ids["higher-iw"]
    size = 15_000
    try:
        yield from _store_round(engine, campaign, size)
    finally:
        engine.dispose()


def _store_round(engine: Engine, campaign: int, size: int) -> Iterator[StoredRound]:
    with Session(engine) as session:
        row = session.execute(
            text(
                "SELECT t.trial_id, t.probe_id, t3.trial_id AS twin, t16.trial_id AS untraced, p.last_seen_at"
                " FROM trials t JOIN probes p ON p.id = t.probe_id"
                " JOIN trials t3 ON (t3.campaign_id, t3.probe_id, t3.round, t3.object_size, t3.arm_iw)"
                "   = (t.campaign_id, t.probe_id, t.round, t.object_size, 3)"
                " JOIN trials t16 ON (t16.campaign_id, t16.probe_id, t16.round, t16.object_size, t16.arm_iw)"
                "   = (t.campaign_id, t.probe_id, t.round, t.object_size, 16)"
                " WHERE t.campaign_id = :campaign AND t.arm_iw = 10 AND t.object_size = :size"
                "   AND t.total_us IS NOT NULL AND t3.total_us IS NOT NULL"
                " ORDER BY t.started_at LIMIT 1"
            ),
            {"campaign": campaign, "size": size},
        ).one()
    ten, three = trace_dict(10, size), trace_dict(3, size, lose=4)
    now = dt.datetime.now(dt.UTC)
    batch = wire.TraceBatch(
        wire_version=7,
        batch_id=str(uuid.uuid4()),
        agent_id=str(row.probe_id),
        sent_at=wire.utc_timestamp(now),
        traces=[
            wire.TraceRecord(str(trial), "receiver", wire.utc_timestamp(now), trace)
            for trial, trace in ((row.trial_id, ten), (row.twin, three))
        ],
    )
    rows = validate_trace_batch(json.dumps(dataclasses.asdict(batch)).encode(), "probe", row.probe_id)
    try:
        assert store_trace_batch(engine, rows).accepted == 2
        yield StoredRound(row.trial_id, row.twin, row.untraced, campaign, len(data_packets(ten)), len(data_packets(three)))
    finally:
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM trial_traces WHERE trial_id IN (:a, :b)"), {"a": row.trial_id, "b": row.twin})
            connection.execute(
                text("UPDATE probes SET last_seen_at = :seen WHERE id = :probe"),
                {"seen": row.last_seen_at, "probe": row.probe_id},
            )


def plot(*arguments: str) -> Any:
    return CliRunner().invoke(trace_group, ["plot", *arguments])


def test_plot_by_trial_id_draws_the_round(stored_round: StoredRound, dashboard_db: Any, tmp_path: Path) -> None:
    out = tmp_path / "trial.html"
    done = plot(str(stored_round.trial), "--out", str(out), "--database-url", dashboard_db.url)
    assert done.exit_code == 0, done.output
    assert done.stdout == f"{out}\n"
    html = out.read_text()
    assert 'class="plotly-graph-div"' in html
    # (the page's JSON writes "/" as "\\/")
    for name in ("(this trial)", "IW10 first flight: 10 segments", "IW3 retransmission", "not traced: IW16"):
        assert name in html


@pytest.mark.parametrize(
    ("which", "message"),
    [
        ("unknown", "no trial {trial} in the database"),
        ("untraced", "trial {trial} has no packet trace: its campaign's trace_share was 0"),
    ],
)
def test_plot_of_a_trial_it_cannot_draw_is_one_line(
    stored_round: StoredRound, dashboard_db: Any, tmp_path: Path, which: str, message: str
) -> None:
    trial = uuid.uuid4() if which == "unknown" else stored_round.untraced
    out = tmp_path / "trial.html"
    done = plot(str(trial), "--out", str(out), "--database-url", dashboard_db.url)
    assert done.exit_code == 1
    assert done.stderr.count("\n") == 1 and message.format(trial=trial) in done.stderr
    assert not out.exists()


@pytest.mark.skipif(importlib.util.find_spec("kaleido") is not None, reason="kaleido is installed: PNG works")
def test_png_of_a_trial_without_kaleido_says_so(stored_round: StoredRound, dashboard_db: Any, tmp_path: Path) -> None:
    done = plot(str(stored_round.trial), "--out", str(tmp_path / "trial.png"), "--database-url", dashboard_db.url)
    assert done.exit_code == 1
    assert done.stderr.count("\n") == 1 and "kaleido" in done.stderr and "not installed" in done.stderr


@pytest.fixture
def study_pages(pages: dict[str, ModuleType], dashboard_db: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The Trials page module, its reads on the seeded study (committed: a session of its own)."""
    engine = create_engine(dashboard_db.url, poolclass=pool.NullPool)
    monkeypatch.setattr(db, "session_factory", lambda: sessionmaker(bind=engine))
    configure_cache(0)
    yield importlib.import_module("iwscope_dashboard.pages.trials")
    engine.dispose()


def test_the_inspector_callback(stored_round: StoredRound, study_pages: ModuleType) -> None:
    hidden = {"display": "none"}
    shown, figure_style, card, note, details, highlight = study_pages.inspect(str(stored_round.trial))
    assert shown is None and figure_style is None
    figure = card.children.figure
    assert {scatter["name"] for scatter in figure.to_plotly_json()["data"]} >= {"ACK (IW10)", "IW3 retransmission"}
    assert f"Trial {stored_round.trial}" in note and "receiver side" in note
    text_of = repr(details)
    assert "IW10 · 15,000 bytes" in text_of and "Twins (total latency" in text_of and "No TCP_INFO recorded" in text_of
    assert str(stored_round.trial) in highlight[0]["if"]["filter_query"]
    # The sender side asked for: this round has the probe's traces only, so the receiver's is
    # drawn and the note says why.
    _, _, card, note, _, _ = study_pages.inspect(str(stored_round.trial), "sender")
    assert card.children.figure and "receiver side" in note and "It has no sender trace (the origin kept none)" in note
    # An untraced trial: a sentence instead of a figure, the details still there.
    shown, figure_style, card, note, details, _ = study_pages.inspect(str(stored_round.untraced))
    assert shown is None and figure_style == hidden and card == []
    assert "has no packet trace to draw: its campaign's trace_share was 0" in note and details
    # Nothing selected, a wrong id, an unknown trial.
    assert study_pages.inspect(None)[:2] == (hidden, hidden)
    assert "is not a trial id" in study_pages.inspect("nonsense")[3]
    assert "No trial" in study_pages.inspect(str(uuid.uuid4()))[3]


def test_a_link_opens_the_inspector_and_a_click_selects_a_trial(
    stored_round: StoredRound, page: Any, dashboard_server: Any
) -> None:
    campaign = stored_round.campaign
    page.goto(f"{dashboard_server.url}/trials?campaign={campaign}&trial={stored_round.trial}", wait_until="load")
    page.wait_for_function(HAS_POINTS_JS, arg="trials-inspector-graph", timeout=TIMEOUT_MS)
    points = dict(page.evaluate(POINTS_JS, "trials-inspector-graph"))
    trial_points = sum(count for name, count in points.items() if name.startswith("IW10"))
    twin_points = sum(count for name, count in points.items() if name.startswith("IW3"))
    assert (trial_points, twin_points) == (stored_round.points, stored_round.twin_points)
    assert points["ACK (IW10)"] > 0 and points["receive window (IW10: ack + window)"] == points["ACK (IW10)"]
    assert "IW10 · 15,000 bytes" in page.inner_text("#trials-inspector-details")
    # The page's callbacks rewrote the address bar: the filters and the trial are both kept.
    search = f"?campaign={campaign}&base=3&treat=10&metric=server&trial={stored_round.trial}"
    page.wait_for_function("(search) => window.location.search === search", arg=search, timeout=TIMEOUT_MS)
    page.wait_for_selector("#trials-table td", timeout=TIMEOUT_MS)
    page.locator("#trials-inspector").screenshot(path=str(SCREENSHOTS / "trials-inspector.png"))
    # A click on another row selects its trial (untraced: a sentence, no figure).
    cell = page.locator("#trials-table tbody tr:has(td) td").nth(0)
    clicked = cell.inner_text().strip()
    cell.click()
    page.wait_for_function(
        "(trial) => window.location.search.endsWith('trial=' + trial)", arg=str(uuid.UUID(clicked)), timeout=TIMEOUT_MS
    )
    page.wait_for_function(
        "(trial) => document.querySelector('#trials-inspector-note').innerText.includes(trial)", arg=clicked, timeout=TIMEOUT_MS
    )
    note = page.inner_text("#trials-inspector-note")
    if uuid.UUID(clicked) not in (stored_round.trial, stored_round.twin):
        assert "has no packet trace to draw" in note and not page.is_visible("#trials-inspector-figure")
    assert not page.problems, page.problems


def test_the_page_check_opens_a_traced_trials_inspector(stored_round: StoredRound, dashboard_server: Any, browser: Any) -> None:
    """``make demo``'s page check with a traced trial: its inspector must draw its packets; an
    untraced trial has no inspector figure, and the check says so."""
    drawn = check_pages(dashboard_server.url, pages=[], trial=str(stored_round.trial), browser=browser)
    [count] = drawn.counts
    assert drawn.ok and (count.page, count.item) == ("/trials", "trials-inspector-graph") and count.points, count
    assert count.points >= stored_round.points  # the trial's received data packets, and more (ACKs, twins)
    missing = check_pages(dashboard_server.url, pages=[], trial=str(stored_round.untraced), browser=browser, timeout_s=2)
    assert not missing.ok and [count.found for count in missing.counts] == [False]


def test_a_click_on_the_latency_cdf_opens_a_trial_like_it(
    stored_round: StoredRound, study_pages: ModuleType, dashboard_db: Any
) -> None:
    """The Latency page's CDF: a click on IW10's curve near the traced trial's latency opens that
    trial in the inspector (traced trials are preferred within 10 %); far from it, the nearest
    trial of the arm (an untraced one); an arm with no trial, a sentence and no navigation."""
    latency = importlib.import_module("iwscope_dashboard.pages.latency")
    engine = create_engine(dashboard_db.url, poolclass=pool.NullPool)
    with Session(engine) as session:
        total_ms, campaign = session.execute(
            text("SELECT total_us / 1000.0, campaign_id FROM trials WHERE trial_id = :t"), {"t": stored_round.trial}
        ).one()
        far_ms = 3 * float(total_ms)
        nearest = session.execute(
            text(
                "SELECT trial_id FROM trials WHERE campaign_id = :c AND arm_iw = 10 AND total_us IS NOT NULL "
                "ORDER BY abs(total_us - :us), trial_id LIMIT 1"
            ),
            {"c": campaign, "us": far_ms * 1000},
        ).scalar_one()
    engine.dispose()
    search = f"?campaign={campaign}&metric=client"

    def click(iw: int, ms: float) -> dict[str, Any]:
        return {"points": [{"curveNumber": 0, "x": ms, "y": 0.5, "customdata": iw}]}

    href, why = latency.trial_link(click(10, 1.04 * float(total_ms)), search)
    assert href == f"/trials?campaign={campaign}&metric=client&trial={stored_round.trial}" and why == ""
    href, _ = latency.trial_link(click(10, far_ms), search)
    assert href is not None and href.endswith(f"trial={nearest}") and nearest != stored_round.trial
    assert latency.trial_link(click(999, 100.0), search) == (None, "No IW999 trial matches the filters.")
    assert latency.trial_link(None, search) == (None, "") and latency.trial_link({"points": [{"x": 1.0}]}, search) == (None, "")
