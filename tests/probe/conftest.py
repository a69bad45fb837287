"""Fixtures of the iwprobe tests (helpers live in iwprobe_testkit)."""

from iwprobe_testkit import netns_pair  # noqa: F401  (fixture)
