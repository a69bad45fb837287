"""Coverage of the paired interval's two methods on the test suite's synthetic campaigns.

Usage::

    .venv/bin/python bench/coverage_paired.py --paths 25,60,200,1000 --replications 1000

For each path count G, ``--replications`` campaigns are drawn with
``tests/analysis/test_paired.py``'s generator (path RTTs lognormal, median 80 ms, sigma 1;
heavy-tailed trial noise; rare 1 s RTOs), reduced to roll-up cells (path x size octave) as the
product stores them, and three 95 % intervals of the paired improvement are built from the same
per-path sums: the bootstrap-t with the t floor (2000 replicates), its analytic counterpart
(the Edgeworth-corrected t with the t floor, ``paired._edgeworth_bounds``) and the plain t
interval.  Prints and writes (``--output``) the share of intervals that cover the generator's
true effect, in ms and in percent, and the median widths.  The bootstrap is skipped above
``--bootstrap-max`` paths (its cost grows as replicates x paths).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

import numpy as np

from iwscope.analysis import paired
from iwscope.analysis.stats import t_quantile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "analysis"))
sys.path.insert(0, str(REPO / "tests"))
import test_paired as generator  # noqa: E402 -- after its path; the suite's generator: one home for the truth


def t_bounds(numer: np.ndarray, denom: np.ndarray) -> tuple[float, float]:
    units = numer.size
    theta = float(numer.sum() / denom.sum())
    resid = numer - theta * denom
    se = math.sqrt(units / (units - 1) * float(resid @ resid)) / float(denom.sum())
    q = t_quantile(0.975, units - 1)
    return theta - q * se, theta + q * se


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--paths", default="25,60,200,1000")
    parser.add_argument("--replications", type=int, default=1000)
    parser.add_argument("--bootstrap-max", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=20261124)
    parser.add_argument("--output", default=str(REPO / "artifacts" / "coverage_paired.json"))
    args = parser.parse_args(argv)
    effect_ms, effect_pct = generator.true_effect()
    rng = np.random.default_rng(args.seed)
    rows = []
    for n_paths in (int(value) for value in args.paths.split(",")):
        started = time.perf_counter()
        bounds: dict[str, list[tuple[float, float, float, float]]] = {"bootstrap-t": [], "edgeworth": [], "t": []}
        for replication in range(args.replications):
            campaign = generator.simulate(rng, n_paths)
            cells = generator.cells_of(campaign.path, campaign.size, campaign.treatment, campaign.latency_ms)
            stats = paired.cell_path_stats(cells)
            n, d, b = stats.n_pairs, stats.sum_diff_ms, stats.sum_base_ms
            if n_paths <= args.bootstrap_max:
                interval = paired.paired_interval(n, d, b, seed=replication, analytic_min_units=1 << 62)
                assert interval is not None
                bounds["bootstrap-t"].append((interval.abs_low, interval.abs_high, interval.pct_low, interval.pct_high))
            interval = paired.paired_interval(n, d, b, analytic_min_units=2)
            assert interval is not None
            bounds["edgeworth"].append((interval.abs_low, interval.abs_high, interval.pct_low, interval.pct_high))
            ms, pct = t_bounds(d, n), t_bounds(d, b)
            bounds["t"].append((ms[0], ms[1], 100 * pct[0], 100 * pct[1]))
        row: dict[str, object] = {
            "paths": n_paths,
            "replications": args.replications,
            "seconds": round(time.perf_counter() - started, 1),
        }
        for method, values in bounds.items():
            if not values:
                continue
            array = np.array(values)
            cover_ms = (array[:, 0] <= effect_ms) & (effect_ms <= array[:, 1])
            cover_pct = (array[:, 2] <= effect_pct) & (effect_pct <= array[:, 3])
            row[method] = {
                "cover_ms": round(100 * float(cover_ms.mean()), 1),
                "cover_pct": round(100 * float(cover_pct.mean()), 1),
                "truth_above_ms": round(100 * float((effect_ms > array[:, 1]).mean()), 1),
                "width_ms": round(float(np.median(array[:, 1] - array[:, 0])), 2),
                "width_pct": round(float(np.median(array[:, 3] - array[:, 2])), 3),
            }
        rows.append(row)
        print(json.dumps(row), flush=True)
    output = pathlib.Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"effect_ms": effect_ms, "effect_pct": effect_pct, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
