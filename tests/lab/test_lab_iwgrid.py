"""Must-show of the client-side IW inference work: the probe's inference against lab servers of known IW.

``iwscope_lab.iwgrid`` builds one lab ``Topology`` (a server behind a zero-delay link, a probe
at 60 ms RTT, 100 Mbit/s), sets the server's route ``initcwnd`` and a locked path MTU per cell,
toggles the server device's segmentation offload (GSO, the kernel's software TSO: the TUN's
hardware TSO is fixed off) and runs the real ``iwprobe census --json`` in the probe's
namespace against real servers (real kernel TCP both ends, the lab's emulated link).

* The full grid: IW 1, 2, 3, 4, 10, 16, 32, 64 x MSS 536, 1220, 1460 x GSO on/off x HTTP
  (Python's ``http.server``) and HTTPS (the same behind TLS with a 16 KB chain): every cell
  correct -- ``ok`` exactly the IW, ``lower_bound`` never above it -- and so is every
  connection's own inference; ``undetermined`` cells are counted with their reasons.
* Servers nobody here wrote, Python's ``http.server`` and Debian's lighttpd, at initcwnd 4, 10,
  16 and 32 (HTTP, MSS 1460, GSO on and off): exactly ``ok`` with that IW.  lighttpd missing is
  a failure (``scripts/setup.sh`` installs it), not a skip.

The summaries are printed and written to ``artifacts/iwgrid-*.json`` (every cell).
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from iwscope_lab import iwgrid

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
#: Census connections per cell (the MSS ladder adds more): one keeps the 96 cells at ~75 s of
#: the suite; every connection is judged on its own anyway (``attempts_wrong``), and runs with
#: 2 and 3 per cell gave the same 96/96 (docs/probe.md).
GRID_CONNECTIONS = 1
SERVER_IWS = (4, 10, 16, 32)
#: Reasons that say the census itself could not run (not an inference's answer).
BROKEN = ("census failed", "fetch_failed", "no_capture")


def _report(name: str, cells: list[iwgrid.Cell], seconds: float) -> dict[str, Any]:
    summary = {**iwgrid.summary(cells), "wall_seconds": round(seconds, 1)}
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"{name}.json").write_text(json.dumps({"summary": summary, "cells": [asdict(c) for c in cells]}, indent=1))
    print(f"{name}: {json.dumps(summary)}")
    for cell in cells:
        if cell.status != "ok" or not cell.correct:
            print(
                f"  {cell.server} IW {cell.iw} MSS {cell.path_mss} GSO {'on' if cell.tso else 'off'}: "
                f"{cell.status} {cell.iw_segments} {cell.reason} (announced MSS {cell.announced_mss})"
                f"{'' if cell.correct else ' WRONG'}"
            )
    return summary


def _describe(cells: list[iwgrid.Cell]) -> str:
    return "; ".join(
        f"{c.server} IW {c.iw} MSS {c.path_mss} GSO {c.tso}: {c.status} {c.iw_segments} "
        f"({c.reason}, {c.attempts_wrong} connections wrong)"
        for c in cells
    )


def test_the_inference_is_never_wrong_on_the_lab_grid(run_id: str) -> None:
    started = time.monotonic()
    cells = iwgrid.run_grid(
        iwgrid.IWS, iwgrid.MSS_VALUES, iwgrid.TSO, iwgrid.PROTOCOLS, connections=GRID_CONNECTIONS, name=run_id
    )
    summary = _report("iwgrid-lab", cells, time.monotonic() - started)

    expected = set(itertools.product(iwgrid.PROTOCOLS, (1, 2, 3, 4, 10, 16, 32, 64), (536, 1220, 1460), (True, False)))
    assert {(c.server, c.iw, c.path_mss, c.tso) for c in cells} == expected
    assert len(cells) == 96
    broken = [c for c in cells if c.reason.startswith(BROKEN)]
    assert not broken, f"the census could not run: {_describe(broken)}"
    wrong = [c for c in cells if not c.correct]
    assert not wrong, f"wrong inferences: {_describe(wrong)}"
    assert summary["correct"] == 96 and summary["connections_wrong"] == 0
    # The undetermined cells are reported with their reasons, never dropped from the count.
    undetermined = [c for c in cells if c.status == "undetermined"]
    assert summary["undetermined"] == len(undetermined)
    assert sum(summary["undetermined_reasons"].values()) == len(undetermined)
    assert sum(summary["status"].values()) == 96
    # Every cell's census really measured: each ran its connections, and (a clean path) the
    # grid is not passed by saying nothing -- undetermined or bounds stay exceptions.
    assert all(c.connections >= GRID_CONNECTIONS for c in cells)
    assert summary["status"].get("ok", 0) >= 0.9 * len(cells), summary


def test_servers_nobody_here_wrote_get_their_iw_exactly(run_id: str) -> None:
    servers = ["http", "lighttpd"]
    missing = [name for name in servers if name not in iwgrid.available_servers()]
    assert not missing, f"{missing} not installed: run scripts/setup.sh (it installs lighttpd, not started)"
    started = time.monotonic()
    cells = iwgrid.run_grid(SERVER_IWS, (1460,), iwgrid.TSO, servers, connections=3, name=run_id)
    _report("iwgrid-servers", cells, time.monotonic() - started)

    assert {(c.server, c.iw, c.tso) for c in cells} == set(itertools.product(servers, SERVER_IWS, (True, False)))
    not_exact = [c for c in cells if (c.status, c.iw_segments) != ("ok", c.iw) or not c.correct]
    assert not not_exact, f"not exactly the configured IW: {_describe(not_exact)}"
    # The answer is the server's own MSS-sized segments (no smaller MSS announced was needed).
    assert {(c.mss, c.announced_mss) for c in cells} == {(1448, None)}
