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
taken = wc.take_pending_joins(3)  # the drain runs and takes three batches
wc.queue_join(["t6"])  # arrives while it runs: rides on it, no message of its own
messages_while_running = wc._redis().llen(wc.task_queue())
more = wc.take_pending_joins(1)  # the running drain takes the next one
waiting = wc.join_drain_ended()  # it ends with a batch left: its caller queues a drain
if waiting:
    wc.queue_join_drain()
wc.take_pending_joins(10)  # that drain takes what is left ...
ended_empty = wc.join_drain_ended()  # ... and ends with nothing waiting
wc.queue_join(["t7"])  # after it ended: a message again
print(json.dumps({"taken": taken, "more": more, "waiting": waiting, "ended_empty": ended_empty,
                  "messages_while_running": messages_while_running, "left": wc.pending_joins()}))
"""


def test_stored_batches_wait_in_one_list_for_one_drain(service_env: dict[str, str], redis_url: str) -> None:
    """Four uploads queue one drain message, not four; the drain takes batches in order, at
    most as many as it asked for; a batch while it runs sends no message (the drain takes it,
    or queues one drain for it as it ends); a batch after it ended queues one more."""
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
        assert outcome["messages_while_running"] == 1  # the first upload's, none for t6
        assert outcome["more"] == [{"t": ["t5"]}]
        assert outcome["waiting"] is True and outcome["ended_empty"] is False
        assert outcome["left"] == 1  # t7, with its own drain message
        assert client.llen(queue) == 3  # the first upload's, the ending drain's, t7's
        messages = [json.loads(raw)["headers"]["task"] for raw in client.lrange(queue, 0, -1)]
        assert messages == ["iwscope.trials.tasks.drain_joins"] * 3
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
mark_left = bool(wc._redis().exists(wc.key(wc.JOIN_DRAIN_QUEUED)))
left = wc.take_pending_joins(10)  # what the next drain finds
print(json.dumps({"failed": failed, "left": left, "mark_left": mark_left}))
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
        assert outcome["mark_left"] is False  # the next upload (or the sweep) queues a drain
    finally:
        client.delete(queue, *keys)
        client.close()


LINGER_SCRIPT = """
import json, threading, time, uuid
from iwscope import worker_client as wc
from iwscope.trials import tasks
first, second = str(uuid.uuid4()), str(uuid.uuid4())
wc.queue_join([first])  # queues the drain (one message)
late = threading.Timer(tasks.DRAIN_LINGER_S / 4, wc.queue_join, args=([second],))
late.start()  # comes while the drain lingers: rides on it
outcome = tasks.drain_joins()
late.join()
print(json.dumps({"drain": outcome, "messages": wc._redis().llen(wc.task_queue()), "left": wc.pending_joins(),
                  "mark": bool(wc._redis().exists(wc.key(wc.JOIN_DRAIN_QUEUED)))}))
"""


def test_a_drain_takes_the_batches_that_come_while_it_lingers(service_env: dict[str, str], redis_url: str) -> None:
    """The real drain (its join against the session's database): a batch stored within its
    linger is joined by it, its upload sent no message, and the drain ends with its mark gone."""
    queue = f"iwscope-join-linger-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    keys = (f"iwscope:{queue}:join-pending", f"iwscope:{queue}:join-drain-queued")
    try:
        result = subprocess.run(
            [sys.executable, "-c", LINGER_SCRIPT],
            env={**service_env, "IWSCOPE_CELERY_QUEUE": queue},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        outcome = json.loads(result.stdout.strip().splitlines()[-1])
        assert outcome["drain"] == {"batches": 2, "joined": 0}  # no such trials: nothing to join
        assert outcome["messages"] == 1 and outcome["left"] == 0 and outcome["mark"] is False
    finally:
        client.delete(queue, *keys)
        client.close()
