#!/usr/bin/env bash
# `make lint`: ruff over the repository (rules in ruff.toml), the formatter's check (`ruff format
# --check`: run `.venv/bin/ruff format .` to apply it) and mypy --strict over the probe, the
# collector, the dashboard and the lab (settings in their pyproject.toml). Exits non-zero on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
echo "== ruff"
.venv/bin/ruff check . || status=1
echo "== ruff format --check"
.venv/bin/ruff format --check . || status=1
for package in probe collector dashboard lab; do
  echo "== mypy ($package)"
  (cd "$package" && ../.venv/bin/mypy) || status=1
done
exit "$status"
