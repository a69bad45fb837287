"""Worker requests coalesce: one roll-up refresh per burst of joins, one join drain per burst of uploads.

Run in a subprocess with the session's services: the Celery app reads its broker from the
environment when it is imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import redis

SCRIPT = """
import json
import iwscope.analysis.tasks  # registers the refresh task, as the worker does
from iwscope import worker_client as wc
outcome = [wc.queue_rollup_refresh(), wc.queue_rollup_refresh(0), wc.queue_rollup_refresh()]
wc.rollup_refresh_started()  # the queued refresh has begun: the next join needs another
outcome += [wc.queue_rollup_refresh(), wc.queue_rollup_refresh()]
print(json.dumps(outcome))
"""


def test_one_refresh_is_queued_per_burst_of_requests(service_env: dict[str, str], redis_url: str) -> None:
    queue = f"iwscope-rollup-requests-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    client.delete(f"iwscope:{queue}:refresh-queued")
    try:
        result = subprocess.run(
            [sys.executable, "-c", SCRIPT],
            env={**service_env, "IWSCOPE_CELERY_QUEUE": queue},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.strip().splitlines()[-1]) == [True, False, False, True, False]
        assert client.llen(queue) == 2  # two messages on the broker, not five
        assert client.ttl(f"iwscope:{queue}:refresh-queued") > 0  # a lost refresh blocks others only a while
    finally:
        client.delete(queue, f"iwscope:{queue}:refresh-queued")
        client.close()


JOIN_SCRIPT = """
import json
from iwscope import worker_client as wc
wc.queue_join(["t1", "t2"])
wc.queue_join(["t3"])
wc.queue_join(["t4"])
wc.queue_join(["t5"])
taken = wc.join_drain_started(3)  # the drain starts and takes three batches
wc.queue_join(["t6"])  # arrives while it runs: another drain is queued
print(json.dumps({"taken": taken, "left": wc.pending_joins()}))
"""


def test_stored_batches_wait_in_one_list_for_one_drain(service_env: dict[str, str], redis_url: str) -> None:
    """Four uploads queue one drain message, not four; the drain takes batches in order, at
    most as many as it asked for; a batch after the drain started queues one more."""
    queue = f"iwscope-join-requests-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    keys = (f"iwscope:{queue}:join-pending", f"iwscope:{queue}:join-drain-queued")
    client.delete(*keys)
    try:
        result = subprocess.run(
            [sys.executable, "-c", JOIN_SCRIPT],
            env={**service_env, "IWSCOPE_CELERY_QUEUE": queue},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        outcome = json.loads(result.stdout.strip().splitlines()[-1])
        assert outcome["taken"] == [{"t": ["t1", "t2"]}, {"t": ["t3"]}, {"t": ["t4"]}]
        assert outcome["left"] == 2
        assert client.llen(queue) == 2  # one drain before it started, one after
        messages = [json.loads(raw)["headers"]["task"] for raw in client.lrange(queue, 0, -1)]
        assert messages == ["iwscope.trials.tasks.drain_joins"] * 2
    finally:
        client.delete(queue, *keys)
        client.close()


FAILED_DRAIN_SCRIPT = """
import json
from iwscope import worker_client as wc
from iwscope.trials import tasks
wc.queue_join(["t1"])
wc.queue_join(["t2", "t3"])
wc.queue_join(["t4"])
def database_gone(trial_ids):
    raise RuntimeError("database gone")
tasks._join = database_gone
try:
    tasks.drain_joins()
except RuntimeError as error:
    failed = str(error)
left = wc.join_drain_started(10)  # what the next drain finds
print(json.dumps({"failed": failed, "left": left}))
"""


def test_a_drain_that_fails_puts_its_batches_back_in_order(service_env: dict[str, str], redis_url: str) -> None:
    queue = f"iwscope-join-failed-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    keys = (f"iwscope:{queue}:join-pending", f"iwscope:{queue}:join-drain-queued")
    try:
        result = subprocess.run(
            [sys.executable, "-c", FAILED_DRAIN_SCRIPT],
            env={**service_env, "IWSCOPE_CELERY_QUEUE": queue},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        outcome = json.loads(result.stdout.strip().splitlines()[-1])
        assert outcome["failed"] == "database gone"
        assert outcome["left"] == [{"t": ["t1"]}, {"t": ["t2", "t3"]}, {"t": ["t4"]}]
    finally:
        client.delete(queue, *keys)
        client.close()
