"""The shared fixtures themselves work (real processes, real services)."""

from __future__ import annotations

import httpx


def test_api_server_answers_and_restarts(api_server, admin_token: str) -> None:
    assert httpx.get(f"{api_server.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{api_server.url}/readyz")
    assert ready.status_code == 200, ready.text
    fleet = httpx.get(f"{api_server.url}/api/v1/probes", headers={"Authorization": f"Bearer {admin_token}"})
    assert fleet.status_code == 200 and isinstance(fleet.json(), list)
    api_server.stop()
    assert not api_server.running()
    api_server.start()
    assert httpx.get(f"{api_server.url}/healthz").status_code == 200


def test_celery_worker_runs_tasks(celery_worker) -> None:
    outcome = celery_worker.send("iwscope.trials.tasks.sweep")
    assert outcome == {"joined": 0}
