"""A probe's unchanged schedule answered 304 before FastAPI's router.

Every probe asks for its schedule before each upload (``If-None-Match``: almost always
unchanged), so at the fleet's shape the schedule route is as many requests as the uploads; through
FastAPI's dependencies and a ``ScheduleOut`` built only to be hashed it was 14 % of the API's CPU
(py-spy, docs/ingest-throughput.md).  :func:`answer_if_unchanged` answers exactly the common
case -- an authenticated probe asking for its own schedule with the current ETag -- with the
same 304 and headers as :func:`iwscope.probes.routes.schedule`, and declines everything else
(no or another credential, another probe's id, an unusual query or header, a changed schedule),
which FastAPI then answers as before, errors included.
"""

from __future__ import annotations

import functools
import re
import uuid
from urllib.parse import parse_qsl

from fastapi import HTTPException
from starlette.types import Scope, Send

from iwprobe import wire
from iwscope.auth.dependencies import authenticate, bearer_credential
from iwscope.config import get_settings
from iwscope.http import etag_matches, header, send_answer
from iwscope.probes import schedule_cache, services

#: The route's template (the request metrics' label) and what its path looks like.
SCHEDULE_ROUTE = "/api/v1/probes/{probe_id}/schedule"
_SCHEDULE_PATH = re.compile(r"/api/v1/probes/([0-9A-Fa-f-]{32,36})/schedule")
#: The route's bound on ``If-None-Match`` (``Header(max_length=1024)``).
_MAX_IF_NONE_MATCH = 1024


@functools.lru_cache(maxsize=65_536)
def schedule_probe_id(path: str) -> uuid.UUID | None:
    """The probe id of a schedule path (``None``: not one this module answers); remembered per
    path, as every probe polls the same one (``uuid.UUID()`` parses in Python: 4 % of the API's
    GIL-held samples in a py-spy profile at 1,000 probes, 2026-11-28)."""
    match = _SCHEDULE_PATH.fullmatch(path)
    if match is None:
        return None
    try:
        return uuid.UUID(match.group(1))
    except ValueError:
        return None


def _wire_version(query_string: bytes) -> int | None:
    """The ``wire_version`` the route would read (its default when absent); ``None`` for any
    query the route might answer otherwise (unknown keys, repeats, out of range)."""
    if not query_string:
        return services.DEFAULT_PROBE_WIRE_VERSION
    try:
        pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True, strict_parsing=True)
    except ValueError:
        return None
    if len(pairs) != 1 or pairs[0][0] != "wire_version" or not pairs[0][1].isdigit():
        return None
    version = int(pairs[0][1])
    return version if 1 <= version <= wire.WIRE_VERSION else None


async def answer_if_unchanged(probe_id: uuid.UUID, scope: Scope, send: Send) -> bool:
    """Answer 304 when the authenticated probe ``probe_id`` names its schedule's current ETag;
    ``False`` (nothing sent) when the route must answer."""
    if_none_match = header(scope, b"if-none-match")
    if not if_none_match or len(if_none_match) > _MAX_IF_NONE_MATCH:
        return False
    wire_version = _wire_version(scope.get("query_string", b""))
    if wire_version is None:
        return False
    try:
        probe = await authenticate(("probe",), bearer_credential(header(scope, b"authorization")))
    except HTTPException:
        return False  # the route answers the 401 (with the same lookup, failures are rare)
    if probe.id != probe_id:
        return False
    settings = get_settings()
    snapshot, now = await schedule_cache.current_snapshot(settings)
    etag = services.schedule_etag(snapshot, probe, settings.schedule_poll_s, now, wire_version)
    if not etag_matches(if_none_match, etag):
        return False
    await send_answer(send, 304, b"", {"ETag": etag, "Cache-Control": "no-cache"})
    return True


__all__ = ["SCHEDULE_ROUTE", "answer_if_unchanged", "schedule_probe_id"]
