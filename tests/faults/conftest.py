"""The fault suite's table in the terminal summary (also written to artifacts/faults.json)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

COLUMNS = (
    "trials_measured",
    "trials_stored",
    "lost",
    "duplicated",
    "observations_recorded",
    "observations_unjoined",
    "rollups_equal_rebuild",
    "down_s",
    "recover_s",
)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    suite = sys.modules.get("test_faults_campaign")  # imported by collection when the suite ran
    if suite is None or not suite.RESULTS:
        return
    terminalreporter.section("fault injection (artifacts/faults.json)")
    terminalreporter.write_line("fault     " + " ".join(f"{column:>22}" for column in COLUMNS))
    for name, row in suite.RESULTS.items():
        terminalreporter.write_line(f"{name:<9} " + " ".join(f"{str(row[column]):>22}" for column in COLUMNS))
