"""``iwprobe tap`` without a kernel: the arms' layout and nftables text, the first-response
tracker on synthetic packets, the capture filter, the client keys and the edge aggregates.

The same code against the kernel (marks, windows, the lease) is in test_iwprobe_tap_netns.py.
"""

from __future__ import annotations

import socket
import struct

import jsonschema
import pytest
from packets import CLIENT_V4, ipv4, ipv6, run_bpf, tcp_header, tcp_info_bytes

from iwprobe import wire
from iwprobe._passive_capture import ACK, FIN, SNAPLEN, SYN, FlowTable, filter_program
from iwprobe._sockdiag import ClosedConnection, _port_filter
from iwprobe._tap_budget import MIN_LISTEN_SHARE, DutyCycle
from iwprobe._tap_edge import Assignment, EdgeAggregator, Measured, PrefixKeyer, RegionMap, client_bytes
from iwprobe._tap_rules import TapPlan, arm_ranges

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services

PORT = 443
CLIENT_PORT = 40_000
MS = 1_000_000
MSS = 1460
OUT, IN = socket.PACKET_OUTGOING, socket.PACKET_HOST
SYN_OPTIONS = bytes([2, 4]) + struct.pack("!H", MSS) + bytes([1, 3, 3, 7])  # MSS 1460, window scale 7


def arms(*pairs: tuple[str, int]) -> list[wire.PassiveArm]:
    return [wire.PassiveArm(arm, share) for arm, share in pairs]


# --- the arms ------------------------------------------------------------------------------


def test_treated_arms_take_the_top_of_the_hash_range_in_order_and_the_default_arm_the_rest() -> None:
    ranges = arm_ranges(arms(("default", 9000), ("16", 500), ("32", 500)))
    assert [(arm.arm, arm.low, arm.high, arm.slot, arm.iw) for arm in ranges] == [
        ("default", 0, 8999, 0, None),
        ("32", 9000, 9499, 2, 32),
        ("16", 9500, 9999, 1, 16),
    ]
    # Growing the last-listed treated arm moves only default prefixes: 16 keeps its buckets.
    grown = {arm.arm: (arm.low, arm.high) for arm in arm_ranges(arms(("default", 7000), ("16", 500), ("32", 2500)))}
    assert grown["16"] == (9500, 9999) and grown["32"] == (7000, 9499) and grown["default"] == (0, 6999)


def test_a_study_without_a_default_arm_and_an_arm_with_no_share() -> None:
    ranges = arm_ranges(arms(("3", 5000), ("10", 5000), ("16", 0)))
    assert [(arm.arm, arm.low, arm.high) for arm in ranges] == [("10", 0, 4999), ("3", 5000, 9999)]
    with pytest.raises(ValueError, match="sum to 10000"):
        arm_ranges(arms(("default", 9000), ("16", 500)))


def _study(**changes: object) -> wire.PassiveStudy:
    study = wire.PassiveStudy(
        campaign_id=7,
        name="s",
        arms=arms(("default", 9000), ("16", 500), ("32", 500)),
        ports=[443, 80],
        prefix_v4=24,
        prefix_v6=48,
        assignment_seed=0xC0FFEE,
        starts_at="2026-11-26T00:00:00Z",
        ends_at="2026-11-27T00:00:00Z",
        sample_share=1.0,
    )
    for name, value in changes.items():
        setattr(study, name, value)
    return study


def test_the_nft_script_marks_syns_of_both_families_by_prefix_hash_while_the_lease_holds() -> None:
    plan = TapPlan.from_study(_study(), lease_s=7.5)
    script = plan.nft_script()
    assert script.startswith("add table inet iwscope_tap\ndelete table inet iwscope_tap\n")  # atomic replace
    mapping = "map { 9000-9499 : 0x7a102, 9500-9999 : 0x7a101 }"
    assert (
        f"tcp flags & (syn|ack) == syn tcp dport {{ 80, 443 }} meta nfproto ipv4 meta l4proto @alive "
        f"meta mark set jhash @nh,96,24 mod 10000 seed 0xc0ffee {mapping}"
    ) in script
    assert "tcp dport { 80, 443 } meta nfproto ipv6 meta l4proto @alive" in script
    assert "jhash @nh,64,48 mod 10000" in script
    assert script.rstrip().endswith("add element inet iwscope_tap alive { tcp timeout 7500ms }")
    assert plan.lease_script().count("alive { tcp") == 3  # add (exists or not), delete, add: a fresh timeout
    assert plan.rules() == [
        ("ipv4", 9101, 0x7A101, 22101),
        ("ipv4", 9102, 0x7A102, 22102),
        ("ipv6", 9101, 0x7A101, 22101),
        ("ipv6", 9102, 0x7A102, 22102),
    ]
    commands = plan.route_commands("ipv4", ["default via 10.0.0.1 dev eth0", "10.0.0.0/24 dev eth0 initrwnd 20"])
    assert [
        "ip",
        "-4",
        "route",
        "replace",
        "default",
        "via",
        "10.0.0.1",
        "dev",
        "eth0",
        "table",
        "22101",
        "initcwnd",
        "16",
    ] in commands
    # Only the IW changes: a route's own initrwnd stays as the operator set it.
    assert [
        "ip",
        "-4",
        "route",
        "replace",
        "10.0.0.0/24",
        "dev",
        "eth0",
        "initrwnd",
        "20",
        "table",
        "22102",
        "initcwnd",
        "32",
    ] in commands


def test_a_study_with_only_the_default_arm_installs_no_marking_rule() -> None:
    plan = TapPlan.from_study(_study(arms=arms(("default", 10000))))
    assert "jhash" not in plan.nft_script() and plan.rules() == []


# --- the first response, from headers ------------------------------------------------------


class Conversation:
    """Packets of one connection to the tracker, client 10.64.2.2:40000 -> server :443."""

    def __init__(self, family: str = "ipv4", client_port: int = CLIENT_PORT) -> None:
        self.table = FlowTable([PORT, 80])
        self.family = family
        self.client_port = client_port
        self.client_seq = 1000
        self.server_seq = 5_000_000

    def _ip(self, tcp: bytes, payload: int, data: bytes, from_client: bool) -> bytes:
        if self.family == "ipv4":
            source, destination = ("10.64.2.2", "10.64.1.2") if from_client else ("10.64.1.2", "10.64.2.2")
            return ipv4(tcp, payload, source=source, destination=destination, data=data)
        source, destination = ("fd00::2", "fd00::1") if from_client else ("fd00::1", "fd00::2")
        return ipv6(tcp, payload, source=source, destination=destination, data=data)

    def client(
        self,
        at_ms: float,
        flags: int = ACK,
        payload: int = 0,
        data: bytes = b"",
        window: int = 502,
        seq: int | None = None,
        kind: int = IN,
        ack: int | None = None,
    ) -> None:
        """A client packet acknowledging ``ack`` (default: everything the server sent)."""
        options = SYN_OPTIONS if flags & SYN else b""
        sequence = self.client_seq if seq is None else seq
        acknowledged = (self.server_seq if ack is None else ack) if flags & ACK else 0
        tcp = tcp_header(self.client_port, PORT, sequence, acknowledged, flags, window, options)
        self.table.packet(self._ip(tcp, payload, data[:2], True), int(at_ms * MS), kind)
        if seq is None:
            self.client_seq += payload + (1 if flags & (SYN | FIN) else 0)

    def server(self, at_ms: float, flags: int = ACK, payload: int = 0, kind: int = OUT) -> None:
        tcp = tcp_header(PORT, self.client_port, self.server_seq, self.client_seq, flags, 500)
        self.table.packet(self._ip(tcp, payload, b"", False), int(at_ms * MS), kind)
        self.server_seq += payload + (1 if flags & (SYN | FIN) else 0)

    def ack(self, at_ms: float, upto: int) -> None:
        """The client acknowledges server bytes up to ``upto`` (absolute sequence)."""
        tcp = tcp_header(self.client_port, PORT, self.client_seq, upto, ACK, 502)
        self.table.packet(self._ip(tcp, 0, b"", True), int(at_ms * MS), IN)

    def handshake(self, rtt_ms: float = 100.0) -> None:
        self.client(0, SYN)
        self.server(0.01, SYN | ACK)
        self.client(rtt_ms)

    def result(self):  # type: ignore[no-untyped-def]
        address = "10.64.2.2" if self.family == "ipv4" else "fd00::2"
        packed = client_bytes(socket.AF_INET if self.family == "ipv4" else socket.AF_INET6, address)
        return self.table.pop(packed, self.client_port, PORT)


def serve(conversation: Conversation, at_ms: float, total: int, window: int, rtt_ms: float) -> float:
    """Slow start from ``window`` segments until ``total`` bytes are acknowledged; returns the
    time of the last ACK.  Each round's ACK covers the whole round."""
    sent = 0
    now = at_ms
    while sent < total:
        burst = min(total - sent, window * MSS)
        for offset in range(0, burst, MSS):
            conversation.server(now + 0.001 * offset / MSS, payload=min(MSS, burst - offset))
        sent += burst
        now += rtt_ms
        conversation.ack(now, conversation.server_seq)
        window *= 2
    return now


@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_plain_http_response_latency_runs_from_the_request_to_the_last_ack(family: str) -> None:
    talk = Conversation(family)
    talk.handshake(rtt_ms=100)
    talk.client(100.2, payload=120, data=b"GET / HTTP/1.1")
    end = serve(talk, 100.5, 30_000, window=10, rtt_ms=100)  # 30 KB at IW10: two rounds
    talk.client(end + 5000, FIN)
    result = talk.result()
    assert result.tls is False and result.exchanges == 1
    assert result.response_latency_us == pytest.approx((end - 100.2) * 1000, abs=1)
    assert end - 100.2 == pytest.approx(200.3, abs=0.01)
    assert result.response_bytes == 30_000
    assert (result.first_flight_segments, result.first_flight_bytes) == (10, 10 * MSS)
    assert result.handshake_rtt_us == 100_000 and result.client_rwnd_bytes == 502 << 7 and result.mss == MSS
    assert not result.syn_retrans and not result.reused_after_idle


def test_the_arm_shows_in_the_first_flight_and_the_latency() -> None:
    latencies = {}
    for iw in (3, 10, 32):
        talk = Conversation()
        talk.handshake()
        talk.client(100, payload=100, data=b"GE")
        latencies[iw] = serve(talk, 100, 40_000, window=iw, rtt_ms=100) - 100
        result = talk.result()
        assert result.first_flight_segments == min(iw, -(-40_000 // MSS)), iw
        assert result.response_latency_us == latencies[iw] * 1000
    assert latencies == {3: 400, 10: 200, 32: 100}  # rounds of 100 ms: 3+6+12+24, 10+20, 28


def test_keep_alive_after_idle_is_flagged_and_the_first_response_kept() -> None:
    talk = Conversation()
    talk.handshake()
    talk.client(100, payload=100, data=b"GE")
    end = serve(talk, 100, 5000, window=10, rtt_ms=100)
    talk.client(end + 1500, payload=100, data=b"GE")  # next request after 1.5 s idle
    serve(talk, end + 1500, 50_000, window=10, rtt_ms=100)
    result = talk.result()
    assert result.exchanges == 2 and result.reused_after_idle
    assert result.response_latency_us == 100_000 and result.response_bytes == 5000


def test_client_data_while_the_response_is_in_flight_belongs_to_it() -> None:
    """HTTP/2: SETTINGS ACK or WINDOW_UPDATE from the client while the server sends."""
    talk = Conversation()
    talk.handshake()
    talk.client(100, payload=200, data=b"PR")
    start = talk.server_seq
    talk.server(100.1, payload=MSS)
    talk.client(150, payload=9, data=b"\x00\x00", ack=start)  # a control frame, the response unacknowledged
    for index in range(9):
        talk.server(150.1 + index * 0.001, payload=MSS)
    talk.ack(300, talk.server_seq)
    result = talk.result()
    assert result.exchanges == 1 and result.response_latency_us == 200_000 and result.response_bytes == 10 * MSS


def test_a_retransmitted_request_does_not_start_an_exchange() -> None:
    talk = Conversation()
    talk.handshake()
    talk.client(100, payload=100, data=b"GE")
    talk.server(100.1, payload=2000)
    talk.ack(200, talk.server_seq)
    talk.client(250, payload=100, data=b"GE", seq=1001)  # the request again (a spurious retransmission)
    result = talk.result()
    assert result.exchanges == 1 and result.response_latency_us == 100_000


def test_https_handshake_then_the_first_request_nothing_decrypted() -> None:
    talk = Conversation()
    talk.handshake(rtt_ms=50)
    talk.client(50, payload=517, data=b"\x16\x03")  # ClientHello
    talk.server(50.2, payload=MSS)
    talk.server(50.3, payload=2600)  # a GSO super-packet: 2 segments
    talk.ack(100.2, talk.server_seq)  # the whole flight acknowledged
    talk.client(100.3, payload=80, data=b"\x14\x03")  # CCS + Finished (TLS 1.3)
    talk.client(100.4, payload=300, data=b"\x17\x03")  # the request
    talk.server(100.6, payload=500)  # session tickets
    talk.server(100.7, payload=8000)  # the response
    talk.ack(150.7, talk.server_seq)
    result = talk.result()
    assert result.tls is True and result.exchanges == 2
    assert result.handshake_us == 50_200 and result.response_latency_us == 50_400
    assert result.response_bytes == 8500
    assert (result.first_flight_segments, result.first_flight_bytes) == (3, MSS + 2600)


def test_tls12_second_handshake_leg_is_not_the_response() -> None:
    talk = Conversation()
    talk.handshake(rtt_ms=50)
    talk.client(50, payload=517, data=b"\x16\x03")
    talk.server(50.1, payload=3000)
    talk.ack(100, talk.server_seq)
    talk.client(100.1, payload=126, data=b"\x16\x03")  # ClientKeyExchange, CCS, Finished
    talk.server(100.2, payload=51)
    talk.ack(150.1, talk.server_seq)
    talk.client(150.2, payload=300, data=b"\x17\x03")  # the request
    talk.server(150.3, payload=4000)
    talk.ack(200.3, talk.server_seq)
    result = talk.result()
    assert result.exchanges == 3 and result.handshake_us == 50_000
    assert result.response_latency_us == 50_100 and result.response_bytes == 4000


@pytest.mark.parametrize("repeat", ["syn", "syn-ack"])
def test_a_repeated_syn_or_syn_ack_flags_the_connection(repeat: str) -> None:
    talk = Conversation()
    talk.client(0, SYN)
    if repeat == "syn":
        talk.client(1000, SYN, seq=1000)
    talk.server(1000.1, SYN | ACK)
    if repeat == "syn-ack":
        talk.server_seq -= 1
        talk.server(2000.1, SYN | ACK)
    talk.client(2100)
    assert talk.result().syn_retrans


def test_loopback_copies_and_other_ports_are_ignored() -> None:
    talk = Conversation()
    talk.handshake()
    talk.client(100, payload=100, data=b"GE")
    talk.server(100.1, payload=1000)
    talk.server(100.1, payload=1000, kind=IN)  # the loopback copy of a server packet
    talk.client(100.2, payload=50, kind=OUT)  # the loopback copy of a client packet
    talk.ack(200, talk.server_seq - 1000)
    result = talk.result()
    assert result.response_bytes == 1000 and result.exchanges == 1
    other = Conversation(client_port=41_000)
    other.table = FlowTable([8080])
    other.handshake()
    assert other.result() is None


def test_a_connection_joined_mid_way_is_not_followed() -> None:
    talk = Conversation()
    talk.client(100, payload=100, data=b"GE")
    talk.server(100.1, payload=1000)
    assert talk.result() is None


# --- the kernel filters --------------------------------------------------------------------


@pytest.mark.parametrize(("client_port", "kept"), [(0x9C40, True), (0x9C41, False), (0x9C48, False), (0x9C50, True)])
def test_the_capture_filter_follows_a_share_of_client_ports_both_ways(client_port: int, kept: bool) -> None:
    program = filter_program([80, 443], mask=0xF)
    for packet in (
        ipv4(tcp_header(client_port, 443, 1, 1, ACK, 9)),
        ipv4(tcp_header(80, client_port, 1, 1, ACK, 9)),
        ipv6(tcp_header(client_port, 80, 1, 1, ACK, 9)),
        ipv6(tcp_header(443, client_port, 1, 1, ACK, 9)),
    ):
        assert run_bpf(program, packet) == (SNAPLEN if kept else 0)
    assert run_bpf(program, ipv4(tcp_header(client_port, 8080, 1, 1, ACK, 9))) == 0
    assert run_bpf(filter_program([80, 443], mask=0), ipv4(tcp_header(client_port, 443, 1, 1, ACK, 9))) == SNAPLEN


def test_the_kernel_accepts_both_filters() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        from iwprobe._capture import _attach_filter

        _attach_filter(sock, filter_program(list(range(1, 17)), 0xFF))
        _attach_filter(sock, _port_filter([80, 443]))


def test_the_destroy_filter_reads_the_local_port_of_the_netlink_message() -> None:
    message = struct.pack("=IHHII", 100, 20, 0, 0, 0) + bytes([2, 7, 0, 0]) + struct.pack("!HH", 443, 50_000)
    assert run_bpf(_port_filter([80, 443]), message) == 0xFFFFFFFF
    assert run_bpf(_port_filter([80]), message) == 0


# --- client keys, regions, aggregates ------------------------------------------------------


def test_prefix_keys_hide_the_address_keep_a_prefix_together_and_depend_on_the_server_key() -> None:
    keyer = PrefixKeyer(bytes(range(32)), 24, 48)
    one = keyer.hash(keyer.prefix(socket.inet_aton("192.0.2.10")))
    assert one == keyer.hash(keyer.prefix(socket.inet_aton("192.0.2.200")))
    assert one != keyer.hash(keyer.prefix(socket.inet_aton("192.0.3.10")))
    assert len(one[0]) == 16 and int(one[0], 16) >= 0 and 0 <= one[1] < wire.PASSIVE_CLUSTER_GROUPS
    assert one != PrefixKeyer(bytes(range(1, 33)), 24, 48).hash(keyer.prefix(socket.inet_aton("192.0.2.10")))
    v6 = socket.inet_pton(socket.AF_INET6, "2001:db8:1234:5678::1")
    assert keyer.prefix(v6) == v6[:6]
    assert PrefixKeyer(bytes(32), 20, 48).prefix(socket.inet_aton("192.0.255.1")) == bytes([192, 0, 0xF0])
    assert client_bytes(socket.AF_INET6, "::ffff:192.0.2.10") == socket.inet_aton("192.0.2.10")
    with pytest.raises(ValueError):
        PrefixKeyer(b"short", 24, 48)


def test_the_region_map_takes_the_longest_prefix(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "regions.csv"
    path.write_text("# prefix,region,country\n100.64.0.0/10,south-america,BR\n100.64.1.0/24,africa,ug\n2001:db8::/32,europe,DE\n")
    regions = RegionMap.from_csv(str(path))
    for address, expected in (
        ("100.64.1.7", ("africa", "UG")),
        ("100.64.2.7", ("south-america", "BR")),
        ("192.0.2.1", ("", "")),
        ("2001:db8::1", ("europe", "DE")),
    ):
        packed = socket.inet_pton(socket.AF_INET6 if ":" in address else socket.AF_INET, address)
        assert regions.lookup(packed[:3] + bytes([len(address)]), packed) == expected, address
    with pytest.raises(ValueError, match="two-letter"):
        RegionMap([("10.0.0.0/8", "x", "BRA")])


def _measured(
    study: wire.PassiveStudy, address: str, latency_us: int | None, rwnd: int = 64_000, closed_ns: int = 1_795_705_000 * 10**9
) -> tuple[Measured, Assignment]:
    from iwprobe._passive_capture import FirstResponse

    assignment = Assignment(study, TapPlan.from_study(study).arms, 10)
    keyer = PrefixKeyer(bytes(32), 24, 48)
    packed = socket.inet_aton(address)
    prefix = keyer.prefix(packed)
    arm = assignment.arm_of(prefix)
    first = (
        None
        if latency_us is None
        else FirstResponse(tls=False, response_latency_us=latency_us, response_bytes=20_000, client_rwnd_bytes=rwnd, mss=MSS)
    )
    closed = ClosedConnection(
        closed_ns,
        socket.AF_INET,
        "10.64.1.2",
        443,
        address,
        40_000,
        7,
        tcp_info_bytes(
            {
                "min_rtt": 120_000,
                "delivery_rate": 250_000,
                "bytes_acked": 20_400,
                "data_segs_out": 15,
                "total_retrans": 1,
                "bytes_retrans": 1460,
            }
        ),
    )
    hashed, cluster = keyer.hash(prefix)
    return Measured(closed, first, arm, arm.iw or 10, "europe", "DE", hashed, cluster, "ipv4"), assignment


def test_aggregates_merge_a_keys_connections_and_validate_against_the_wire_schema() -> None:
    study = _study(sample_share=1.0)
    aggregator = EdgeAggregator("0b0e4a36-8d0e-4c3d-9a55-3a1c3b7f0c11")
    for latency in (300_000, 310_000, None):
        measured, assignment = _measured(study, "198.51.100.7", latency)
        aggregator.add(measured, study, assignment.treated_share_bp)
    aggregates, samples = aggregator.flush()
    assert len(aggregates) == 1 and len(samples) == 3
    aggregate = aggregates[0]
    assert (aggregate["connections"], aggregate["responses"], aggregate["latency_sum_us"]) == (3, 2, 610_000)
    assert sum(count for _, count in aggregate["latency_hist"]) == 2
    assert aggregate["rtt_bucket"] == 3 and aggregate["bandwidth_bucket"] == 4 and aggregate["size_octave"] == 14
    assert aggregate["hour"] == "2026-11-26T14:00:00.000000Z" and aggregate["treated_share_bp"] == 1000
    assert (aggregate["retrans_connections"], aggregate["total_retrans"], aggregate["data_segs_out"]) == (3, 3, 45)
    schema = wire.load_schema()
    for name, records in (("PassiveAggregate", aggregates), ("PassiveConnection", samples)):
        validator = jsonschema.Draft202012Validator({**schema, "$ref": f"#/$defs/{name}"})
        for record in records:
            validator.validate(record)
    assert all("198.51" not in str(value) for record in samples for value in record.values())
    assert aggregator.flush() == ([], [])


def test_a_receive_window_below_the_arms_first_flight_marks_the_connection_biased() -> None:
    study = _study(arms=arms(("32", 10000)), sample_share=0.0)
    aggregator = EdgeAggregator("0b0e4a36-8d0e-4c3d-9a55-3a1c3b7f0c11")
    for rwnd in (64_000, 29_200):  # 32 x 1460 = 46,720 bytes
        measured, assignment = _measured(study, "203.0.113.9", 250_000, rwnd=rwnd)
        aggregator.add(measured, study, assignment.treated_share_bp)
    aggregates, samples = aggregator.flush()
    assert samples == []
    biased = {aggregate["biased"]: aggregate["rwnd_limited"] for aggregate in aggregates}
    assert biased == {True: 1, False: 0}


def test_the_field_reader_agrees_with_the_full_parse() -> None:
    import random

    from iwprobe._tcpinfo import FieldReader, parse_tcp_info

    names = ("min_rtt", "delivery_rate", "bytes_acked", "data_segs_out", "total_retrans", "bytes_retrans", "rtt")
    reader = FieldReader(names)
    rng = random.Random(7)
    for length in (0, 100, 160, 232, 248, 260):
        for _ in range(50):
            raw = bytes(rng.randrange(256) for _ in range(length))
            if rng.random() < 0.2:
                raw = b"\xff" * length
            info = parse_tcp_info(raw)
            assert reader.read(raw) == tuple(info.get(name) for name in names), length
    with pytest.raises(ValueError, match="snd_wscale"):
        FieldReader(("snd_wscale",))


# --- the close budget ------------------------------------------------------------------------


def _drive(duty: DutyCycle, rate_per_s: float, seconds: float, step_s: float = 0.001) -> tuple[float, int]:
    """Closes arrive at ``rate_per_s``; those while listening are counted.  Returns (listened s, closes)."""
    now, listened, closes, owed = 0.0, 0.0, 0, 0.0
    listening = duty.listening(now)
    while now < seconds:
        now = round(now + step_s, 6)
        owed += rate_per_s * step_s if listening else 0.0
        arrived, owed = int(owed), owed - int(owed)
        listened += step_s if listening else 0.0
        closes += arrived
        listening = duty.listening(now)
        duty.account(now, listening, arrived)
        duty.adapt(now)
    return listened, closes


def test_over_its_budget_the_agent_listens_a_share_of_each_second_and_estimates_the_rest() -> None:
    duty = DutyCycle(1000, 0.0)
    listened, closes = _drive(duty, 10_000, 20.0)
    assert duty.share == pytest.approx(0.1, rel=0.05)
    # Once adapted, ~1,000 closes measured a second and ~9,000 estimated, not measured.
    assert 800 < closes / 20 < 2_000
    assert duty.unmeasured + closes == pytest.approx(200_000, rel=0.05)
    assert listened < 4.0


def test_the_default_budget_at_a_busy_servers_close_rate_is_measured_not_the_floor() -> None:
    """At 19,000 closes/s (one nginx core, one connection per request) the default budget of 50
    is above the listening floor: ~50 closes measured a second, not the ~190 a 1 % floor
    measured (four times the budget)."""
    duty = DutyCycle(50, 0.0)
    _, closes = _drive(duty, 19_000, 20.0, step_s=0.0005)
    assert duty.share == pytest.approx(50 / 19_000, rel=0.1) and duty.share > MIN_LISTEN_SHARE
    measured_per_s = (closes - 19_000) / 19  # the first second listens fully
    assert 30 < measured_per_s < 80


def test_under_its_budget_or_without_one_the_agent_listens_always() -> None:
    for budget, rate in ((1000, 500), (0, 50_000)):
        duty = DutyCycle(budget, 0.0)
        listened, closes = _drive(duty, rate, 5.0)
        assert duty.share == 1.0 and listened == pytest.approx(5.0) and duty.unmeasured == 0.0
        assert closes == pytest.approx(rate * 5, rel=0.01)


def test_the_share_comes_back_when_the_rate_falls() -> None:
    duty = DutyCycle(1000, 0.0)
    _drive(duty, 1_000_000, 5.0)
    assert duty.share == MIN_LISTEN_SHARE
    duty2 = DutyCycle(1000, 0.0)
    _drive(duty2, 5_000, 5.0)
    assert duty2.share < 0.5
    # The same object, fed a quiet period: it listens fully again within a few seconds.
    start = 5.0
    for step in range(1, 8001):
        now = start + step * 0.001
        listening = duty2.listening(now)
        duty2.account(now, listening, 0 if not listening or step % 10 else 1)  # 100/s
        duty2.adapt(now)
    assert duty2.share == 1.0


def test_over_its_traffic_budget_the_capture_opens_in_windows_that_admit_then_follow() -> None:
    from iwprobe._tap_budget import ADMIT_S, TAIL_S, CaptureWindows

    windows = CaptureWindows(20_000, 0.0)
    assert windows.state(0.0) == "closed"  # until the server's packet rate is known
    assert windows.admitting_share == 0.0  # the heartbeat's capture share: nothing yet
    states: dict[str, float] = {"admit": 0.0, "follow": 0.0, "closed": 0.0}
    step, seconds = 0.05, 6000
    for index in range(int(seconds / step)):
        now = index * step
        if index % 20 == 0:
            windows.observe(now, 200_000)  # ten times the budget
        states[windows.state(now)] += step
    assert windows.share == pytest.approx(0.1)
    open_s = states["admit"] + states["follow"]
    assert open_s / seconds == pytest.approx(0.1, abs=0.01)
    assert states["admit"] / open_s == pytest.approx(ADMIT_S / (ADMIT_S + TAIL_S), abs=0.02)
    # The long-run admitting share the heartbeat reports is the share of time spent admitting.
    assert windows.admitting_share == pytest.approx(states["admit"] / seconds, abs=0.005)
    quiet = CaptureWindows(20_000, 0.0)
    for second in range(30):
        quiet.observe(float(second), 5_000)
        assert quiet.state(second + 0.5) == "admit"
    assert quiet.admitting_share == 1.0
    unlimited = CaptureWindows(0, 0.0)
    unlimited.observe(0.0, 10**7)
    assert unlimited.state(1.0) == "admit"
    assert unlimited.admitting_share == 1.0


def test_a_capture_window_in_its_tail_follows_admitted_connections_and_admits_no_new_one() -> None:
    table = FlowTable([8080])
    syn = ipv4(tcp_header(40_000, 8080, 1000, 0, SYN, 65_535))
    table.packet(syn, 1, socket.PACKET_HOST)
    table.admitting = False
    table.packet(ipv4(tcp_header(40_002, 8080, 5000, 0, SYN, 65_535)), 2, socket.PACKET_HOST)
    assert list(table.flows) == [(socket.inet_aton(CLIENT_V4), 40_000, 8080)]
