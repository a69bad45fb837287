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
from typing import Any, AnyStr, Generic

import anyio
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session
from starlette.types import Receive, Scope, Send

from iwscope.db import get_sessionmaker
from iwscope.dbslots import ReadSlot, open_read_slot

_DONE: Any = object()


class _Export(Generic[AnyStr]):
    """Chunks of ``produce(session)`` on a session of its own, made in a read slot's threads."""

    def __init__(self, slot: ReadSlot, produce: Callable[[Session], Iterator[AnyStr]]) -> None:
        self.slot = slot
        self.closed = False
        self.session = get_sessionmaker()()
        self.chunks = produce(self.session)

    def _next(self) -> AnyStr:
        return next(self.chunks, _DONE)

    async def first(self) -> AnyStr | None:
        chunk = await self.slot.run(self._next)
        return None if chunk is _DONE else chunk

    async def rest(self, first: AnyStr | None) -> AsyncIterator[AnyStr]:
        if first is None:
            return
        yield first
        while (chunk := await self.slot.run(self._next)) is not _DONE:
            yield chunk

    def _close_in_thread(self) -> None:
        try:
            close = getattr(self.chunks, "close", None)
            if close is not None:
                close()
        finally:
            self.session.close()

    async def close(self) -> None:
        """Close generator and session in a slot thread, then give the slot back (idempotent;
        shielded, so it also completes when the answer was cancelled)."""
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            try:
                await self.slot.run(self._close_in_thread)
            finally:
                self.slot.release()


class _SlotStreamingResponse(StreamingResponse):
    """A :class:`StreamingResponse` that closes its export once sending ends, however."""

    def __init__(self, export: _Export[Any], first: Any, **kwargs: Any) -> None:
        super().__init__(export.rest(first), **kwargs)
        self.export = export

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.export.close()


async def stream_read(produce: Callable[[Session], Iterator[AnyStr]], media_type: str,
                      headers: dict[str, str] | None = None) -> StreamingResponse:
    """The chunks of ``produce(session)`` as a streamed answer, read within a public read slot."""
    slot = await open_read_slot()
    try:
        export: _Export[AnyStr] = _Export(slot, produce)
    except BaseException:
        slot.release()
        raise
    try:
        first = await export.first()
    except BaseException:
        await export.close()
        raise
    return _SlotStreamingResponse(export, first, media_type=media_type, headers=headers)
