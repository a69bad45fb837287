"""IP addresses in free text: found, so a record carrying one is refused, or redacted.

Passive measurement runs on servers of operators that serve real users; the collector must
never hold one of their addresses (docs/security.md, "Passive data").  The wire format gives a
client no field for it (``client_prefix`` is a 16-hex-digit keyed hash), but free text could
still carry one: a record's ``region`` (refused, :mod:`iwscope.passive.validation`) or a
server's error text in its heartbeat (redacted, :func:`redact_addresses`: the server's own
diagnostics must not cost its measurements).

Candidates are runs of hex digits, dots and colons, each confirmed by :mod:`ipaddress` (as it
stands, or without trailing dots and colons: ``192.0.2.1.`` at a sentence's end); a run that is
no address (``10.0.0.1:8080``) is searched for dotted quads inside it.
"""

from __future__ import annotations

import ipaddress
import re

#: Runs that might hold an address (``::1`` is the shortest).
_RUN = re.compile(r"[0-9A-Fa-f:.]{3,}")
#: A dotted quad inside a run (not part of a longer number).
_DOTTED_QUAD = re.compile(r"(?<![\d.])\d{1,3}(?:\.\d{1,3}){3}(?!\d)")
#: What an address in a server's free text is replaced by.
REDACTED_ADDRESS = "<address>"


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def address_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every IPv4 or IPv6 address in ``text``, in order."""
    spans: list[tuple[int, int]] = []
    for run in _RUN.finditer(text):
        value = run.group(0)
        whole = next((candidate for candidate in (value, value.rstrip(".:")) if _is_address(candidate)), None)
        if whole is not None:
            spans.append((run.start(), run.start() + len(whole)))
            continue
        spans += [
            (run.start() + quad.start(), run.start() + quad.end())
            for quad in _DOTTED_QUAD.finditer(value)
            if _is_address(quad.group(0))
        ]
    return spans


def holds_address(text: str) -> bool:
    """Whether ``text`` contains an IPv4 or IPv6 address."""
    return bool(address_spans(text))


def redact_addresses(text: str) -> str:
    """``text`` with every IPv4 or IPv6 address replaced by :data:`REDACTED_ADDRESS`."""
    pieces: list[str] = []
    last = 0
    for start, end in address_spans(text):
        pieces += [text[last:start], REDACTED_ADDRESS]
        last = end
    return "".join(pieces) + text[last:]
