"""Check what `make demo` left: the answer's numbers from the API and the pages in headless Chromium.

    .venv/bin/python bench/demo_check.py [--campaign N] [--out bench/results/demo.json]

Reads the running demo stack (``.run/stack.json``): for the newest ``demo`` campaign (or
``--campaign``), ``GET /api/v1/analysis/compare`` by RTT and bandwidth (IW10 vs IW3): every
bucket's pairs, paths and 95 % interval, and whether the lower bound is above zero. Then opens
the Overview, Latency, Sizes, Cost and IW-in-the-wild pages in headless Chromium and records how many
data points each figure draws and the lowest latency any latency figure draws (whisker
included); checks that the Real users page refuses an anonymous read (401) and draws its table
and figures after signing in with the demo's read token (``.run/read-token``); compares the
campaign's trials as Parquet with its CSV, cell by cell. Prints a JSON report and writes it to
``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from typing import Any

import httpx

from iwscope_lab.stack import Stack

REPO = pathlib.Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: page -> graphs; graphs of latencies (ms) whose drawn minimum must not be below zero are starred.
PAGES: dict[str, tuple[str, ...]] = {
    "/": ("overview-rtt-graph", "overview-bandwidth-graph", "overview-bdp-graph"),
    "/latency": ("*latency-iw-graph", "latency-cdf-graph"),
    "/sizes": ("sizes-improvement-graph", "*sizes-means-graph"),
    "/cost": ("cost-bulk-graph",),
    "/wild": ("wild-census-graph",),
}
TRACES_JS = """
(id) => {
    const plot = document.querySelector('#' + id + ' .js-plotly-plot');
    if (!plot || !plot.data) { return null; }
    const v = (a) => a ? Array.from(a, (x) => (typeof x === 'number' ? x : null)) : [];
    return plot.data.map((t) => ({n: (t.x || t.lon || []).length, y: v(t.y),
                                  minus: t.error_y ? v(t.error_y.symmetric === false ? t.error_y.arrayminus
                                                                                    : t.error_y.array) : []}));
}
"""


def compare(api: str, campaign: int, dimension: str) -> list[dict[str, Any]]:
    answer = httpx.get(
        f"{api}/api/v1/analysis/compare",
        params={"campaign": campaign, "dimension": dimension, "base": 3, "treat": 10},
        timeout=60,
    )
    answer.raise_for_status()
    rows = []
    for row in answer.json()["data"]:
        rows.append(
            {
                "bucket": row["bucket"],
                "lower": row["lower"],
                "pairs": row["n_pairs"],
                "paths": row["n_paths"],
                "too_small": row["too_small"],
                "abs_ms": row["abs_ms"],
                "ci": [row["abs_ci_low"], row["abs_ci_high"]],
                "pct": row["pct"],
                "pct_ci": [row["pct_ci_low"], row["pct_ci_high"]],
                "method": row["method"],
                "clear_gain": bool(row["abs_ci_low"] is not None and row["abs_ci_low"] > 0),
            }
        )
    return rows


def pages(dashboard: str, campaign: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    report: dict[str, Any] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        for path, graphs in PAGES.items():
            query = "" if path in ("/cost", "/wild") else f"?campaign={campaign}"  # their own campaigns
            page.goto(dashboard.rstrip("/") + path + query)
            for graph in graphs:
                latency, graph_id = graph.startswith("*"), graph.lstrip("*")
                page.wait_for_function(
                    "(id) => { const p = document.querySelector('#' + id + ' .js-plotly-plot');"
                    " return !!(p && p.data && p.data.some((t) => (t.x || t.lon || []).length > 0)); }",
                    arg=graph_id,
                    timeout=60_000,
                )
                traces = page.evaluate(TRACES_JS, graph_id) or []
                entry: dict[str, Any] = {"points": sum(trace["n"] for trace in traces)}
                if latency:
                    drawn = [
                        y - (trace["minus"][i] if i < len(trace["minus"]) and trace["minus"][i] else 0.0)
                        for trace in traces
                        for i, y in enumerate(trace["y"])
                        if y is not None
                    ]
                    entry["lowest_drawn_ms"] = min(drawn) if drawn else None
                report[f"{path} {graph_id}"] = entry
            page.screenshot(path=str(REPO / "artifacts" / f"demo{path.replace('/', '-') or '-overview'}.png"), full_page=True)
        browser.close()
    return report


#: The Real users page's figures (a read token needed).
REAL_USERS_GRAPHS = ("realusers-rtt-graph", "realusers-days-graph", "realusers-sweep-graph")


def real_users(dashboard: str, token_path: pathlib.Path) -> dict[str, Any]:
    """The Real users page: 401 without a token; with the demo's read token (its sign-in form)
    the percentile table and every figure draw."""
    from playwright.sync_api import sync_playwright

    base = dashboard.rstrip("/")
    report: dict[str, Any] = {"anonymous_status": httpx.get(base + "/real-users", timeout=30).status_code}
    if not token_path.exists():
        report["error"] = f"no read token in {token_path}"
        return report
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(base + "/real-users/login")
        page.fill("#realusers-login-token", token_path.read_text().strip())
        page.click("#realusers-login-submit")
        page.goto(base + "/real-users")
        page.wait_for_selector("#realusers-percentiles table", timeout=60_000)
        report["percentile_table"] = page.inner_text("#realusers-percentiles")[:2000]
        for graph_id in REAL_USERS_GRAPHS:
            page.wait_for_function(
                "(id) => { const p = document.querySelector('#' + id + ' .js-plotly-plot');"
                " return !!(p && p.data && p.data.some((t) => (t.x || []).length > 0)); }",
                arg=graph_id,
                timeout=60_000,
            )
            traces = page.evaluate(TRACES_JS, graph_id) or []
            report[graph_id] = {"points": sum(trace["n"] for trace in traces)}
        page.screenshot(path=str(REPO / "artifacts" / "demo-real-users.png"), full_page=True)
        browser.close()
    return report


def parquet_vs_csv(api: str, campaign: int) -> dict[str, Any]:
    """The campaign's trials as Parquet and as CSV from the API: rows and mismatching cells."""
    import io

    import pyarrow.parquet as pq

    from iwscope.exports.columnar import csv_mismatches

    with httpx.Client(base_url=api, timeout=600) as client:
        table = pq.read_table(io.BytesIO(client.get(f"/api/v1/trials.parquet?campaign_id={campaign}").content))
        mismatches = csv_mismatches(table, client.get(f"/api/v1/trials.csv?campaign_id={campaign}").text)
    return {
        "rows": table.num_rows,
        "columns": table.num_columns,
        "mismatches": len(mismatches),
        "first_mismatches": mismatches[:5],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--campaign", type=int, default=None)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "demo.json"))
    args = parser.parse_args(argv)
    stack = Stack.attach()
    if stack is None or stack.dashboard_url is None:
        print("no running demo stack: run `make demo` first", file=sys.stderr)
        return 2
    campaign = args.campaign
    if campaign is None:
        campaigns = httpx.get(f"{stack.local_api_url}/api/v1/analysis/options", timeout=30).json()["data"]["campaigns"]
        demo = [int(identifier) for identifier, name in campaigns if str(name).startswith("demo ")]
        if not demo:
            print("no demo campaign yet: run `make demo` first", file=sys.stderr)
            return 2
        campaign = max(demo)
    (REPO / "artifacts").mkdir(exist_ok=True)
    report = {
        "campaign": campaign,
        "loadavg": os.getloadavg(),
        "rtt": compare(stack.local_api_url, campaign, "rtt"),
        "bandwidth": compare(stack.local_api_url, campaign, "bandwidth"),
        "pages": pages(stack.dashboard_url, campaign),
        "real_users": real_users(stack.dashboard_url, stack.run_dir / "read-token"),
        "parquet_vs_csv": parquet_vs_csv(stack.local_api_url, campaign),
    }
    rtt_from_50 = [row for row in report["rtt"] if (row["lower"] or 0) >= 50]
    bw_above_512k = [row for row in report["bandwidth"] if (row["lower"] or 0) >= 512e3]
    report["verdict"] = {
        "rtt_buckets_from_50ms": len(rtt_from_50),
        "rtt_buckets_from_50ms_with_clear_gain": sum(row["clear_gain"] for row in rtt_from_50),
        "bandwidth_buckets_above_512k": len(bw_above_512k),
        "bandwidth_buckets_above_512k_with_clear_gain": sum(row["clear_gain"] for row in bw_above_512k),
        "cost_bulk_points": report["pages"].get("/cost cost-bulk-graph", {}).get("points", 0),
        "census_points": report["pages"].get("/wild wild-census-graph", {}).get("points", 0),
        "real_users_anonymous_status": report["real_users"].get("anonymous_status"),
        "real_users_points": {graph: report["real_users"].get(graph, {}).get("points", 0) for graph in REAL_USERS_GRAPHS},
        "lowest_drawn_latency_ms": min(
            (entry["lowest_drawn_ms"] for entry in report["pages"].values() if entry.get("lowest_drawn_ms") is not None),
            default=None,
        ),
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
