"""Coverage of the within-path interval (fewer paths than the cluster bootstrap needs).

Usage::

    .venv/bin/python bench/coverage_within_path.py --replications 400

Each replication draws a small campaign: ``--paths`` paths x 2 size strata, each cell's two arms
with ``--trials`` trials apiece from a lognormal around the path's RTT-shaped latency plus rare
1 s RTOs (heavy right tail); the treatment arm is faster by a fixed share.  The cells are binned
into the product's latency histograms and ``paired.within_path_interval`` gives the 95 %
interval; it covers when it holds the true stratified difference of expected means.  Run twice:
with the cells' replicate means drawn as their normal where the rule allows
(``stats.POISSON_NORMAL_*``) and bin by bin everywhere.  Prints and writes (``--output``) the
coverage, the median width and the time per interval.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import time

import numpy as np

from iwscope.analysis import buckets as bk
from iwscope.analysis import paired, stats

REPO = pathlib.Path(__file__).resolve().parents[1]
RTO_MS = 1000.0


def draw_cells(
    rng: np.random.Generator, paths: int, trials: int, sigma: float, rto_share: float, gain: float
) -> tuple[paired.Cells, float]:
    """One campaign's cells and the true stratified difference (baseline - treatment, ms)."""
    keys, n, sums, hists, truths = [], [], [], [], []
    for path in range(paths):
        rtt = float(rng.lognormal(math.log(80.0), 0.8))
        for stratum in range(2):
            median = rtt * (2 + stratum)
            cell = []
            for factor in (1.0, 1.0 - gain):
                mu = math.log(median * factor)
                latency = rng.lognormal(mu, sigma, trials) + RTO_MS * (rng.random(trials) < rto_share)
                counts = np.bincount([bk.hist_bin(value) for value in (latency * 1000.0).tolist()], minlength=bk.HIST_BINS)
                cell.append((float(latency.sum()), counts, math.exp(mu + sigma * sigma / 2) + RTO_MS * rto_share))
            keys.append(path)
            n.append(trials)
            sums.append((cell[0][0], cell[1][0]))
            hists.append((cell[0][1], cell[1][1]))
            truths.append(cell[0][2] - cell[1][2])
    counts = np.array(n, dtype=np.float64)
    cells = paired.Cells(
        path=np.array(keys),
        n_base=counts,
        sum_base_ms=np.array([s[0] for s in sums]),
        n_treat=counts.copy(),
        sum_treat_ms=np.array([s[1] for s in sums]),
        hist_base=np.array([h[0] for h in hists]),
        hist_treat=np.array([h[1] for h in hists]),
    )
    # equal trials per arm: the stratified estimate weighs the cells by their trials
    return cells, float(np.average(truths, weights=counts))


def run(args: argparse.Namespace, normal: bool) -> dict[str, float]:
    saved = stats.POISSON_NORMAL_MIN_TRIALS
    stats.POISSON_NORMAL_MIN_TRIALS = saved if normal else math.inf  # type: ignore[assignment]
    try:
        rng = np.random.default_rng(args.seed)
        covered, widths, seconds, normal_cells, all_cells = 0, [], [], 0, 0
        for _ in range(args.replications):
            cells, truth = draw_cells(rng, args.paths, args.trials, args.sigma, args.rto_share, args.gain)
            for hists in (cells.hist_base, cells.hist_treat):
                assert hists is not None
                normal_cells += sum(stats.draws_as_normal(hist) for hist in hists) if normal else 0
                all_cells += len(hists)
            started = time.perf_counter()
            interval = paired.within_path_interval(cells)
            seconds.append(time.perf_counter() - started)
            assert interval is not None
            covered += interval.abs_low <= truth <= interval.abs_high
            widths.append(interval.abs_high - interval.abs_low)
    finally:
        stats.POISSON_NORMAL_MIN_TRIALS = saved
    return {
        "coverage": covered / args.replications,
        "median_width_ms": statistics.median(widths),
        "median_ms_per_interval": 1000.0 * statistics.median(seconds),
        "share_of_cell_arms_drawn_as_normal": normal_cells / all_cells,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--replications", type=int, default=400)
    parser.add_argument("--paths", type=int, default=4)
    parser.add_argument("--trials", type=int, default=4000, help="trials per arm and cell")
    parser.add_argument("--sigma", type=float, default=0.3, help="lognormal sigma of a cell's latencies")
    parser.add_argument("--rto-share", type=float, default=0.005, help="share of trials with a 1 s RTO")
    parser.add_argument("--gain", type=float, default=0.2, help="treatment's latency reduction (share)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output", type=pathlib.Path, default=REPO / "artifacts" / "coverage_within_path.json")
    args = parser.parse_args()
    report = {
        "args": {key: value for key, value in vars(args).items() if key != "output"},
        "normal_where_allowed": run(args, normal=True),
        "bin_by_bin": run(args, normal=False),
    }
    for name in ("normal_where_allowed", "bin_by_bin"):
        row = report[name]
        print(
            f"{name:<22} coverage {row['coverage']:.3f}  median width {row['median_width_ms']:.2f} ms  "
            f"{row['median_ms_per_interval']:.1f} ms per interval, "
            f"{100 * row['share_of_cell_arms_drawn_as_normal']:.0f} % of cell arms drawn as a normal"
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
