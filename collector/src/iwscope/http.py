"""HTTP helpers shared by the routes: bounded body reading, conditional requests, plain ASGI answers."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import HTTPException, Request, status
from fastapi.responses import JSONResponse
from starlette.types import Scope, Send

from iwprobe import wire


async def read_body_limited(request: Request, limit: int = wire.MAX_BODY_BYTES) -> bytes:
    """The request body, refusing (413) anything above ``limit`` bytes without buffering it.

    A declared ``Content-Length`` above the limit is refused before reading; a chunked or
    lying body is counted while it streams and refused as soon as it passes the limit.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            declared_bytes = int(declared)
        except ValueError:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, detail="bad Content-Length") from None
        if declared_bytes > limit:
            raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, detail=f"request body over {limit} bytes")
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, detail=f"request body over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header names ``etag`` (weak or strong) or ``*``: the
    answer is then 304 without a body (probe schedules, server configurations)."""
    if not if_none_match:
        return False
    candidates = {tag.strip().removeprefix("W/") for tag in if_none_match.split(",")}
    return etag in candidates or "*" in candidates


#: Body of a 503 answered because no database connection became free in time.
DATABASE_BUSY_DETAIL = "collector overloaded: no database connection free in time; retry later"


def database_busy_response(retry_after_s: int) -> JSONResponse:
    """503 + ``Retry-After``: nothing of the request was stored, the client should come back."""
    return JSONResponse(
        status_code=503,
        content={"detail": DATABASE_BUSY_DETAIL, "retry_after_s": retry_after_s},
        headers={"Retry-After": str(retry_after_s)},
    )


def header(scope: Scope, name: bytes) -> str | None:
    """The first request header ``name`` (lower case) of an ASGI ``scope``, if any."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


async def send_answer(send: Send, status_code: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
    """Answer a request over plain ASGI (the hot paths of :mod:`iwscope.hotpaths`), with
    ``Content-Length`` unless the status has no body (``304``), as Starlette's ``Response`` does."""
    raw_headers = [] if status_code == 304 else [(b"content-length", str(len(body)).encode())]
    raw_headers.extend((name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in (headers or {}).items())
    await send({"type": "http.response.start", "status": status_code, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status_code: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
    """A JSON answer over plain ASGI (``body`` already serialised)."""
    await send_answer(send, status_code, body, {"Content-Type": "application/json", **(headers or {})})
