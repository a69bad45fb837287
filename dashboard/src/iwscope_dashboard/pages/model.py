"""Model vs measured: per RTT bucket and per path, the measured improvement beside what the model
with loss predicts from the path's own estimates, and the paths that stand out."""

from __future__ import annotations

from typing import Any

import dash
from dash import Output, callback, html

from iwscope.analysis import ModelFit, PathModelFit
from iwscope.predictions.schemas import EstimateIn, TwinPredictionOut
from iwscope_dashboard.figures import arm_name, empty_figure
from iwscope_dashboard.filterbar import filter_inputs, filters_from_page_query, register_url_sync
from iwscope_dashboard.modelfigures import (
    PREDICTION_COLOUR,
    PREDICTION_NAME,
    TWIN_NAME,
    bucket_fit_figure,
    path_fit_figure,
    twin_bucket_figure,
)
from iwscope_dashboard.pagedata import model_data, twin_data
from iwscope_dashboard.pagekit import Nothing, fmt_ms, graph, page_filters, page_frame, read, status
from iwscope_dashboard.pages.wild import data_table

dash.register_page(__name__, path="/model", name="Model", title="iwscope: model vs measured", order=5.6)

PREFIX = "model"
NO_PATHS = "No trials of the two arms with a joined origin observation match these filters."


def layout(**url_query: Any) -> html.Div:
    return page_frame(
        PREFIX,
        "Model vs measured",
        "Is this number what TCP should give on this path? For every probe-origin path, the model with loss "
        "(a Monte-Carlo over a packet-level Linux sender: slow start from the IW, SYN and data loss, RACK, "
        "the tail loss probe, RTOs) is run over the path's own sizes from its own estimates -- min RTT, "
        "bottleneck rate, the baseline arm's retransmitted share as random loss, the client's receive "
        "window -- and its predicted improvement is set beside the measured, paired one (95 % intervals). "
        "Model values are predictions, drawn as open diamonds and labelled so. A path whose measurement "
        "the model does not explain is listed as odd, with what its own trials show.",
        filters_from_page_query(url_query),
        [
            html.Div([graph(f"{PREFIX}-bucket-graph"), graph(f"{PREFIX}-path-graph")], className="iw-grid-2"),
            html.H2("RTT buckets", className="iw-subtitle"),
            html.Div(html.Div(id=f"{PREFIX}-bucket-table"), className="iw-card"),
            html.H2("Paths (odd ones first)", className="iw-subtitle"),
            html.Div(html.Div(id=f"{PREFIX}-path-table"), className="iw-card"),
            html.H2("Lab twin: what other IWs would do (predictions)", className="iw-subtitle"),
            html.P(
                "iwscope lab twin --campaign N fits one emulated link per measured path (min RTT, bottleneck rate, "
                "the baseline's loss, the queue the path showed), checks that the twins reproduce the measured arm, "
                "then runs arms the campaign did not measure. Every twin number is a prediction: hatched bars, "
                "italic columns.",
                className="iw-note",
            ),
            html.Div(id=f"{PREFIX}-twin-status"),
            graph(f"{PREFIX}-twin-graph"),
            html.Div(html.Div(id=f"{PREFIX}-twin-table"), className="iw-card"),
        ],
    )


def _interval(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f" [{ci[0]:,.1f}, {ci[1]:,.1f}]"


def _pct(value: float | None) -> str:
    return "" if value is None else f" ({value:.1f} %)"


def _verdict(agrees: bool | None, too_small: bool, odd: bool = False) -> str:
    if too_small or agrees is None:
        return "n too small"
    if odd:
        return "odd"
    return "agrees" if agrees else "differs"


def bucket_rows(fit: ModelFit) -> list[dict[str, Any]]:
    return [
        {
            "bucket": bucket.bucket,
            "paths": bucket.n_paths,
            "pairs": bucket.n_pairs,
            "measured": "n too small"
            if bucket.too_small
            else f"{fmt_ms(bucket.measured_ms)}{_interval(bucket.measured_ci_ms)}{_pct(bucket.measured_pct)}",
            "predicted": f"{fmt_ms(bucket.predicted_ms)}{_interval(bucket.predicted_ci_ms)}{_pct(bucket.predicted_pct)}"
            if bucket.predicted_ms is not None
            else "-",
            "residual": fmt_ms(bucket.residual_ms) if bucket.residual_ms is not None else "-",
            "verdict": _verdict(bucket.agrees, bucket.too_small),
            "caveat": bucket.caveat or "",
        }
        for bucket in fit.buckets
    ]


BUCKET_COLUMNS = [
    ("bucket", "path min RTT"),
    ("paths", "paths"),
    ("pairs", "pairs"),
    ("measured", "measured improvement [95 % CI]"),
    ("predicted", f"{PREDICTION_NAME} [Monte-Carlo CI]"),
    ("residual", "residual (measured - model)"),
    ("verdict", "verdict (interval holds the model, or within 15 % of its baseline)"),
    ("caveat", "caveat"),
]


def path_rows(paths: list[PathModelFit]) -> list[dict[str, Any]]:
    ordered = sorted(paths, key=lambda path: (not path.odd, path.too_small, path.bucket_order, path.probe_name))
    rows = []
    for path in ordered:
        inputs = path.inputs
        rows.append(
            {
                "probe": path.probe_name,
                "region": path.region,
                "bucket": path.bucket,
                "inputs": "-"
                if inputs is None
                else (
                    f"{inputs.min_rtt_ms:.1f} ms, "
                    + ("no rate" if inputs.bottleneck_bps is None else f"{inputs.bottleneck_bps / 1e6:.2f} Mbit/s")
                    + f", loss {inputs.loss:.2%}"
                    + ("" if inputs.rwnd_segments is None else f", rwnd {inputs.rwnd_segments}")
                ),
                "pairs": path.n_pairs,
                "measured": "n too small" if path.too_small else f"{fmt_ms(path.measured_ms)}{_interval(path.measured_ci_ms)}",
                "predicted": "-"
                if path.predicted_ms is None
                else f"{fmt_ms(path.predicted_ms)}{_interval(path.predicted_ci_ms)}",
                "residual": "-" if path.residual_ms is None else fmt_ms(path.residual_ms),
                "arms": "; ".join(
                    f"IW{arm.iw} (n={arm.n}): {fmt_ms(arm.measured_mean_ms)}{_interval(arm.measured_ci_ms)} "
                    f"vs {fmt_ms(arm.predicted_mean_ms)}"
                    for arm in path.arms
                    if arm.n
                ),
                "verdict": path.reason if path.too_small and path.reason else _verdict(path.agrees, path.too_small, path.odd),
                "why": "; ".join(path.explanations),
            }
        )
    return rows


PATH_COLUMNS = [
    ("probe", "probe"),
    ("region", "region"),
    ("bucket", "RTT bucket"),
    ("inputs", "model inputs (the path's estimates)"),
    ("pairs", "pairs"),
    ("measured", "measured improvement [95 % CI]"),
    ("predicted", f"{PREDICTION_NAME} [Monte-Carlo CI]"),
    ("residual", "residual"),
    ("arms", "mean latency: measured [95 % CI] vs model (prediction)"),
    ("verdict", "verdict"),
    ("why", "what the trials show"),
]

#: Predicted columns in the prediction's colour and italics, odd rows tinted.
PREDICTION_STYLE: list[dict[str, Any]] = [
    {"if": {"column_id": "predicted"}, "fontStyle": "italic", "color": PREDICTION_COLOUR},
    {"if": {"filter_query": '{verdict} = "odd"'}, "backgroundColor": "#fbeaea"},
]


def _empty(fit: ModelFit) -> bool:
    return not fit.paths


@callback(
    Output(f"{PREFIX}-bucket-graph", "figure"),
    Output(f"{PREFIX}-path-graph", "figure"),
    Output(f"{PREFIX}-bucket-table", "children"),
    Output(f"{PREFIX}-path-table", "children"),
    Output(f"{PREFIX}-status", "children"),
    Output(f"{PREFIX}-query", "data"),
    *filter_inputs(PREFIX),
)
def update(*values: Any) -> tuple[Any, ...]:
    filters, search = page_filters(*values)
    fit = read(model_data, filters, cache=True, compare=True, empty=_empty, empty_message=NO_PATHS)
    if isinstance(fit, Nothing):
        return empty_figure(fit.message), empty_figure(fit.message), [], [], fit.status_line(), search
    judged = [path for path in fit.paths if not path.too_small]
    line = (
        f"{len(fit.paths)} paths in {len(fit.buckets)} RTT buckets; {len(judged)} with enough pairs for a verdict, "
        f"{fit.odd_paths} odd. Model: {fit.model_samples} simulated connections per arm and path, "
        f"{fit.cc.upper()} at the origin, metric '{fit.metric}'."
        + (f" Only the newest {fit.trials_read:,} trials were read: narrow the filters for the rest." if fit.truncated else "")
    )
    return (
        bucket_fit_figure(fit.buckets, fit.treatment_iw, fit.baseline_iw),
        path_fit_figure(fit.paths),
        data_table(f"{PREFIX}-buckets", BUCKET_COLUMNS, bucket_rows(fit), NO_PATHS, style_data_conditional=PREDICTION_STYLE),
        data_table(f"{PREFIX}-paths", PATH_COLUMNS, path_rows(fit.paths), NO_PATHS, style_data_conditional=PREDICTION_STYLE),
        status(line),
        search,
    )


def _estimate(estimate: EstimateIn | None) -> str:
    if estimate is None or estimate.ms is None:
        return "n too small" + ("" if estimate is None else f" ({estimate.n_pairs} pairs)")
    return f"{fmt_ms(estimate.ms)}{_interval(estimate.ci_ms)} (n={estimate.n_pairs})"


def _overlap(overlap: bool | None) -> str:
    return "-" if overlap is None else "yes" if overlap else "no"


def twin_columns(prediction: TwinPredictionOut) -> list[tuple[str, str]]:
    """The twin table's columns; a predicted one's id ends in ``_pred`` (styled as a prediction)."""
    result = prediction.result
    base, treat, held = result.baseline_iw, result.treatment_iw, result.compare_arm
    columns = [
        ("bucket", "path min RTT"),
        ("paths", "paths"),
        ("fit_measured", f"measured IW{treat} over IW{base} [95 % CI]"),
        ("fit_pred", f"IW{treat}: {TWIN_NAME}"),
        ("fit_overlap", "intervals overlap"),
    ]
    if held is not None:
        columns += [
            ("held_measured", f"measured {arm_name(held)} (held out)"),
            ("held_pred", f"{arm_name(held)}: {TWIN_NAME}"),
            ("held_overlap", "intervals overlap"),
        ]
    columns += [(f"arm{arm}_pred", f"{arm_name(arm)}: {TWIN_NAME}") for arm in result.what_if if arm != held]
    return columns


def twin_rows(prediction: TwinPredictionOut) -> list[dict[str, Any]]:
    rows = []
    result = prediction.result
    for bucket in sorted(result.buckets, key=lambda entry: entry.order):
        row: dict[str, Any] = {
            "bucket": bucket.bucket,
            "paths": bucket.paths,
            "fit_measured": _estimate(bucket.fit.measured),
            "fit_pred": _estimate(bucket.fit.twin),
            "fit_overlap": _overlap(bucket.fit.overlap),
        }
        if bucket.held_out is not None:
            row |= {
                "held_measured": _estimate(bucket.held_out.measured),
                "held_pred": _estimate(bucket.held_out.predicted),
                "held_overlap": _overlap(bucket.held_out.overlap),
            }
        row |= {f"arm{arm}_pred": _estimate(estimate) for arm, estimate in bucket.predicted.items()}
        rows.append(row)
    return rows


def twin_style(columns: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Every predicted column (id ending in ``_pred``) in the prediction's colour and italics."""
    predicted = [column for column, _ in columns if column.endswith("_pred")]
    return [{"if": {"column_id": predicted}, "fontStyle": "italic", "color": PREDICTION_COLOUR}]


def twin_line(prediction: TwinPredictionOut, filters_campaign: tuple[int, ...]) -> str:
    result = prediction.result
    which = "" if filters_campaign == (prediction.campaign_id,) else " (the newest stored twin: choose a campaign for its own)"
    return (
        f"Lab twin of campaign {prediction.campaign_id}{which}: twin prediction {prediction.id}, stored "
        f"{prediction.created_at:%Y-%m-%d %H:%M} UTC, twin campaign {result.twin_campaign_id}. Fit (IW{result.treatment_iw} "
        f"over IW{result.baseline_iw}): the intervals overlap on {prediction.fit_overlapping} of {prediction.fit_judged} "
        f"paths with both intervals ({prediction.paths} twins). Predictions, not measurements."
    )


@callback(
    Output(f"{PREFIX}-twin-graph", "figure"),
    Output(f"{PREFIX}-twin-table", "children"),
    Output(f"{PREFIX}-twin-status", "children"),
    *filter_inputs(PREFIX),
)
def update_twin(*values: Any) -> tuple[Any, ...]:
    filters, _ = page_filters(*values)
    prediction = read(twin_data, filters, cache=True)
    if isinstance(prediction, Nothing):
        return empty_figure(prediction.message), [], prediction.status_line()
    if prediction is None:
        chosen = filters.campaign_ids[0] if len(filters.campaign_ids) == 1 else "N"
        message = f"No lab twin stored for these filters: run iwscope lab twin --campaign {chosen}."
        return empty_figure(message), [], status(message)
    columns = twin_columns(prediction)
    return (
        twin_bucket_figure(prediction),
        data_table(
            f"{PREFIX}-twins", columns, twin_rows(prediction), "No twin bucket.", style_data_conditional=twin_style(columns)
        ),
        status(twin_line(prediction, filters.campaign_ids)),
    )


register_url_sync(PREFIX)
