"""The collector's hot paths: the requests every probe and origin sends all the time, answered
by plain ASGI before FastAPI's router.

At the fleet's shape three requests make nearly all of the API's work -- a probe's schedule
(unchanged: 304), its trial upload, its origin's observation upload -- and FastAPI's
per-request machinery (dependency solving, a ``Response`` per request, the exception
middlewares) cost about as much CPU as the records (docs/ingest-throughput.md).
:class:`HotPaths` hands them to :func:`iwscope.trials.ingest.answer_upload` and
:func:`iwscope.probes.hotpath.answer_if_unchanged`, which do the same checks and give the same
answers (tests/collector/test_collector_hotpaths.py sends every kind of request to an app with
and without this layer and compares).  It sits inside :class:`iwscope.admission.Admission` and
:class:`iwscope.api.RequestMetrics`, which count it under the route it answers for.  A request
under a ``root_path`` goes to FastAPI, as does anything else.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from iwscope.probes.hotpath import SCHEDULE_ROUTE, answer_if_unchanged, schedule_probe_id
from iwscope.trials.ingest import UPLOAD_PATHS, answer_upload


class RouteLabel:
    """What :class:`iwscope.api.RequestMetrics` reads of ``scope["route"]``: the route template."""

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path


_LABELS = {path: RouteLabel(path) for path in (*UPLOAD_PATHS, SCHEDULE_ROUTE)}


class HotPaths:
    """ASGI layer answering the hot paths itself; every other request goes to ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            method, path = scope["method"], scope["path"]
            if method == "POST" and path in UPLOAD_PATHS:
                scope["route"] = _LABELS[path]
                await answer_upload(path, scope, receive, send)
                return
            if method == "GET" and path.endswith("/schedule"):
                probe_id = schedule_probe_id(path)
                if probe_id is not None:
                    scope["route"] = _LABELS[SCHEDULE_ROUTE]
                    if await answer_if_unchanged(probe_id, scope, send):
                        return
                    del scope["route"]  # FastAPI's router puts its own
        await self.app(scope, receive, send)


__all__ = ["HotPaths", "RouteLabel"]
