"""Roll-up refreshes are requested once per burst of joins (``worker_client.queue_rollup_refresh``).

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
    client.delete("iwscope:analysis:refresh-queued")
    try:
        result = subprocess.run([sys.executable, "-c", SCRIPT], env={**service_env, "IWSCOPE_CELERY_QUEUE": queue},
                                capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.strip().splitlines()[-1]) == [True, False, False, True, False]
        assert client.llen(queue) == 2  # two messages on the broker, not five
        assert client.ttl("iwscope:analysis:refresh-queued") > 0  # a lost refresh blocks others only a while
    finally:
        client.delete(queue, "iwscope:analysis:refresh-queued")
        client.close()
