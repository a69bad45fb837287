"""The origin over HTTPS and on several addresses, over real kernel sockets in network namespaces.

The timing claims (a chain larger than the IW costs a round trip) are in
tests/lab/test_lab_tls_e2e.py; here: the handshake is measured on both sides, the first flight
counted exactly, every arm keeps its IW, TLS 1.2 and 1.3 and curl work, failures are named.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from iwprobe_testkit import PYTHON, NetnsPair, fetch_json, origin_process, read_observations

from iwscope_lab.certs import ChainInfo, write_chain

ARMS = [3, 10]
BASE_PORT = 8300
NAME = "origin.iwscope.test"


@pytest.fixture()
def chain(tmp_path: Path, netns_pair: NetnsPair) -> ChainInfo:
    return write_chain(tmp_path / "chain", 5, name=NAME, ips=[netns_pair.origin_address])


@pytest.fixture()
def https_origin(netns_pair: NetnsPair, chain: ChainInfo) -> Iterator[subprocess.Popen]:
    with origin_process(
        netns_pair,
        ARMS,
        BASE_PORT,
        "--bind",
        "127.0.0.1",
        "--tls-cert",
        str(chain.chain_path),
        "--tls-key",
        str(chain.key_path),
        "--request-timeout",
        "2",
        "--workers",
        "4",
    ) as process:
        yield process


def test_https_measures_the_handshake_on_both_sides_and_counts_the_first_flight(
    netns_pair: NetnsPair, https_origin: subprocess.Popen, chain: ChainInfo
) -> None:
    trials = {}
    for iw in ARMS:
        trial = fetch_json(
            netns_pair, f"https://{netns_pair.origin_address}:{BASE_PORT + iw}/obj/20000", "--ca-file", str(chain.root_path)
        )
        assert trial["error_kind"] is None, trial
        assert trial["tls_version"] == "TLSv1.3" and trial["family"] == "ipv4"
        assert 0 < trial["tls_handshake_us"] < trial["ttfb_us"] < trial["total_us"]
        assert trial["bytes_received"] > 20000
        trials[trial["trial_id"]] = iw
    observations = {item["trial_id"]: item for item in read_observations(https_origin, len(ARMS))}
    assert set(observations) == set(trials)
    for trial_id, iw in trials.items():
        seen = observations[trial_id]
        assert seen["snd_cwnd_at_accept"] == iw and not seen["cwnd_mismatch"], seen
        assert seen["tls_version"] == "TLSv1.3" and seen["family"] == "ipv4"
        # the first flight carries the whole chain (5 KB) and ServerHello .. Finished around it
        assert chain.chain_der_bytes < seen["tls_first_flight_bytes"] < chain.chain_der_bytes + 1500, seen
        assert 0 < seen["tls_flight_acked_us"] <= seen["tls_handshake_us"], seen
        assert seen["response_latency_us"] is not None and seen["http_status"] == 200


def test_curl_and_tls_1_2_are_served_and_failures_are_named(
    netns_pair: NetnsPair, https_origin: subprocess.Popen, chain: ChainInfo, tmp_path: Path
) -> None:
    url = f"https://{NAME}:{BASE_PORT + 10}/obj/3000"
    resolve = f"{NAME}:{BASE_PORT + 10}:{netns_pair.origin_address}"
    for extra in ((), ("--tls-max", "1.2")):
        curl = netns_pair.run(
            netns_pair.probe_ns,
            [
                "curl",
                "-sS",
                "-o",
                "/dev/null",
                "--resolve",
                resolve,
                "--cacert",
                str(chain.root_path),
                "-w",
                "%{http_code} %{size_download} %{time_appconnect}",
                *extra,
                url,
            ],
        )
        code, size, appconnect = curl.stdout.split()
        assert curl.returncode == 0 and code == "200" and size == "3000", (curl.stdout, curl.stderr)
        assert float(appconnect) > 0
    # a client that trusts another root refuses the chain: a named error, not an exception
    other = write_chain(tmp_path / "other", 2, name=NAME)
    refused = fetch_json(
        netns_pair, f"https://{netns_pair.origin_address}:{BASE_PORT + 3}/obj/1000", "--ca-file", str(other.root_path)
    )
    assert refused["error_kind"] == "tls" and "certificate" in refused["error_detail"].lower(), refused
    # plain HTTP to an HTTPS listener is closed at once, and the listener goes on serving
    plain = fetch_json(netns_pair, f"http://{netns_pair.origin_address}:{BASE_PORT + 3}/obj/1000")
    assert plain["error_kind"] in ("protocol", "reset"), plain
    again = fetch_json(
        netns_pair, f"https://{netns_pair.origin_address}:{BASE_PORT + 3}/obj/1000", "--ca-file", str(chain.root_path)
    )
    assert again["error_kind"] is None, again


def test_every_bound_address_serves_every_arm(netns_pair: NetnsPair, https_origin: subprocess.Popen, chain: ChainInfo) -> None:
    """--bind twice: the second address (the origin namespace's loopback) serves too."""
    fetched = netns_pair.run(
        netns_pair.origin_ns,
        [PYTHON, "-m", "iwprobe", "fetch", "--json", "--insecure", f"https://127.0.0.1:{BASE_PORT + 3}/obj/2000"],
    )
    trial = json.loads(fetched.stdout)
    assert trial["error_kind"] is None and trial["tls_version"], trial
    seen = read_observations(https_origin, 1)[0]
    assert seen["trial_id"] == trial["trial_id"] and seen["port"] == BASE_PORT + 3


def test_an_ipv6_only_origin_listens_on_ipv6_only(tmp_path: Path) -> None:
    """``--bind ::1`` alone: IPv6 clients are served, the IPv4 loopback is not (V6ONLY)."""
    from iwprobe._origin import Origin, OriginConfig

    config = OriginConfig(bind="::1", arms=[10], base_port=18700, set_marks=False, echo=False, workers=2)
    origin = Origin(config)
    origin.start()
    try:
        with socket.create_connection(("::1", 18710), timeout=2):
            pass
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", 18710), timeout=2):
            pass
    finally:
        origin.stop()
    with pytest.raises(ValueError, match="both"):
        Origin(OriginConfig(bind="::1", arms=[10], tls_cert=str(tmp_path / "chain.pem"), set_marks=False))


def test_an_origin_says_which_family_lacks_its_rules(caplog: pytest.LogCaptureFixture) -> None:
    """Marks no rule points at (an unused mark range): every IPv4 connection would get the default
    IW, and the origin says so when it starts (and its observations flag each connection)."""
    from iwprobe._origin import Origin, OriginConfig

    config = OriginConfig(bind="127.0.0.1", arms=[3], base_port=18750, echo=False, workers=1, mark_base=0x3F000, table_base=29000)
    origin = Origin(config)
    with caplog.at_level("WARNING", logger="iwprobe.origin"):
        origin.start()
    try:
        assert origin.missing_rules == ["ipv4"]
        assert any("ipv4: the arms' fwmark rules are missing" in record.getMessage() for record in caplog.records)
    finally:
        origin.stop()
