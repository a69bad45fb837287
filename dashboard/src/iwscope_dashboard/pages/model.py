"""Model vs measured: per RTT bucket and per path, the measured improvement beside what the model
with loss predicts from the path's own estimates, and the paths that stand out."""

from __future__ import annotations

from typing import Any

import dash
from dash import Output, callback, html

from iwscope.analysis import ModelFit, PathModelFit
from iwscope_dashboard.figures import empty_figure
from iwscope_dashboard.filterbar import filter_inputs, filters_from_page_query, register_url_sync
from iwscope_dashboard.modelfigures import PREDICTION_NAME, bucket_fit_figure, path_fit_figure
from iwscope_dashboard.pagedata import model_data
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
            "predicted": f"{fmt_ms(bucket.predicted_ms)}{_pct(bucket.predicted_pct)}" if bucket.predicted_ms is not None else "-",
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
    ("predicted", f"{PREDICTION_NAME}"),
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
                    f"IW{arm.iw}: {fmt_ms(arm.measured_mean_ms)} vs {fmt_ms(arm.predicted_mean_ms)}" for arm in path.arms if arm.n
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
    ("arms", "mean latency: measured vs model"),
    ("verdict", "verdict"),
    ("why", "what the trials show"),
]

#: Predicted columns in the prediction's colour and italics, odd rows tinted.
PREDICTION_STYLE: list[dict[str, Any]] = [
    {"if": {"column_id": "predicted"}, "fontStyle": "italic", "color": "#7b3fa0"},
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


register_url_sync(PREFIX)
