"""``make demo``'s HTTPS on an existing path, end to end (:class:`iwscope_lab.demo.DemoCampaign`):
beside the benefit campaign's plain-HTTP origin an origin serves a 16 KB test chain, and one
probe -- not its neighbour in the same region -- runs a short HTTPS campaign against it between
its benefit rounds; real agents, API and worker, checked from PostgreSQL and ``tls_by_flight``
(what the TLS page draws)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from campaign_kit import origin_host, query_rows, session_stack

from iwscope.analysis import Filters, tls_by_flight
from iwscope_lab.campaign import CampaignPlan
from iwscope_lab.demo import HTTPS_CHAIN_KB, HTTPS_ORIGIN, DemoCampaign
from iwscope_lab.links import LinkSpec
from iwscope_lab.topology import Host, Topology

# A 20 s rehearsal of make demo's HTTPS side campaign (HTTPS campaigns end to end: test_campaign_tls_ipv6.py
# in make test); make test-slow runs it.
pytestmark = pytest.mark.slow

PLAN = CampaignPlan(name="demo-https-e2e", arms=(3, 10), sizes=(9_000,), repetitions=10_000, duration_s=15.0, calibrate=False)
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
        SELECT t.campaign_id, p.name AS probe, o.name AS origin, t.arm_iw, t.url, t.tls_version, t.error_kind,
               t.server_tls_first_flight_bytes AS flight, t.joined_at
          FROM trials t JOIN probes p ON p.id = t.probe_id JOIN origins o ON o.id = t.origin_id
         WHERE t.campaign_id IN (:benefit, :https)""",
        benefit=result.campaign_id,
        https=https,
    )
    benefit = [row for row in rows if row.campaign_id == result.campaign_id]
    tls = [row for row in rows if row.campaign_id == https]
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
    # both windows closed at the end of the run
    windows = query_rows(stack, "SELECT ends_at FROM campaigns WHERE id = :c", c=https)
    assert windows[0].ends_at is not None
