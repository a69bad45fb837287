"""Check what `make demo` left: the answer's numbers from the API and the pages in headless Chromium.

    .venv/bin/python bench/demo_check.py [--campaign N] [--out bench/results/demo.json]

Reads the running demo stack (``.run/stack.json``): for the newest ``demo`` campaign (or
``--campaign``), ``GET /api/v1/analysis/compare`` by RTT and bandwidth (IW10 vs IW3): every
bucket's pairs, paths and 95 % interval, and whether the lower bound is above zero. Then opens
the Overview, Latency, Sizes, Cost and IW-in-the-wild pages in headless Chromium and records how many
data points each figure draws (counted by the page check, ``iwscope_dashboard.pagecheck``) and
the lowest latency any latency figure draws (whisker included); checks that the Real users page
refuses an anonymous read (401) and draws its table and figures after signing in with the demo's
read token (``.run/read-token``); compares the
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

from iwscope_dashboard.pagecheck import CHROMIUM, CHROMIUM_ARGS, PAGES, check_page
from iwscope_lab.stack import Stack

REPO = pathlib.Path(__file__).resolve().parents[1]
#: The pages read with the demo campaign's filter, and those read whole (their own campaigns).
CAMPAIGN_PAGES = ("/", "/latency", "/sizes")
OWN_CAMPAIGN_PAGES = ("/cost", "/wild")
#: Figures of latencies (ms) whose lowest drawn point must not be below zero.
LATENCY_GRAPHS = ("latency-iw-graph", "sizes-means-graph")
#: The Real users page (a read token needed).
REAL_USERS = next(spec for spec in PAGES if spec.reader)
#: JavaScript: per trace of a figure, its y values and lower error bars.
LOWS_JS = """
(id) => {
    const plot = document.querySelector('#' + id + ' .js-plotly-plot');
    if (!plot || !plot.data) { return null; }
    const v = (a) => a ? Array.from(a, (x) => (typeof x === 'number' ? x : null)) : [];
    return plot.data.map((t) => ({y: v(t.y),
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


def lowest_drawn(page: Any, graph_id: str) -> float | None:
    """The lowest point a figure draws: each y minus its lower error bar."""
    traces = page.evaluate(LOWS_JS, graph_id) or []
    drawn = [
        y - (trace["minus"][i] if i < len(trace["minus"]) and trace["minus"][i] else 0.0)
        for trace in traces
        for i, y in enumerate(trace["y"])
        if y is not None
    ]
    return min(drawn) if drawn else None


def points(page: Any, dashboard: str, spec: Any, query: str = "") -> dict[str, dict[str, Any]]:
    """The page check on one page (the tab stays there): points per figure (rows per table)."""
    return {
        count.item: {"points": count.points, **({} if count.found else {"found": False})}
        for count in check_page(page, dashboard, spec, query=query)
    }


def pages(dashboard: str, campaign: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    report: dict[str, Any] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS), headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        for spec in PAGES:
            if spec.path not in CAMPAIGN_PAGES + OWN_CAMPAIGN_PAGES:
                continue
            query = f"campaign={campaign}" if spec.path in CAMPAIGN_PAGES else ""
            for graph_id, entry in points(page, dashboard, spec, query).items():
                if graph_id in LATENCY_GRAPHS:
                    entry["lowest_drawn_ms"] = lowest_drawn(page, graph_id)
                report[f"{spec.path} {graph_id}"] = entry
            name = spec.path.replace("/", "-") if spec.path != "/" else "-overview"
            page.screenshot(path=str(REPO / "artifacts" / f"demo{name}.png"), full_page=True)
        browser.close()
    return report


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
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS), headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(base + "/real-users/login")
        page.fill("#realusers-login-token", token_path.read_text().strip())
        page.click("#realusers-login-submit")
        report |= points(page, base, REAL_USERS)  # signed in: the cookie is the tab's
        page.wait_for_selector("#realusers-percentiles table", timeout=60_000)
        report["percentile_table"] = page.inner_text("#realusers-percentiles")[:2000]
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
        "real_users_points": {item.name: report["real_users"].get(item.name, {}).get("points", 0) for item in REAL_USERS.items},
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
