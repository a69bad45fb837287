"""Figures of the "Model vs measured" page (pure functions of :func:`iwscope.analysis.model_fit`'s
result and of a stored lab twin's, no database).  A prediction is never drawn like a
measurement: measured values are filled bars and dots with their 95 % intervals; the model's are
open diamonds in :data:`PREDICTION_COLOUR`, named "model (prediction)" in every legend and
hover; a lab twin's are hatched, paler bars named "lab twin (prediction)"."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import cycle

import plotly.graph_objects as go

from iwscope.analysis import BucketModelFit, PathModelFit
from iwscope.predictions.schemas import EstimateIn, TwinPredictionOut
from iwscope_dashboard.figures import TOO_SMALL_COLOUR, TREATMENT_COLOUR, arm_name, empty_figure, interval_bars, style_figure

PREDICTION_COLOUR = "#7b3fa0"
ODD_COLOUR = "#c0392b"
#: A held-out arm (measured by the campaign, predicted by twins fitted without it).
HELD_OUT_COLOUR = "#2a9d8f"
#: The legend's and hovers' name for every predicted value.
PREDICTION_NAME = "model (prediction)"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f} ms"


def bucket_fit_figure(buckets: Sequence[BucketModelFit], treatment_iw: int, baseline_iw: int) -> go.Figure:
    """Per RTT bucket: the measured paired improvement (bars, 95 % interval) beside the model's
    pair-weighted prediction (open diamonds, its Monte-Carlo interval); buckets with too few
    pairs in grey."""
    if not buckets:
        return empty_figure("No path of these filters has both arms.")
    labels = [bucket.bucket for bucket in buckets]
    measured = [bucket.measured_ms if bucket.measured_ms is not None else 0.0 for bucket in buckets]
    fig = go.Figure()
    fig.add_bar(
        x=labels,
        y=measured,
        name=f"measured: IW{baseline_iw} - IW{treatment_iw}",
        marker_color=[TOO_SMALL_COLOUR if bucket.too_small else TREATMENT_COLOUR for bucket in buckets],
        error_y=interval_bars(measured, [bucket.measured_ci_ms for bucket in buckets]),
        hovertext=[
            f"{bucket.bucket}: measured {_ms(bucket.measured_ms)} over {bucket.n_pairs} pairs on {bucket.n_paths} paths"
            + (" (n too small)" if bucket.too_small else "")
            + (f"<br>{bucket.caveat}" if bucket.caveat else "")
            for bucket in buckets
        ],
        hoverinfo="text",
    )
    predicted = [bucket for bucket in buckets if bucket.predicted_ms is not None]
    fig.add_scatter(
        x=[bucket.bucket for bucket in predicted],
        y=[bucket.predicted_ms for bucket in predicted],
        mode="markers",
        name=PREDICTION_NAME,
        marker={"symbol": "diamond-open", "size": 13, "color": PREDICTION_COLOUR, "line": {"width": 2}},
        error_y=interval_bars(
            [bucket.predicted_ms or 0.0 for bucket in predicted],
            [bucket.predicted_ci_ms for bucket in predicted],
            PREDICTION_COLOUR,
        ),
        hovertext=[
            f"{bucket.bucket}: {PREDICTION_NAME} {_ms(bucket.predicted_ms)}"
            + ("" if bucket.predicted_ci_ms is None else f" [{_ms(bucket.predicted_ci_ms[0])}, {_ms(bucket.predicted_ci_ms[1])}]")
            + f"; residual {_ms(bucket.residual_ms)}"
            for bucket in predicted
        ],
        hoverinfo="text",
    )
    fig.update_layout(xaxis_title="path min RTT", yaxis_title="improvement (ms)", barmode="overlay")
    return style_figure(fig, "Improvement per RTT bucket: measured vs model (prediction)")


def path_fit_figure(paths: Sequence[PathModelFit]) -> go.Figure:
    """One dot per path with a verdict: the model's prediction (x) against the measured
    improvement (y, 95 % interval), the line of agreement, odd paths in red."""
    shown = [path for path in paths if path.predicted_ms is not None and path.measured_ms is not None]
    if not shown:
        return empty_figure("No path has enough pairs for a verdict (20 pairs or more).")
    fig = go.Figure()
    for odd, name, colour in ((False, "path: agrees with the model", TREATMENT_COLOUR), (True, "path: odd", ODD_COLOUR)):
        group = [path for path in shown if path.odd == odd]
        if not group:
            continue
        measured = [path.measured_ms or 0.0 for path in group]
        fig.add_scatter(
            x=[path.predicted_ms for path in group],
            y=measured,
            mode="markers",
            name=name,
            marker={"color": colour, "size": 9},
            error_y=interval_bars(measured, [path.measured_ci_ms for path in group], colour),
            hovertext=[
                f"{path.probe_name} ({path.region}), {path.bucket}<br>measured {_ms(path.measured_ms)} over "
                f"{path.n_pairs} pairs<br>{PREDICTION_NAME} {_ms(path.predicted_ms)}<br>residual {_ms(path.residual_ms)}"
                + "".join(f"<br>- {reason}" for reason in path.explanations)
                for path in group
            ],
            hoverinfo="text",
        )
    values = [value for path in shown for value in (path.predicted_ms or 0.0, path.measured_ms or 0.0)]
    low, high = min(0.0, *values), max(values)
    fig.add_scatter(
        x=[low, high],
        y=[low, high],
        mode="lines",
        name="measured = model",
        line={"color": PREDICTION_COLOUR, "dash": "dot", "width": 1},
        hoverinfo="skip",
    )
    fig.update_layout(xaxis_title=f"{PREDICTION_NAME}: improvement (ms)", yaxis_title="measured improvement (ms)")
    return style_figure(fig, "Per path: measured vs model (prediction)")


#: The legend's mark of a lab twin's number (a prediction too, from an emulated path, not the model).
TWIN_NAME = "lab twin (prediction)"


def _bar(
    fig: go.Figure,
    labels: list[str],
    estimates: Sequence[EstimateIn | None],
    name: str,
    colour: str,
    *,
    predicted: bool,
    hatch: str = "/",
) -> None:
    """One arm's improvement per bucket: a filled bar when measured, a hatched (``hatch``), paler
    one with a dashed outline when predicted; ``n too small`` buckets have no bar and say so in the hover."""
    values = [estimate.ms if estimate is not None and estimate.ms is not None else None for estimate in estimates]
    shown = [0.0 if value is None else value for value in values]
    marker: dict[str, object] = {"color": colour}
    if predicted:
        marker |= {"pattern": {"shape": hatch, "fgcolor": colour, "bgcolor": "white"}, "line": {"color": colour, "width": 1.5}}
    fig.add_bar(
        x=labels,
        y=[None if value is None else shown[i] for i, value in enumerate(values)],
        name=name,
        marker=marker,
        opacity=0.75 if predicted else 1.0,
        error_y=interval_bars(shown, [estimate.ci_ms if estimate is not None else None for estimate in estimates], colour),
        hovertext=[
            f"{label}: {name} "
            + ("n too small" if estimate is None or estimate.ms is None else _ms(estimate.ms))
            + ("" if estimate is None else f" ({estimate.n_pairs} pairs)")
            for label, estimate in zip(labels, estimates, strict=True)
        ],
        hoverinfo="text",
    )


#: The hatches of the what-if arms, in order (every prediction is hatched; these tell them apart).
WHAT_IF_HATCHES = ("/", "x", "\\", ".", "+", "-", "|")


def twin_bucket_figure(prediction: TwinPredictionOut) -> go.Figure:
    """Per RTT bucket, the lab twin beside what was measured: the fit arm measured and as the
    twins ran it, the held-out arm measured and predicted, and every what-if arm predicted
    (predictions hatched, named so in legend and hover)."""
    result = prediction.result
    if not result.buckets:
        return empty_figure("The stored twin has no RTT bucket with a twin estimate.")
    buckets = sorted(result.buckets, key=lambda bucket: bucket.order)
    labels = [bucket.bucket for bucket in buckets]
    base, treat = result.baseline_iw, result.treatment_iw
    fig = go.Figure()
    held = result.compare_arm
    # each measured arm beside the twins' run of it: the fit arm, then the held-out one
    compared: list[tuple[int | str, str, list[EstimateIn | None], list[EstimateIn | None]]] = [
        (treat, TREATMENT_COLOUR, [b.fit.measured for b in buckets], [b.fit.twin for b in buckets])
    ]
    if held is not None:
        outs = [b.held_out for b in buckets]
        compared.append(
            (held, HELD_OUT_COLOUR, [o.measured if o else None for o in outs], [o.predicted if o else None for o in outs])
        )
    for arm, colour, measured, twin in compared:
        _bar(fig, labels, measured, f"measured: IW{base} - {arm_name(arm)}", colour, predicted=False)
        _bar(fig, labels, twin, f"{arm_name(arm)}: {TWIN_NAME}", colour, predicted=True)
    what_ifs = [arm for arm in result.what_if if arm != held]
    for arm, hatch in zip(what_ifs, cycle(WHAT_IF_HATCHES)):  # one hatch per what-if arm: told apart
        predicted = [b.predicted.get(arm) for b in buckets]
        _bar(fig, labels, predicted, f"{arm_name(arm)}: {TWIN_NAME}", PREDICTION_COLOUR, predicted=True, hatch=hatch)
    fig.update_layout(xaxis_title="path min RTT", yaxis_title=f"improvement over IW{base} (ms)", barmode="group")
    return style_figure(fig, f"Lab twin of campaign {prediction.campaign_id}: measured vs predicted per RTT bucket")
