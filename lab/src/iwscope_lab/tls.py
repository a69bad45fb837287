"""``iwscope lab reproduce --only tls``: TLS handshake time against the IW, beside the model.

Every short transfer on today's web starts with a TLS handshake whose first server flight
(ServerHello .. Certificate chain, CertificateVerify, Finished) is itself a short transfer
bounded by the initial window: a chain that does not fit costs a round trip before the first
byte of content, and post-quantum chains (ML-DSA: 10-20 KB and more) do not fit IW10.

One real campaign measures the whole grid at once: one HTTPS origin per chain size
(``iwscope_lab.certs``: 2, 5, 10, 16 and 32 KB of DER) and one probe per RTT (50, 100,
200 ms at 100 Mbit/s), arms IW 3, 10, 16 and 32, a 1,000-byte object (the handshake is the
transfer).  Per (RTT, chain, IW): the client's handshake as curl's ``time_appconnect``
(``connect_us + tls_handshake_us``: start -> handshake done, TCP connect included), the
origin's (ClientHello read -> client Finished), the first flight's bytes, and the model
(:func:`iwscope.model.predict_appconnect` of the measured flight; its slow-start rounds).
Points more than 10 % from the model are flagged.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from sqlalchemy import text

from iwscope.analysis.stats import mean_interval
from iwscope.model import predict_appconnect, tls_first_flight_bytes, tls_handshake_rounds
from iwscope_lab.campaign import CampaignPlan, LabCampaign
from iwscope_lab.certs import ChainInfo
from iwscope_lab.hostspec import probes_per_rtt
from iwscope_lab.links import LinkSpec
from iwscope_lab.stack import Stack
from iwscope_lab.topology import Host, Topology

TLS_KEY = "tls"
CHAIN_KBS = (2, 5, 10, 16, 32)
RTTS_MS = (50, 100, 200)
RATE_BPS = 100_000_000
ARMS = (3, 10, 16, 32)
#: The object fetched after the handshake (small: the handshake is the transfer measured).
OBJECT_BYTES = 1_000
#: Relative gap between measurement and model above which a point is flagged.
FLAG_THRESHOLD = 0.10
#: Fewer trials per point than this: no mean is claimed ("n too small").
MIN_TRIALS = 3


def topology(run_id: str | None = None) -> Topology:
    """One HTTPS origin per chain size on fast links, one probe per RTT at 100 Mbit/s."""
    hosts = [
        Host(
            f"chain{kb}k",
            role="origin",
            region="lab",
            link=LinkSpec.symmetric(rate_bps=1e9, rtt_ms=0),
            labels={"chain_kb": str(kb)},
        )
        for kb in CHAIN_KBS
    ]
    hosts += probes_per_rtt(RTTS_MS, RATE_BPS, "lab-tls")
    return Topology(run_id, hosts, scenario="reproduce:tls")


class TlsCampaign(LabCampaign):
    """The lab campaign of this experiment: its origins (labelled ``chain_kb``) serve HTTPS
    (:meth:`LabCampaign._write_chains`) with CUBIC."""

    def _origin_options(self) -> list[str]:
        # The model is slow start's: CUBIC, not BBR (a host default here), whose startup paces
        # the rounds after the first (a 32 KB flight from IW10 took 0.13-0.15 x longer under BBR).
        return [*super()._origin_options(), "--congestion-control", "cubic"]


@dataclass
class TlsPoint:
    """One (RTT, chain, IW) cell: the handshake measured and modelled (ms)."""

    rtt_ms: float
    chain_kb: float
    chain_der_bytes: int
    iw: int
    n: int
    errors: int
    #: Client: start -> handshake done (curl's time_appconnect), mean with its 95 % interval, median.
    appconnect_mean_ms: float | None
    appconnect_low_ms: float | None
    appconnect_high_ms: float | None
    appconnect_median_ms: float | None
    #: Origin: ClientHello read -> handshake complete, median.
    server_handshake_median_ms: float | None
    first_flight_bytes: int | None
    model_first_flight_bytes: int
    model_rounds: int | None
    model_appconnect_ms: float | None
    gap: float | None = None
    flag: str | None = None


_QUERY = text("""
    SELECT t.arm_iw, t.connect_us, t.tls_handshake_us, t.error_kind, t.server_tls_handshake_us,
           t.server_tls_first_flight_bytes
      FROM trials t
     WHERE t.campaign_id = :campaign_id AND t.probe_id = :probe_id AND t.origin_id = :origin_id
""")


def measure(session: Any, campaign_id: int, probe_id: str, origin_id: str, rtt_ms: float, chain: ChainInfo) -> list[TlsPoint]:
    """The points of one probe (RTT) and one origin (chain), one per arm."""
    rows = session.execute(_QUERY, {"campaign_id": campaign_id, "probe_id": probe_id, "origin_id": origin_id}).all()
    chain_kb, chain_der_bytes = chain.chain_kb, chain.chain_der_bytes
    model_flight = tls_first_flight_bytes(chain_der_bytes, "ec", "1.3", certificates=len(chain.certificates))
    points = []
    for iw in ARMS:
        arm_rows = [row for row in rows if row.arm_iw == iw]
        ok = [
            row for row in arm_rows if row.error_kind is None and row.tls_handshake_us is not None and row.connect_us is not None
        ]
        appconnect = [(row.connect_us + row.tls_handshake_us) / 1000 for row in ok]
        flights = [row.server_tls_first_flight_bytes for row in ok if row.server_tls_first_flight_bytes]
        server = [row.server_tls_handshake_us / 1000 for row in ok if row.server_tls_handshake_us is not None]
        flight = int(statistics.median(flights)) if flights else None
        enough = len(appconnect) >= MIN_TRIALS
        interval = mean_interval(appconnect) if enough else None
        model_ms = 1000 * predict_appconnect(rtt_ms / 1000, RATE_BPS, flight or model_flight, iw)
        point = TlsPoint(
            rtt_ms=rtt_ms,
            chain_kb=chain_kb,
            chain_der_bytes=chain_der_bytes,
            iw=iw,
            n=len(appconnect),
            errors=len(arm_rows) - len(ok),
            appconnect_mean_ms=statistics.fmean(appconnect) if enough else None,
            appconnect_low_ms=interval[0] if interval else None,
            appconnect_high_ms=interval[1] if interval else None,
            appconnect_median_ms=statistics.median(appconnect) if enough else None,
            server_handshake_median_ms=statistics.median(server) if len(server) >= MIN_TRIALS else None,
            first_flight_bytes=flight,
            model_first_flight_bytes=model_flight,
            model_rounds=tls_handshake_rounds(flight or model_flight, iw),
            model_appconnect_ms=model_ms,
        )
        if point.appconnect_mean_ms is not None:
            point.gap = (point.appconnect_mean_ms - model_ms) / model_ms
            if abs(point.gap) > FLAG_THRESHOLD:
                point.flag = "unexplained: check the packet trace"
        elif arm_rows:
            point.flag = f"n too small ({len(appconnect)} handshakes)"
        points.append(point)
    return points


def run_tls(
    stack: Stack, *, quick: bool, console: Console | None = None, show_progress: bool = True, run_id: str | None = None
) -> list[TlsPoint]:
    """Run the TLS campaign in the lab; every point of the grid."""
    console = console or Console(stderr=True)
    plan = CampaignPlan(
        "reproduce tls handshake vs IW", arms=ARMS, sizes=(OBJECT_BYTES,), repetitions=4 if quick else 12, calibrate=False
    )
    with topology(run_id) as topo:
        campaign = TlsCampaign(topo, stack, plan, console=console)
        console.print(
            f"[bold]TLS handshake vs IW[/]: {len(CHAIN_KBS)} chains x {len(RTTS_MS)} RTTs x "
            f"{len(ARMS)} arms, {plan.trials_per_probe(len(CHAIN_KBS))} trials per probe"
        )
        outcome = campaign.run(show_progress=show_progress)
        chains = campaign.chains
        probes = {host.name: host for host in topo.hosts_by_role("probe")}
    points: list[TlsPoint] = []
    with stack.session() as session:
        for probe_name, probe in probes.items():
            for origin_name in chains:
                points += measure(
                    session,
                    outcome.campaign_id,
                    outcome.probe_ids[probe_name],
                    outcome.origin_ids[origin_name],
                    float(probe.labels["rtt_ms"]),
                    chains[origin_name],
                )
    return points


def reproduce_tls(stack: Stack, *, quick: bool, show_progress: bool = True) -> dict[str, Any]:
    """The TLS experiment for ``iwscope lab reproduce``: JSON-ready summary."""
    points = run_tls(stack, quick=quick, show_progress=show_progress)
    return {
        "title": "TLS handshake time vs IW and chain size (100 Mbit/s)",
        "rate_bps": RATE_BPS,
        "object_bytes": OBJECT_BYTES,
        "flag_threshold": FLAG_THRESHOLD,
        "metric": "client: start to TLS handshake done (curl's time_appconnect: connect_us + tls_handshake_us)",
        "points": [asdict(point) for point in points],
    }
