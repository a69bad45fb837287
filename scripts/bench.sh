#!/usr/bin/env bash
# Benchmarks, run by hand: each bench/*.py prints its figures and writes bench/results/*.json.
set -euo pipefail
cd "$(dirname "$0")/.."
services=$(.venv/bin/iwscope services start)   # set -e: stop here if they cannot start
eval "$(sed 's/^/export /' <<<"$services")"
mkdir -p bench/results
for b in bench/bench_*.py; do
  echo "== $b"
  .venv/bin/python "$b"
done
echo "== probe cost (CPU per 1,000 trials, RSS, probe vs origin timing)"
eval "$(sed 's/^/export IWSCOPE_TEST_/' <<<"$services")"
IWPROBE_BENCH=1 .venv/bin/pytest tests/probe/test_iwprobe_bench.py -q -s -p no:cacheprovider
