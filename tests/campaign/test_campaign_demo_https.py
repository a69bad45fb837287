"""``make demo``'s HTTPS on an existing path, end to end (:class:`iwscope_lab.demo.DemoCampaign`):
beside the benefit campaign's plain-HTTP origin an origin serves a 16 KB test chain, and HTTP/3
(``iwprobe origin --quic``), and one probe -- not its neighbour in the same region -- runs a short
HTTPS campaign against it between its benefit rounds, its QUIC arms (``3q``, ``10q``) in the same
rounds as its TCP arms; real agents, API and worker, checked from PostgreSQL, ``tls_by_flight``
(what the TLS page draws) and ``protocol_comparisons`` (the HTTP/3 page)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from campaign_kit import origin_host, query_rows, session_stack

from iwscope.analysis import Filters, tls_by_flight
from iwscope.analysis.protocols import QUIC_ARMS, TCP_VS_QUIC, protocol_comparisons
from iwscope_lab.campaign import CampaignPlan
from iwscope_lab.demo import HTTPS_CHAIN_KB, HTTPS_ORIGIN, HTTPS_QUIC_ARMS, DemoCampaign
from iwscope_lab.links import LinkSpec
from iwscope_lab.topology import Host, Topology

# A 20 s rehearsal of make demo's HTTPS side campaign (HTTPS campaigns end to end: test_campaign_tls_ipv6.py
# in make test); make test-slow runs it.
pytestmark = pytest.mark.slow

PLAN = CampaignPlan(
    name="demo-https-e2e", arms=(3, 10), sizes=(9_000,), repetitions=10_000, duration_s=15.0, calibrate=False, quic=True
)
REPETITIONS = 4


@pytest.fixture(scope="module")
def campaign(
    database_url: str,
    redis_url: str,
    celery_worker: object,
    _api_server_process: object,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, object]]:
    stack = session_stack(database_url, redis_url, _api_server_process, tmp_path_factory.mktemp("lab"))
    hosts = [
        origin_host(),
        Host(
            HTTPS_ORIGIN,
            role="origin",
            region="lab",
            link=LinkSpec.symmetric(rate_bps=1e9, rtt_ms=0),
            labels={"chain_kb": str(HTTPS_CHAIN_KB)},
        ),
        Host("https-path", role="probe", region="north-america", link=LinkSpec.symmetric(rate_bps=5e6, rtt_ms=80)),
        Host("neighbour", role="probe", region="north-america", link=LinkSpec.symmetric(rate_bps=5e6, rtt_ms=40)),
    ]
    with Topology(f"iwt{secrets.token_hex(3)}", hosts) as topology:
        lab = DemoCampaign(topology, stack, PLAN, https_probe="https-path", https_repetitions=REPETITIONS)
        result = lab.run(timeout_s=180, show_progress=False)
        chain = lab.chains[HTTPS_ORIGIN]
    yield {"result": result, "https": lab.https_campaign_id, "stack": stack, "chain": chain}
    stack.close_sessions()


def test_one_probe_measures_https_beside_the_benefit_campaign(campaign: dict[str, object]) -> None:
    result, https, stack = campaign["result"], campaign["https"], campaign["stack"]
    assert https is not None and https != result.campaign_id
    assert all(code == 0 for code in result.probe_exit_codes.values()), result.probe_exit_codes
    rows = query_rows(
        stack,
        """
        SELECT t.campaign_id, p.name AS probe, o.name AS origin, t.arm_iw, t.arm, t.protocol, t.url, t.tls_version,
               t.error_kind, t.server_tls_first_flight_bytes AS flight, t.joined_at, t.server_latency_us,
               t.client_iw_status, t.client_iw_reason, t.connect_us
          FROM trials t JOIN probes p ON p.id = t.probe_id JOIN origins o ON o.id = t.origin_id
         WHERE t.campaign_id IN (:benefit, :https)""",
        benefit=result.campaign_id,
        https=https,
    )
    benefit = [row for row in rows if row.campaign_id == result.campaign_id]
    tls = [row for row in rows if row.campaign_id == https and row.protocol != "quic"]
    h3 = [row for row in rows if row.campaign_id == https and row.protocol == "quic"]
    # the benefit campaign: plain HTTP to the plain origin, both probes
    assert {row.probe.split(".")[0] for row in benefit} == {"https-path", "neighbour"}
    assert {row.origin.split(".")[0] for row in benefit} == {"origin"} and all(row.url.startswith("http://") for row in benefit)
    # the HTTPS campaign: its rounds, from the one probe, every handshake joined with the chain's flight
    assert len(tls) == REPETITIONS * len(PLAN.arms)
    assert {row.probe.split(".")[0] for row in tls} == {"https-path"}
    assert {row.origin.split(".")[0] for row in tls} == {HTTPS_ORIGIN}
    chain_bytes = campaign["chain"].chain_der_bytes
    for row in tls:
        assert row.url.startswith("https://") and row.tls_version == "TLSv1.3" and row.error_kind is None, row
        assert row.joined_at is not None and chain_bytes < row.flight < chain_bytes + 1_500
    # what the TLS page draws: one first-flight bucket, both arms
    with stack.session() as session:
        (bucket,) = tls_by_flight(session, Filters(campaign_ids=(https,), baseline_iw=3, treatment_iw=10))
    assert bucket.bucket == "<=20 KB" and bucket.baseline.n == bucket.treatment.n == REPETITIONS
    # a 16 KB flight: three rounds from IW3, two from IW10 -- one 80 ms round trip apart
    assert bucket.baseline.median_ms is not None and bucket.treatment.median_ms is not None
    assert bucket.baseline.median_ms - bucket.treatment.median_ms == pytest.approx(80, abs=25)
    # HTTP/3 in the same rounds: every QUIC arm's trial made, answered and joined with the origin's observation
    assert sorted(row.arm for row in h3) == sorted(list(HTTPS_QUIC_ARMS) * REPETITIONS), [row.arm for row in h3]
    for row in h3:
        assert row.url.startswith("https://") and row.error_kind is None and row.connect_us is None, row
        assert row.joined_at is not None and row.server_latency_us is not None, row
        # the probe's own inference: the 1 KB object (HTTPS_SIZES) ends in the flight's one datagram
        assert (row.client_iw_status, row.client_iw_reason) == ("lower_bound", "object_ended"), row
    observed = query_rows(
        stack,
        """SELECT o.arm, o.protocol, o.snd_cwnd_at_accept, o.cwnd_mismatch, o.quic_max_datagram_size,
                  o.quic_first_flight_packets
             FROM origin_observations o JOIN trials t ON t.trial_id = o.trial_id
            WHERE t.campaign_id = :https AND o.protocol = 'quic'""",
        https=https,
    )
    # each connection starts with its arm's window (the 16 KB chain then grows it in the handshake)
    assert len(observed) == len(h3) and {(row.arm, row.snd_cwnd_at_accept) for row in observed} == {("3q", 3), ("10q", 10)}
    assert not any(row.cwnd_mismatch for row in observed), observed
    assert all(row.quic_max_datagram_size == 1200 and row.quic_first_flight_packets for row in observed), observed
    with stack.session() as session:
        compared = protocol_comparisons(session, Filters(campaign_ids=(https,), baseline_iw=3, treatment_iw=10, metric="client"))
    tcp_quic = [row for row in compared if row.dimension == TCP_VS_QUIC]
    assert sorted(row.baseline.iw for row in tcp_quic) == [3, 10] and all(row.n_pairs == REPETITIONS for row in tcp_quic)
    assert [row.n_pairs for row in compared if row.dimension == QUIC_ARMS] == [REPETITIONS]
    # both windows closed at the end of the run
    windows = query_rows(stack, "SELECT ends_at FROM campaigns WHERE id = :c", c=https)
    assert windows[0].ends_at is not None
