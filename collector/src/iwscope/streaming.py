"""Streamed answers read from the database inside a public read slot (:mod:`iwscope.dbslots`).

A CSV export can run for minutes on a server-side cursor.  :func:`stream_read` takes a read
slot (or answers 503 + ``Retry-After`` via :class:`~iwscope.dbslots.DatabaseBusy`), runs the
query and makes the first chunk *before* the answer starts -- so a busy database or a failing
query still gets a proper status -- then sends the rest, each chunk made in the slot's
threads, and gives cursor, session and slot back however sending ends: done, client gone
before the first byte or midway, server shutting down.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack
from typing import Any, AnyStr

import anyio
import anyio.to_thread
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session
from starlette.types import Receive, Scope, Send

from iwscope.db import get_sessionmaker
from iwscope.dbslots import db_slot

_DONE: Any = object()


class _SlotStreamingResponse(StreamingResponse):
    """A :class:`StreamingResponse` that gives back what ``held`` holds (generator, session,
    slot) once sending ends, however; shielded, so a cancelled answer still does it."""

    def __init__(self, chunks: AsyncIterator[Any], held: AsyncExitStack, **kwargs: Any) -> None:
        super().__init__(chunks, **kwargs)
        self.held = held

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.held.aclose()


async def stream_read(
    produce: Callable[[Session], Iterator[AnyStr]], media_type: str, headers: dict[str, str] | None = None
) -> StreamingResponse:
    """The chunks of ``produce(session)`` as a streamed answer, read within a public read slot."""
    held = AsyncExitStack()
    limiter = await held.enter_async_context(db_slot(read=True))

    async def in_slot(function: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(function, *args, limiter=limiter)

    try:
        session = get_sessionmaker()()
        chunks = produce(session)

        def close() -> None:  # generator first (its cursor), then the session
            try:
                getattr(chunks, "close", lambda: None)()
            finally:
                session.close()

        # Unwound before the slot is given back (last in, first out).
        held.push_async_callback(in_slot, close)
        first = await in_slot(next, chunks, _DONE)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await held.aclose()
        raise

    async def rest() -> AsyncIterator[AnyStr]:
        chunk = first
        while chunk is not _DONE:
            yield chunk
            chunk = await in_slot(next, chunks, _DONE)

    return _SlotStreamingResponse(rest(), held, media_type=media_type, headers=headers)
