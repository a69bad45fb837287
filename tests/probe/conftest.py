"""Fixtures of the iwprobe tests (helpers live in iwprobe_testkit)."""

from iwprobe_testkit import fleet_net, netns_pair  # noqa: F401  (fixtures)
