"""The spool: durable before upload, survives SIGKILL, bounded, resumes rounds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from iwprobe import wire
from iwprobe._spool import Spool, SpoolFull
from iwprobe._upload import backoff_delay

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services


def _trial(index: int) -> dict:
    return {"trial_id": wire.new_id(), "index": index}


def test_records_leave_only_when_acknowledged(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path / "s.sqlite"))
    for index in range(7):
        record = _trial(index)
        spool.add("trial", record["trial_id"], record)
    spool.add("observation", wire.new_id(), {"x": 1})
    batch = spool.pending(("trial",), limit=5, max_body_bytes=1 << 20)
    assert [record["index"] for _, _, record in batch] == [0, 1, 2, 3, 4]
    assert spool.backlog(("trial",)) == 7
    spool.acknowledge([seq for seq, _, _ in batch[:3]])
    assert spool.backlog(("trial",)) == 4
    assert [record["index"] for _, _, record in spool.pending(("trial",), 10, 1 << 20)] == [3, 4, 5, 6]
    # The same record id twice is stored once (a retried store after a crash).
    again = spool.pending(("trial",), 1, 1 << 20)[0][2]
    spool.add("trial", again["trial_id"], again)
    assert spool.backlog(("trial",)) == 4
    spool.close()
    reopened = Spool(str(tmp_path / "s.sqlite"))
    assert reopened.backlog(("trial",)) == 4 and reopened.backlog(("observation",)) == 1


def test_pending_respects_the_body_bound(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path / "s.sqlite"))
    for index in range(10):
        spool.add("trial", wire.new_id(), {"pad": "x" * 1000, "index": index})
    assert len(spool.pending(("trial",), 100, max_body_bytes=3500)) == 3


def test_bound_reached_refuses_new_records_and_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool(str(tmp_path / "s.sqlite"), max_bytes=256 * 1024)
    stored = 0
    with pytest.raises(SpoolFull, match="reached its bound"):
        for _ in range(10_000):
            spool.add("trial", wire.new_id(), {"pad": "y" * 2000})
            stored += 1
    assert 50 < stored < 200
    assert "SPOOL FULL" in caplog.text
    # Acknowledged records free their pages, and the spool takes records again.
    spool.acknowledge([seq for seq, _, _ in spool.pending(("trial",), 5000, 1 << 30)])
    spool.add("trial", wire.new_id(), {"pad": "z"})
    assert spool.backlog() == 1


def test_round_progress_is_committed_with_the_trial(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path / "s.sqlite"))
    plan = [["o", "h", 3, 8003, 9000], ["o", "h", 10, 8010, 9000]]
    spool.start_round(5, 0, plan)
    spool.add("trial", "t-1", {"trial_id": "t-1"}, round_key=(5, 0, 1))
    state = spool.round_state(5)
    assert state[0][0] == plan and state[0][1] == 1 and state[0][2] is None
    spool.finish_round(5, 0)
    assert spool.round_state(5)[0][2] is not None


def test_rejected_records_are_kept_aside(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path / "s.sqlite"))
    spool.add("trial", "bad", {"trial_id": "bad"})
    seq = spool.pending(("trial",), 1, 1 << 20)[0][0]
    spool.reject(seq, "422: trial_id is not a uuid")
    assert spool.backlog() == 0 and spool.rejected_count() == 1


def test_sigkill_loses_nothing_committed(tmp_path: Path) -> None:
    """A writer killed with SIGKILL: every record it reported as stored is in the spool."""
    path = tmp_path / "killed.sqlite"
    writer = textwrap.dedent(f"""
        import sys
        from iwprobe._spool import Spool
        spool = Spool({str(path)!r})
        for index in range(100000):
            spool.add("trial", "t-%d" % index, {{"index": index}})
            print(index, flush=True)
    """)
    process = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    reported = -1
    deadline = time.monotonic() + 20
    while reported < 200 and time.monotonic() < deadline:
        reported = int(process.stdout.readline())
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    process.stdout.close()
    spool = Spool(str(path))
    stored = spool.pending(("trial",), 100000, 1 << 30)
    indexes = [record["index"] for _, _, record in stored]
    assert reported >= 200
    assert indexes == list(range(len(indexes)))  # no gaps, no duplicates
    assert len(indexes) >= reported + 1
    spool.close()


def test_backoff_is_exponential_with_full_jitter() -> None:
    import random

    rng = random.Random(1)
    for attempt in range(8):
        values = [backoff_delay(attempt, 1.0, 60.0, rng) for _ in range(400)]
        bound = min(60.0, 2.0**attempt)
        assert all(0.0 <= value <= bound for value in values)
        assert max(values) > 0.8 * bound  # full jitter spans the whole range
