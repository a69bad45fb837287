"""The uploader against an overloaded collector: 503 + ``Retry-After`` (what iwscope's API
answers when no database connection is free).  It keeps every record spooled, sends nothing
before ``Retry-After`` has passed (not even in the next ``drain`` call), and uploads once the
collector takes the batch."""

from __future__ import annotations

import email.utils
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from stubcollector import Answer, Post, StubCollector, accept_all, stub_collectors

from iwprobe import _upload, wire
from iwprobe._collector import MAX_RETRY_AFTER_S, CollectorClient, CollectorError, parse_retry_after
from iwprobe._spool import Spool
from iwprobe._upload import Uploader, retry_delay

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services


def _overloaded(busy: int, retry_after: str | None) -> Answer:
    """The first ``busy`` uploads 503 (with ``Retry-After: retry_after`` when given), then accepted."""

    def answer(stub: StubCollector, post: Post) -> tuple[int, dict[str, Any], dict[str, str]]:
        if len(stub.posts) <= busy:
            return (
                503,
                {"detail": "collector overloaded: retry later"},
                {} if retry_after is None else {"Retry-After": retry_after},
            )
        return accept_all(stub, post)

    return answer


def _accepted(collector: StubCollector, busy: int) -> list[str]:
    """The trial ids of the uploads the stub accepted (every one after the first ``busy``), in order."""
    return [trial["trial_id"] for post in collector.posts[busy:] for trial in post.body["trials"]]


def _arrivals(collector: StubCollector) -> list[float]:
    return [post.at for post in collector.posts]


@pytest.fixture
def collector_factory() -> Iterator[Any]:
    with stub_collectors() as start:
        yield lambda busy, retry_after: start(_overloaded(busy, retry_after))


class SleepRecorder:
    """Stands in for the ``time`` module inside ``iwprobe._upload``: every sleep the uploader asks
    for is recorded (and slept), so a test checks the waits it chose rather than a wall clock."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        time.sleep(seconds)

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


@pytest.fixture
def uploader_sleeps(monkeypatch: pytest.MonkeyPatch) -> SleepRecorder:
    recorder = SleepRecorder()
    monkeypatch.setattr(_upload, "time", recorder)
    return recorder


def _uploader(tmp_path: Path, url: str, records: int = 12) -> tuple[Uploader, list[str]]:
    spool = Spool(str(tmp_path / "spool.sqlite"))
    probe_id = wire.new_id()
    ids = []
    for index in range(records):
        trial_id = wire.new_id()
        spool.add("trial", trial_id, {"trial_id": trial_id, "probe_id": probe_id, "index": index})
        ids.append(trial_id)
    # A tiny backoff base: only Retry-After can make it wait long.
    return Uploader(spool, CollectorClient(url, "x.y"), "probe", probe_id, backoff_base_s=0.01), ids


def test_retry_after_is_parsed_as_seconds_or_http_date_and_clamped() -> None:
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after(" 7 ") == 7.0
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("99999999") == MAX_RETRY_AFTER_S
    for unreadable in (None, "", "soon", "nan"):
        assert parse_retry_after(unreadable) is None
    now = time.time()
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30, abs=1)
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past: at once
    error = CollectorError("busy", 503, None, retry_after_s=2.0)
    delays = [retry_delay(error, 0, 0.01, 60.0) for _ in range(200)]
    assert min(delays) >= 2.0 and max(delays) <= 3.0 and len(set(delays)) > 100  # jittered above it


def test_503_with_retry_after_is_waited_out_and_the_spool_kept(
    collector_factory, tmp_path: Path, uploader_sleeps: SleepRecorder
) -> None:
    collector = collector_factory(busy=2, retry_after="1")
    uploader, ids = _uploader(tmp_path, collector.url)
    assert uploader.drain(deadline=time.monotonic() + 30) is True
    arrivals = _arrivals(collector)
    assert len(arrivals) == 3
    gaps = [later - earlier for earlier, later in zip(arrivals, arrivals[1:], strict=False)]
    assert all(gap >= 1.0 for gap in gaps), gaps  # without Retry-After: ~0.01-0.02 s
    # One wait per 503, each at most Retry-After plus its 50 % jitter (not up to the deadline).
    assert len(uploader_sleeps.sleeps) == 2 and all(0 < sleep <= 1.5 for sleep in uploader_sleeps.sleeps), uploader_sleeps.sleeps
    assert _accepted(collector, 2) == ids and uploader.backlog() == 0


def test_retry_after_beyond_the_deadline_returns_at_once_and_nothing_is_sent_early(
    collector_factory, tmp_path: Path, uploader_sleeps: SleepRecorder
) -> None:
    collector = collector_factory(busy=1, retry_after="3")
    uploader, ids = _uploader(tmp_path, collector.url)
    assert uploader.drain(deadline=time.monotonic() + 1.0) is False
    assert uploader_sleeps.sleeps == []  # returned after the 503: did not sleep until the deadline
    assert len(_arrivals(collector)) == 1 and uploader.backlog() == len(ids)
    # The next round's drain comes before Retry-After has passed: nothing is sent.
    assert uploader.drain(deadline=time.monotonic() + 1.0) is False
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    assert uploader.drain(stop=stop) is False
    assert len(_arrivals(collector)) == 1 and uploader.backlog() == len(ids)
    # Without a deadline it waits Retry-After out (3-4.5 s after the 503), then uploads.
    assert uploader.drain() is True
    assert _arrivals(collector)[1] - _arrivals(collector)[0] >= 3.0
    assert len(uploader_sleeps.sleeps) == 1 and uploader_sleeps.sleeps[0] <= 4.5, uploader_sleeps.sleeps
    assert _accepted(collector, 1) == ids and uploader.backlog() == 0


def test_503_without_retry_after_backs_off_as_before(collector_factory, tmp_path: Path, uploader_sleeps: SleepRecorder) -> None:
    collector = collector_factory(busy=3, retry_after=None)
    uploader, ids = _uploader(tmp_path, collector.url)
    assert uploader.drain(deadline=time.monotonic() + 30) is True
    assert len(_arrivals(collector)) == 4
    # The plain exponential backoff of the 0.01 s base (full jitter), nothing Retry-After-like.
    sleeps = uploader_sleeps.sleeps
    assert len(sleeps) == 3 and all(sleep <= 0.01 * 2**attempt for attempt, sleep in enumerate(sleeps)), sleeps
    assert _accepted(collector, 3) == ids and uploader.not_before == 0.0
