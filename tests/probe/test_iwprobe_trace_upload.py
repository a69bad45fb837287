"""Traces on their own path (wire v7): the probe's uploader sends them after every waiting
trial, as a :class:`wire.TraceBatch` the schema accepts, and keeps them aside -- never blocking
trials -- when the collector predates the traces route.  Which rounds are traced is a hash of
probe, campaign and round (:func:`iwprobe._trace.traced_round`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from stubcollector import Answer, Post, StubCollector, accept_all, stub_collectors

from iwprobe import wire
from iwprobe._capture import ACK, SYN, Packet
from iwprobe._collector import CollectorClient
from iwprobe._spool import Spool
from iwprobe._trace import Trace, traced_round
from iwprobe._upload import Uploader

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services

PROBE_ID = "0b6f7f3e-1d1c-4f0e-9a55-3f0d2b4c5a61"


def _answer(traces_route: bool) -> Answer:
    """Every batch accepted; without ``traces_route`` the traces path is a 404, as a collector
    before wire v7 answers it."""

    def answer(stub: StubCollector, post: Post) -> tuple[int, dict[str, Any], dict[str, str]]:
        if post.path == wire.TRACES_BATCH_PATH and not traces_route:
            return 404, {"detail": "Not Found"}, {}
        return accept_all(stub, post)

    return answer


@pytest.fixture
def collector_factory() -> Iterator[Any]:
    with stub_collectors() as start:
        yield lambda traces_route: start(_answer(traces_route))


def _trace(iw: int = 10, mss: int = 1448, rtt_ns: int = 100_000_000) -> dict[str, Any]:
    """A trace as the capture would give it: handshake, request, an IW ``iw`` first flight."""
    client, server = 1_000, 5_000
    packets = [
        Packet(0, True, client, 0, SYN, 0, 64240, 1460, 7),
        Packet(rtt_ns, False, server, client + 1, SYN | ACK, 0, 65160, 1460, 7),
        Packet(rtt_ns + 10_000, True, client + 1, server + 1, ACK, 0, 502),
        Packet(rtt_ns + 20_000, True, client + 1, server + 1, ACK, 120, 502),
    ]
    packets += [
        Packet(2 * rtt_ns + 20_000 + 100_000 * i, False, server + 1 + i * mss, client + 121, ACK, mss, 509) for i in range(iw)
    ]
    return Trace.from_packets(packets, rcv_mss=mss, min_rtt_us=rtt_ns // 1000).to_dict()


def _spooled(tmp_path: Path, trials: int) -> tuple[Spool, list[str]]:
    spool = Spool(str(tmp_path / "spool.sqlite"))
    trial_ids = []
    for _ in range(trials):
        trial_id = wire.new_id()
        trial_ids.append(trial_id)
        spool.add("trial", trial_id, {"trial_id": trial_id})
        record = wire.TraceRecord(trial_id, "receiver", wire.utc_timestamp(), _trace())
        spool.add("trace", f"{trial_id}:receiver", wire.to_dict(record))
    return spool, trial_ids


def _uploader(spool: Spool, url: str) -> Uploader:
    client = CollectorClient(url, credential="probe-credential")
    traces = Uploader(spool, client, "trace", PROBE_ID, backoff_base_s=0.01, backoff_cap_s=0.05)
    return Uploader(spool, client, "probe", PROBE_ID, backoff_base_s=0.01, backoff_cap_s=0.05, traces=traces)


def test_traces_follow_the_trials_on_their_own_path_as_the_schema_says(collector_factory: Any, tmp_path: Path) -> None:
    collector = collector_factory(traces_route=True)
    spool, trial_ids = _spooled(tmp_path, 3)
    uploader = _uploader(spool, collector.url)
    assert uploader.backlog() == 6  # the trials and their traces
    assert uploader.drain(deadline=None)
    paths = [post.path for post in collector.posts]
    assert paths == [wire.TRIALS_BATCH_PATH, wire.TRACES_BATCH_PATH]  # every trial first, then traces
    trials_body, traces_body = (post.body for post in collector.posts)
    assert "traces" not in trials_body and [t["trial_id"] for t in trials_body["trials"]] == trial_ids
    schema = wire.load_schema()
    validator = jsonschema.Draft202012Validator({**schema, "$ref": "#/$defs/TraceBatch"})
    validator.validate(traces_body)
    assert traces_body["agent_id"] == PROBE_ID and traces_body["wire_version"] == wire.WIRE_VERSION
    assert [t["trial_id"] for t in traces_body["traces"]] == trial_ids
    assert all(wire.check_trace(t["trace"]) == 14 for t in traces_body["traces"])  # 4 handshake/request + 10 data
    assert uploader.backlog() == 0 and spool.rejected_count() == 0


def test_a_collector_without_the_traces_route_gets_the_trials_and_the_traces_wait_aside(
    collector_factory: Any, tmp_path: Path
) -> None:
    collector = collector_factory(traces_route=False)
    spool, trial_ids = _spooled(tmp_path, 2)
    uploader = _uploader(spool, collector.url)
    assert uploader.drain(deadline=None)  # not stuck retrying a route that is not there
    assert [post.path for post in collector.posts] == [wire.TRIALS_BATCH_PATH, wire.TRACES_BATCH_PATH]
    assert uploader.backlog() == 0
    assert spool.rejected_count() == 2  # kept on disk, not lost


def test_the_traced_rounds_are_a_stable_share() -> None:
    assert not traced_round(PROBE_ID, 1, 0, 0.0) and traced_round(PROBE_ID, 1, 0, 1.0)
    rounds = range(4000)
    chosen = [number for number in rounds if traced_round(PROBE_ID, 7, number, 0.1)]
    assert 0.08 < len(chosen) / len(rounds) < 0.12  # binomial sd 0.0047: 4 sd either side
    assert chosen == [number for number in rounds if traced_round(PROBE_ID, 7, number, 0.1)]  # the same after a restart
    other_probe = [number for number in rounds if traced_round(wire.new_id(), 7, number, 0.1)]
    assert chosen != other_probe  # probes trace different rounds
