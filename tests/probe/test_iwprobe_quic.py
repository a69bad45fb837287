"""HTTP/3 in the probe: the first-flight rules on datagram logs seen in real runs, and aioquic's
client and the origin's arms over loopback (no root, no namespace).

The logs below were recorded by ``iwprobe fetch --quic`` in the lab (100 ms RTT): the origin's
IW 10 arm acknowledged (aioquic paces its flight over 42 ms), Caddy (quic-go, 1,252-byte
datagrams, one 1,352-byte MTU probe, a last datagram that crosses the window) unacknowledged.
tests/lab/test_lab_quic.py checks the same rules against tcpdump and servers nobody here wrote.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from iwprobe import wire
from iwprobe._census_quic import combine_quic, h3_port
from iwprobe._quic_flight import acknowledged_flight, withheld_flight

#: The origin's IW 10 arm, acknowledged: (µs, way, bytes) from the request on.
ACKED_IW10 = [
    (0, "out", 1200), (105100, "in", 1200), (106973, "out", 1200), (107189, "in", 1200), (107443, "out", 48),
    (107575, "in", 187), (111356, "out", 357), (111841, "out", 108),
    (237893, "in", 259), (242341, "out", 41), (243377, "in", 1200), (243967, "in", 1200), (245913, "in", 1200),
    (247862, "out", 33), (248065, "in", 1200), (258422, "in", 1200), (258948, "in", 1200), (260753, "out", 33),
    (271854, "in", 1200), (272568, "in", 1200), (285014, "in", 1200), (285578, "in", 941),
    # the server's answer to the ACK of 242.3 ms: 105 ms later, 11.7 ms sooner than the request's answer
    (347466, "in", 518), (347913, "in", 33), (351356, "in", 1200), (351703, "in", 1200), (353582, "in", 1200),
]  # fmt: skip
ACKED_REQUEST_US = 111841


def _quic_go_withheld() -> list[tuple[int, str, int]]:
    """Caddy 2.6 (quic-go), no ACK from the client: 1,252-byte datagrams, an MTU probe, stream
    boundaries (710, 707, 472), a crossing last datagram, then two PTO probes 200 ms later."""
    log = [(0, "out", 1200), (2000, "in", 1252), (6000, "in", 215), (7000, "out", 32), (9000, "out", 62)]
    sizes = [1352, 1252, 51, 1252, 1252, 710] + [1252] * 23 + [707, 1252, 1252, 1252, 472, 1252]
    log += [(10_000 + 250 * index, "in", size) for index, size in enumerate(sizes)]
    return log + [(221_000, "in", 1252), (441_000, "in", 1252)]


def test_the_acknowledged_flight_ends_before_the_servers_answer_to_the_first_ack() -> None:
    flight = acknowledged_flight(ACKED_IW10, ACKED_REQUEST_US, response_done_us=640_000)
    assert (flight.status, flight.packets, flight.bytes, flight.max_datagram_size) == ("ok", 10, 12000, 1200)
    # the client's own round trip includes the server's processing; the path's (100 ms) is exact
    assert acknowledged_flight(ACKED_IW10, ACKED_REQUEST_US, 640_000, path_rtt_us=100_000).packets == 10
    # taken whole, the request's round trip (126 ms) would count the answer to the first ACK
    assert acknowledged_flight(ACKED_IW10, ACKED_REQUEST_US, 640_000, path_rtt_us=126_052).packets == 13


def test_a_response_that_ends_inside_the_window_is_a_lower_bound() -> None:
    short = [d for d in ACKED_IW10 if d[0] <= 258948]
    flight = acknowledged_flight(short, ACKED_REQUEST_US, response_done_us=258948)
    assert flight.status == "lower_bound" and flight.reason == "object_ended" and flight.packets == 6


def test_the_withheld_flight_reads_a_window_that_a_datagram_crossed() -> None:
    flight = withheld_flight(_quic_go_withheld(), request_us=9000, response_done_us=None)
    assert flight.status == "ok" and flight.max_datagram_size == 1252  # the MTU probe is not the size
    assert flight.packets == 32, flight  # 40,800 bytes: 32.6 windows of 1,252, crossed by the last


def test_an_aioquic_window_cut_to_its_remainder_counts_whole() -> None:
    # aioquic without ACKs: HTTP/3's SETTINGS (253 bytes) still in flight, the last datagram cut
    log = [(0, "out", 1200), (3000, "in", 1200), (3400, "in", 253), (5000, "out", 351)]
    log += [(105_000 + 200 * i, "in", 1200) for i in range(9)] + [(107_000, "in", 947)]
    # the server's ACK of the client's QPACK data, then its PTO probe: neither is the window
    log += [(205_000, "in", 33), (300_000, "in", 1200)]
    flight = withheld_flight(log, request_us=5000, response_done_us=None)
    assert (flight.packets, flight.bytes, flight.datagrams) == (10, 11747, 10)


def test_nothing_after_the_request_is_undetermined() -> None:
    log = [(0, "out", 1200), (3000, "in", 1200), (5000, "out", 351)]
    # the reason goes on the wire as client_iw.reason: a sentence would get the whole batch refused
    pattern = wire.load_schema()["$defs"]["ClientIw"]["properties"]["reason"]["pattern"]
    for flight in (withheld_flight(log, 5000, None), acknowledged_flight(log, 5000, None)):
        assert flight.status == "undetermined" and flight.reason and re.search(pattern, flight.reason), flight


@pytest.mark.parametrize(
    "alt_svc, port",
    [
        ('h3=":443"; ma=86400', 443),
        ('h3-29=":8443", h3=":9443"', 9443),
        ('h3="other.example:443"', None),  # another host's window is not this server's
        ('h3="example.test:8443"', 8443),
        ('h2=":443"', None),
        ('h3=":99999"', None),
        ("", None),
    ],
)
def test_alt_svc_offers_http3_on_a_port_of_the_same_host(alt_svc: str, port: int | None) -> None:
    assert h3_port(alt_svc, "example.test") == port


def test_the_census_answer_is_what_the_connections_agree_on() -> None:
    def attempt(packets: int, status: str = "ok") -> dict[str, object]:
        flight = {"status": status, "packets": packets, "bytes": packets * 1200, "max_datagram_size": 1200, "rtt_us": 100_000}
        flight["reason"] = "object_ended" if status == "lower_bound" else ""
        return {"flight": flight, "http_status": 200, "error_kind": None, "error_detail": ""}

    agreed = combine_quic("https://x/", [attempt(10), attempt(10), attempt(10)])
    assert (agreed.status, agreed.iw_packets, agreed.connections_ok, agreed.rtt_ms) == ("ok", 10, 3, 100.0)
    assert combine_quic("https://x/", [attempt(10), attempt(32)]).reason == "inconsistent"
    bound = combine_quic("https://x/", [attempt(4, "lower_bound")])
    assert bound.status == "lower_bound" and bound.iw_packets == 4 and bound.reason == "object_ended"
    failed = combine_quic("https://x/", [{"flight": None, "error_kind": "timeout", "error_detail": "late", "http_status": None}])
    assert failed.status == "undetermined" and failed.reason == "fetch_failed" and "timeout" in failed.error


# --- over loopback ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from iwprobe._arms import parse_arms
    from iwprobe._quic_origin import QuicOrigin
    from iwscope_lab.certs import write_chain

    chain = write_chain(tmp_path_factory.mktemp("chain"), 2, ips=["127.0.0.1"])
    observations: list[dict[str, object]] = []
    server = QuicOrigin(
        parse_arms("3,10,32,10p"), ["127.0.0.1"], 18600, str(chain.chain_path), str(chain.key_path), observations.append
    )
    server.start()
    yield server, chain, observations
    server.stop()


@pytest.mark.parametrize("label", ["3", "10", "32", "10p"])
def test_an_unacknowledging_client_gets_exactly_the_arms_window(origin, label: str) -> None:  # type: ignore[no-untyped-def]
    from iwprobe._arms import parse_arm
    from iwprobe._quic import fetch_h3

    server, chain, _ = origin
    arm = parse_arm(label)
    url = f"https://127.0.0.1:{server.port(arm)}/obj/100000"
    result = fetch_h3(url, ca_file=str(chain.root_path), withhold_acks=True, timeout_s=5)
    assert result.error_kind is None and result.http_status == 200, result
    assert result.flight is not None and result.flight.status == "ok" and result.flight.packets == arm.iw, result.flight


def test_a_fetch_is_timed_and_the_origin_reports_it(origin) -> None:  # type: ignore[no-untyped-def]
    from iwprobe._arms import parse_arm
    from iwprobe._quic import fetch_h3

    server, chain, observations = origin
    result = fetch_h3(
        f"https://127.0.0.1:{server.port(parse_arm('10'))}/obj/50000",
        ca_file=str(chain.root_path),
        trial_id="5b0f3e52-4a39-4d5c-9d0c-2f1e0c6c9a11",
    )
    assert result.error_kind is None and result.body_bytes == 50000, result
    assert 0 < result.handshake_us < result.ttfb_us <= result.total_us  # type: ignore[operator]
    for _ in range(100):
        if any(o["trial_id"] == "5b0f3e52-4a39-4d5c-9d0c-2f1e0c6c9a11" for o in observations):
            break
        time.sleep(0.02)
    observation = next(o for o in observations if o["trial_id"] == "5b0f3e52-4a39-4d5c-9d0c-2f1e0c6c9a11")
    assert observation["arm"] == "10" and observation["arm_iw"] == 10 and observation["cwnd_at_response_bytes"] == 12000
    assert observation["object_bytes"] == 50000 and observation["response_us"] is not None, observation
    assert observation["port"] == server.port(parse_arm("10")) and observation["client_addr"] == "127.0.0.1"
    json.dumps(observation)


def test_a_fetch_and_its_report_become_wire_records_the_schema_accepts(origin) -> None:  # type: ignore[no-untyped-def]
    """Wire v9: the probe's QUIC trial and the origin's QUIC observation of it, as uploaded."""
    import jsonschema

    from iwprobe import wire
    from iwprobe._arms import parse_arm
    from iwprobe._quic import fetch_h3
    from iwprobe._quic_records import quic_observation, quic_trial

    server, chain, observations = origin
    trial_id = wire.new_id()
    url = f"https://127.0.0.1:{server.port(parse_arm('32'))}/obj/60000"
    fetched = fetch_h3(url, ca_file=str(chain.root_path), trial_id=trial_id)
    trial = quic_trial(
        fetched,
        trial_id=trial_id,
        probe_id=wire.new_id(),
        campaign_id=7,
        origin_id=wire.new_id(),
        round_number=0,
        arm_iw=32,
        arm="32q",
        object_size=60000,
        host="127.0.0.1",
    )
    for _ in range(100):
        if any(o["trial_id"] == trial_id for o in observations):
            break
        time.sleep(0.02)
    observation = quic_observation(next(o for o in observations if o["trial_id"] == trial_id), wire.new_id())
    assert observation is not None
    assert trial.protocol == observation.protocol == "quic" and trial.error_kind is None, trial
    assert trial.connect_us is None and trial.tcp_info == {} and trial.tls_version == "TLSv1.3" and trial.family == "ipv4"
    # on loopback ACKs return at once: the flights' counts are the lab's to check (test_lab_quic)
    assert trial.client_iw is not None and trial.client_iw.status in wire.IW_STATUSES, trial.client_iw
    assert observation.arm == "32q" and observation.snd_cwnd_at_accept == 32 and not observation.cwnd_mismatch
    assert observation.quic_first_flight_packets and observation.quic_max_datagram_size == 1200, observation
    assert observation.response_latency_us is not None and observation.object_size == 60000
    schema = wire.load_schema()
    for name, record in (("TrialRecord", trial), ("OriginObservation", observation)):
        validator = jsonschema.Draft202012Validator({**schema, "$ref": f"#/$defs/{name}"})
        assert not list(validator.iter_errors(wire.to_dict(record))), name
    # a request that named no trial has nothing to join: no observation
    assert quic_observation({**observations[-1], "trial_id": None}, wire.new_id()) is None


def test_bad_requests_get_http_errors(origin) -> None:  # type: ignore[no-untyped-def]
    from iwprobe._arms import parse_arm
    from iwprobe._quic import fetch_h3

    server, chain, _ = origin
    missing = fetch_h3(f"https://127.0.0.1:{server.port(parse_arm('10'))}/nothing", ca_file=str(chain.root_path), timeout_s=5)
    too_big = fetch_h3(
        f"https://127.0.0.1:{server.port(parse_arm('10'))}/obj/999999999999", ca_file=str(chain.root_path), timeout_s=5
    )
    assert (missing.http_status, too_big.http_status) == (404, 413)


def test_an_untrusted_certificate_is_an_error_not_an_exception(origin, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from iwprobe._arms import parse_arm
    from iwprobe._quic import fetch_h3
    from iwscope_lab.certs import write_chain

    server, _, _ = origin
    other = write_chain(tmp_path / "other", 2, ips=["127.0.0.1"])
    result = fetch_h3(f"https://127.0.0.1:{server.port(parse_arm('10'))}/obj/1000", ca_file=str(other.root_path), timeout_s=5)
    assert result.error_kind is not None and result.http_status is None, result


def test_the_tcp_origins_per_client_budgets_hold_over_http3(tmp_path: Path) -> None:
    """One client's requests and bytes count against the same budgets as over TCP (a 429 beyond
    them), and its connections are released when they close."""
    from iwprobe._arms import parse_arms
    from iwprobe._budgets import ClientBudgets
    from iwprobe._origin_config import OriginConfig
    from iwprobe._quic import fetch_h3
    from iwprobe._quic_origin import QuicOrigin
    from iwscope_lab.certs import write_chain

    chain = write_chain(tmp_path / "chain", 2, ips=["127.0.0.1"])
    config = OriginConfig(max_object_bytes=100_000)
    config.client_requests_per_s, config.client_request_burst = 0.001, 3
    config.client_bytes_per_s = 1.0  # the bucket holds 2 x the largest object: 200,000 bytes
    budgets = ClientBudgets(config)
    server = QuicOrigin(parse_arms("10"), ["127.0.0.1"], 18500, str(chain.chain_path), str(chain.key_path), lambda _: None)
    server.budgets = budgets
    server.start()
    try:
        url = f"https://127.0.0.1:{server.port(parse_arms('10')[0])}/obj/"
        statuses = [fetch_h3(url + "90000", ca_file=str(chain.root_path), timeout_s=5).http_status for _ in range(3)]
        assert statuses == [200, 200, 429]  # the third's 90,000 bytes no longer fit the byte bucket
        assert fetch_h3(url + "10", ca_file=str(chain.root_path), timeout_s=5).http_status == 429  # requests spent
        # aioquic ends a closed connection after its draining period (three probe timeouts)
        deadline = time.monotonic() + 10
        while any(budget.connections for budget in budgets._budgets.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [budget.connections for budget in budgets._budgets.values()] == [0]
    finally:
        server.stop()
