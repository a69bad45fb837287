"""Real TCP and UDP through the emulator between two namespaces (the link emulator's must-show list).

The emulator's PRNG is seeded (the topology's seed), so the loss counts are reproducible.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from testkit import SchedulingNoise

from iwscope_lab.links import DirectionSpec, LinkSpec
from iwscope_lab.selftest import binomial_interval, measure_loss, measure_rate, measure_rtt
from iwscope_lab.topology import Topology

TwoHosts = Callable[..., Topology]


@pytest.mark.parametrize(("rtt_ms", "handshakes"), [(20, 30), (100, 20), (600, 10)])
def test_handshake_rtt_matches_configured(two_hosts: TwoHosts, rtt_ms: float, handshakes: int) -> None:
    topo = two_hosts(LinkSpec.symmetric(rate_bps=10e6, rtt_ms=rtt_ms))
    with SchedulingNoise() as noise:
        result = measure_rtt(topo, "probe", "origin", handshakes)
    tolerance = max(0.03 * rtt_ms, 1.0)
    assert result["samples"] == handshakes
    samples = result["samples_ms"]
    # The median, with four times the median wake-up lateness measured meanwhile (a handshake's
    # round trip crosses four userspace wake-ups: the emulator's, each way, and the two ends'): a
    # clean-clone CI run on a busy box had p50 21.4 ms at 20 ms.
    assert abs(result["p50_ms"] - rtt_ms) <= tolerance + 4 * noise.quantile_ms(0.5), (result, noise.quantile_ms(0.5))
    assert min(samples) >= rtt_ms, result  # never faster than the configured propagation delay
    # Every handshake within tolerance, except at most 10 %: on this shared 2-core machine a
    # neighbour's kernel work occasionally delays one packet by 10-40 ms (measured; see
    # docs/lab.md).  Such stalls are not emulator modelling errors, and neither is the wake-up
    # lateness of the handshake's userspace ends on a box busy with another suite (a CI run: 4
    # of 30 handshakes at 20 ms were 1.0-1.9 ms late): the tolerance adds twice the p99 lateness
    # of a 5 ms sleep measured meanwhile (well under a millisecond on a quiet box).
    allowed = tolerance + 2 * noise.quantile_ms(0.99)
    outside = [sample for sample in samples if abs(sample - rtt_ms) > allowed]
    assert len(outside) <= 0.1 * handshakes, (result, allowed)


@pytest.mark.parametrize(("rate_bps", "window_s"), [(1e6, 5.0), (50e6, 2.5)])
def test_delivered_rate_within_2_percent(two_hosts: TwoHosts, rate_bps: float, window_s: float) -> None:
    topo = two_hosts(LinkSpec.symmetric(rate_bps=rate_bps, rtt_ms=20))
    result = measure_rate(topo, "origin", "probe", window_s)
    assert result["queue_drops"] == 0
    # The emulator's rate while its link was busy (a sender or receiver starved of CPU on a
    # busy box leaves idle gaps: a CI run delivered 6 % under 50 Mbit/s with no queue drop);
    # one bulk flow keeps the link busy most of the time, or the measurement says nothing.
    assert result["link_busy_share"] >= 0.75, result
    assert abs(result["emulator_error"]) <= 0.02, result
    # The receiver's goodput (as IP bytes) agrees with what the emulator delivered.
    assert abs(result["goodput_error"]) <= 0.02, result


@pytest.mark.parametrize("loss", [0.01, 0.05])
def test_loss_within_binomial_interval(two_hosts: TwoHosts, loss: float) -> None:
    topo = two_hosts(LinkSpec.symmetric(rate_bps=20e6, rtt_ms=10, loss=loss))
    result = measure_loss(topo, "origin", "probe", 10000)
    assert result["send_errors"] == 0
    assert result["within_interval"], result
    # Every datagram that did not arrive was dropped by the emulator's loss process.
    assert result["emulator_lost_packets"] == result["lost"], result
    # TCP through the same lossy link: the emulator's per-packet loss is in the interval too.
    stats_before = topo.link_stats("probe")["down"]
    measure_rate(topo, "origin", "probe", 1.0, warmup_s=0.2)
    stats_after = topo.link_stats("probe")["down"]
    arrived = stats_after["rx_packets"] - stats_before["rx_packets"]
    lost = stats_after["lost_packets"] - stats_before["lost_packets"]
    assert arrived > 500
    low, high = binomial_interval(arrived, loss)
    assert low <= lost <= high, (arrived, lost, low, high)


def test_gilbert_elliott_loss_is_bursty_with_the_configured_average(two_hosts: TwoHosts) -> None:
    bursty = DirectionSpec(rate_bps=20e6, delay_ms=5, loss=0.05, loss_model="gilbert", ge_burst_packets=4)
    topo = two_hosts(LinkSpec(down=bursty, up=DirectionSpec(rate_bps=20e6, delay_ms=5)))
    gilbert = measure_loss(topo, "origin", "probe", 10000)
    # Bursts make the count far more variable than a binomial one: allow +-40 % of 5 %.
    assert 0.03 <= gilbert["measured"] <= 0.07, gilbert
    assert 2.5 <= gilbert["mean_burst_packets"] <= 6.0, gilbert
    assert gilbert["emulator_lost_packets"] == gilbert["lost"]
    topo.set_link(
        "probe", LinkSpec(down=bursty.with_changes(loss_model="bernoulli"), up=DirectionSpec(rate_bps=20e6, delay_ms=5))
    )
    bernoulli = measure_loss(topo, "origin", "probe", 10000, port=7104)
    assert bernoulli["within_interval"], bernoulli
    assert bernoulli["mean_burst_packets"] < 1.3, bernoulli
