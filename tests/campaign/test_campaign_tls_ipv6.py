"""A lab campaign over HTTPS and IPv6 end to end (scenario ``tls-pq``): origins serve test
chains of 3 and 16 KB on their IPv4 and IPv6 addresses, the campaign chooses IPv6, real
agents, API and worker; checked from PostgreSQL."""

from __future__ import annotations

import secrets
import statistics
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from campaign_kit import query_rows, session_stack

from iwscope_lab.campaign import CampaignError, CampaignPlan, LabCampaign
from iwscope_lab.topology import Topology

PLAN = CampaignPlan(name="tls-ipv6", arms=(3, 10), sizes=(1_000,), repetitions=3, calibrate=False, family="ipv6")
RTT_MS = 200.0


@pytest.fixture(scope="module")
def campaign(
    database_url: str,
    redis_url: str,
    celery_worker: object,
    _api_server_process: object,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, object]]:
    stack = session_stack(database_url, redis_url, _api_server_process, tmp_path_factory.mktemp("lab"))
    with Topology.from_scenario("tls-pq", run_id=f"iwt{secrets.token_hex(3)}") as topology:
        lab = LabCampaign(topology, stack, PLAN)
        result = lab.run(timeout_s=150, show_progress=False)
        addresses6 = {host.name: host.address6 for host in topology.hosts_by_role("origin")}
        chains = {name: chain.chain_der_bytes for name, chain in lab.chains.items()}
    yield {"result": result, "stack": stack, "addresses6": addresses6, "chains": chains, "chain_infos": lab.chains}
    stack.close_sessions()


def test_https_over_ipv6_measures_the_chains_first_flight(campaign: dict[str, object]) -> None:
    result = campaign["result"]
    assert result.stored_per_probe == {"probe1": PLAN.trials_per_probe(2)} and result.unjoined == 0
    rows = query_rows(
        campaign["stack"],
        """
        SELECT o.name, t.arm_iw, t.url, t.family, t.tls_version, t.error_kind, t.connect_us + t.tls_handshake_us AS app,
               t.server_tls_first_flight_bytes AS flight, t.server_snd_cwnd_at_accept AS cwnd
          FROM trials t JOIN origins o ON o.id = t.origin_id WHERE t.campaign_id = :c""",
        c=result.campaign_id,
    )
    assert len(rows) == 2 * len(PLAN.arms) * PLAN.repetitions
    by_cell: dict[tuple[str, int], list[float]] = {}
    for row in rows:
        origin = row.name.split(".")[0]
        assert row.error_kind is None and row.family == "ipv6" and row.tls_version == "TLSv1.3", row
        assert row.url.startswith(f"https://[{campaign['addresses6'][origin]}]:")  # the origin's host6
        assert row.cwnd == row.arm_iw  # the -6 rules gave every arm its window
        assert campaign["chains"][origin] < row.flight < campaign["chains"][origin] + 1_500
        by_cell.setdefault((origin, row.arm_iw), []).append(row.app / 1000)
    medians = {cell: statistics.median(values) for cell, values in by_cell.items()}
    # 3 KB fits IW3: the arms tie; 16 KB takes IW3 at least one round trip more than IW10
    assert abs(medians[("classic", 3)] - medians[("classic", 10)]) < 0.05 * RTT_MS, medians
    assert medians[("pq", 3)] - medians[("pq", 10)] >= 0.95 * RTT_MS, medians


def test_an_ipv6_campaign_needs_a_dual_stack_topology(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="family"):
        CampaignPlan(name="bad", family="ipv5")
    # refused before anything is started (no stack is touched: a placeholder stands in for it)
    topology = Topology.from_scenario("tls-pq", run_id="iwtnosix", dual_stack=False)
    lab = LabCampaign(topology, SimpleNamespace(run_dir=tmp_path), PLAN, client_initrwnd=None)  # type: ignore[arg-type]
    with pytest.raises(CampaignError, match="dual-stack"):
        lab.start()


def test_the_api_shows_the_handshakes_by_first_flight_for_the_ipv6_campaigns(campaign: dict[str, object]) -> None:
    result, stack = campaign["result"], campaign["stack"]
    base = f"{stack.local_api_url}/api/v1/analysis/tls?campaign={result.campaign_id}&metric=client"
    over_ipv6 = httpx.get(base + "&family=ipv6", timeout=30).json()["data"]
    # 3 KB flights in one bucket, 16 KB in another; 3 rounds x 2 arms x 1 path: "n too small" for a claim
    assert [row["bucket"] for row in over_ipv6] == ["<=6 KB", "<=20 KB"]
    for row in over_ipv6:
        assert row["baseline"]["n"] == row["treatment"]["n"] == PLAN.repetitions and row["too_small"]
    slow, fast = over_ipv6[1]["baseline"]["mean_ms"], over_ipv6[1]["treatment"]["mean_ms"]
    assert slow - fast >= 0.95 * RTT_MS  # the probe's handshake: one round trip more from IW3
    assert httpx.get(base + "&family=ipv4", timeout=30).json()["data"] == []  # this campaign chose IPv6


def test_the_reproductions_reader_puts_the_campaign_beside_the_model(campaign: dict[str, object]) -> None:
    """``iwscope_lab.tls.measure`` (what ``lab reproduce --only tls`` reports) on this campaign:
    every (chain, arm) point within 10 % of the slow-start model, with its rounds."""
    from iwscope_lab.tls import measure

    result, stack = campaign["result"], campaign["stack"]
    with stack.session() as session:
        points = {
            (name, point.iw): point
            for name, chain in campaign["chain_infos"].items()
            for point in measure(session, result.campaign_id, result.probe_ids["probe1"], result.origin_ids[name], RTT_MS, chain)
            if point.iw in PLAN.arms
        }
    assert {(name, iw) for name, iw in points} == {(name, iw) for name in ("classic", "pq") for iw in PLAN.arms}
    for point in points.values():
        assert point.n == PLAN.repetitions and point.gap is not None and abs(point.gap) <= 0.10, point
    assert [points[("pq", iw)].model_rounds for iw in PLAN.arms] == [3, 2]
    assert [points[("classic", iw)].model_rounds for iw in PLAN.arms] == [1, 1]
