#!/usr/bin/env bash
# Benchmarks, run by hand: each bench/*.py prints its figures and writes bench/results/*.json.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(.venv/bin/iwscope services start | sed 's/^/export /')"
mkdir -p bench/results
for b in bench/bench_*.py; do
  echo "== $b"
  .venv/bin/python "$b"
done
