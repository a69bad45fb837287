"""The learned arm's bookkeeping (no routes installed): what is remembered, clamped and forgotten."""

from __future__ import annotations

import time

import pytest

from iwprobe._learned import LearnedWindows, client_prefix, window_to_learn

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services


def test_prefixes_and_the_window_handed_on() -> None:
    assert client_prefix("10.64.2.2") == "10.64.2.0/24"
    assert client_prefix("::ffff:10.1.2.3") == "10.1.2.0/24"
    assert client_prefix("2001:db8:1:2::5") == "2001:db8:1::/48"
    assert window_to_learn({"snd_cwnd": 80, "snd_ssthresh": 2_147_483_647}) == 80  # no loss: the window
    assert window_to_learn({"snd_cwnd": 80, "snd_ssthresh": 21}) == 21  # a loss halved it: not above
    assert window_to_learn({}) is None


def test_windows_are_clamped_shared_per_prefix_and_forgotten_after_the_ttl() -> None:
    learned = LearnedWindows(table=22001, base_iw=10, cap_iw=64, ttl_s=0.3, apply_routes=False)
    learned.start()
    try:
        assert learned.intended("10.0.5.7") == 10  # nothing learned: the base window
        assert learned.observe("10.0.5.7", {"snd_cwnd": 168}) == 64  # capped
        deadline = time.monotonic() + 2
        while learned.intended("10.0.5.99") != 64:  # same /24, once the route thread "installed" it
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert learned.intended("10.0.6.1") == 10  # another /24
        assert learned.observe("10.0.5.7", {"snd_cwnd": 1, "snd_ssthresh": 1}) == 2  # floor
        deadline = time.monotonic() + 3
        while learned.snapshot():  # not refreshed within the TTL: forgotten
            assert time.monotonic() < deadline, learned.snapshot()
            time.sleep(0.05)
        assert learned.intended("10.0.5.7") == 10
    finally:
        learned.close()
