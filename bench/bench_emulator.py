"""Link emulator benchmark: `iwscope lab selftest` at 56 kbit/s .. 100 Mbit/s (70 ms, 1 % loss)
and a best-effort 1 Gbit/s rate run; prints a table, writes bench/results/emulator.json.

Run by hand as root (`make bench`); takes about 4 minutes (the 56 kbit/s loss count is slow).
The machine may be shared: the load average is recorded next to the figures.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from iwscope_lab.links import LinkSpec
from iwscope_lab.selftest import SelftestConfig, measure_rate, run_selftest
from iwscope_lab.topology import Host, Topology

RATES = [56e3, 1.2e6, 10e6, 100e6]
RESULTS = Path(__file__).resolve().parent / "results" / "emulator.json"


def main() -> None:
    rows = []
    for rate in RATES:
        load_before = os.getloadavg()[0]
        report = run_selftest(SelftestConfig(rtt_ms=70, rate_bps=rate, loss=0.01, duration_s=8))
        rows.append(
            {
                "rate_bps": rate,
                "load_avg_1min": load_before,
                **{k: report[k] for k in ("rtt", "rate", "loss", "emulator_timing", "checks")},
            }
        )
        rows[-1]["rtt"].pop("samples_ms", None)
        print(
            f"{rate / 1e6:>8.3f} Mbit/s  rtt p50 {report['rtt']['p50_ms']:.3f} p99 {report['rtt']['p99_ms']:.3f} "
            f"(expected {report['rtt']['expected_ms']:.3f})  rate {report['rate']['emulator_error']:+.3%}  "
            f"loss {report['loss']['lost']}/{report['loss']['sent']} in {report['loss']['interval_99']}  "
            f"cpu {report['rate']['emulator_cpu_percent']:.1f}%  load {load_before:.1f}",
            flush=True,
        )
    # 1 Gbit/s best effort: what one TCP flow gets through the emulator, and its CPU use.
    topo = Topology(
        None,
        [
            Host("origin", role="origin", link=LinkSpec.symmetric()),
            Host("probe", link=LinkSpec.symmetric(rate_bps=1e9, rtt_ms=2)),
        ],
    )
    with topo:
        gigabit = measure_rate(topo, "origin", "probe", 4.0, warmup_s=1.0)
    print(
        f"1 Gbit/s best effort: delivered {gigabit['emulator_delivered_bps'] / 1e6:.1f} Mbit/s, "
        f"cpu {gigabit['emulator_cpu_percent']:.1f}%"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "selftests": rows, "gigabit": gigabit},
            indent=2,
            default=str,
        )
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
