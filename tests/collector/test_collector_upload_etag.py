"""The schedule's ETag in a trial upload's answer never delays or fails the upload: the batch is
stored by the time the ETag is looked for, so the answer is 200 with the ETag unsaid (``""``:
the probe polls as before) when the schedules' snapshot is being read by another request or its
read finds the database busy.  In this process, through the API's own store (``ingest.store_upload``)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import httpx
import orjson
import pytest
from test_collector_db_overload import _batch_body, stored_counts
from testkit import Enrolled, enroll_probe

from iwscope import config, dbslots
from iwscope.auth.dependencies import Identity
from iwscope.probes import schedule_cache
from iwscope.trials import ingest, writer


def _identity(probe: Enrolled) -> Identity:
    return Identity("probe", uuid.UUID(probe.id), "test", "test")


def _answer(answer: ingest.UploadAnswer, body: bytes, accepted: int) -> dict[str, Any]:
    """The answer's JSON, checked to be a 200 accepting ``accepted`` records of ``body``."""
    assert answer.status == 200, answer
    decoded: dict[str, Any] = orjson.loads(answer.body)
    expected = {"batch_id": orjson.loads(body)["batch_id"], "accepted": accepted, "duplicates": 0}
    assert {key: decoded[key] for key in expected} == expected, decoded
    return decoded


def test_a_stored_upload_is_answered_200_when_its_schedule_etag_finds_the_database_busy(
    client: httpx.Client, enroll_token: str, database_url: str, in_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The upload is stored by its lane's own connection; the schedule's ETag then needs a slot
    # of the pool, and every slot is held here: the answer must still be 200 (stored means
    # acknowledged), with the ETag unsaid, not a 503 for records that were kept.
    monkeypatch.setenv("IWSCOPE_DB_POOL_TIMEOUT_S", "0.2")
    config.get_settings.cache_clear()
    probe = enroll_probe(client, enroll_token)
    body, ids = _batch_body(probe, 5)

    async def store_with_every_slot_held() -> ingest.UploadAnswer:
        schedule_cache.invalidate()
        async with contextlib.AsyncExitStack() as held:
            for _ in range(config.get_settings().db_connections):
                await held.enter_async_context(dbslots.db_slot())
            try:
                return await ingest.store_upload(ingest.TRIALS_PATH, _identity(probe), body)
            finally:
                await writer.close_group_writer()

    assert _answer(asyncio.run(store_with_every_slot_held()), body, 5)["schedule_etag"] == ""
    assert stored_counts(database_url, ids) == (5, 5, 5)


def test_an_upload_does_not_wait_for_another_requests_read_of_the_schedules(
    client: httpx.Client, enroll_token: str, database_url: str, in_process: None
) -> None:
    probe = enroll_probe(client, enroll_token)
    first, first_ids = _batch_body(probe, 3)
    second, second_ids = _batch_body(probe, 3)

    async def store_while_another_reads() -> tuple[ingest.UploadAnswer, ingest.UploadAnswer]:
        schedule_cache.invalidate()
        try:
            # Another request is reading the snapshot (it holds the readers' lock): the upload
            # is answered at once, its ETag unsaid (waiting, it would never finish here).
            async with schedule_cache.readers_lock():
                during = await asyncio.wait_for(ingest.store_upload(ingest.TRIALS_PATH, _identity(probe), first), 10)
            after = await ingest.store_upload(ingest.TRIALS_PATH, _identity(probe), second)  # reads it itself
            return during, after
        finally:
            await writer.close_group_writer()

    during, after = asyncio.run(store_while_another_reads())
    assert _answer(during, first, 3)["schedule_etag"] == ""
    assert _answer(after, second, 3)["schedule_etag"].startswith('"'), after  # a quoted ETag, as the route's
    assert stored_counts(database_url, first_ids + second_ids) == (6, 6, 6)
