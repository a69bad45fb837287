"""Several API processes on the same listening sockets, each a lame duck on SIGTERM.

``iwscope api --workers N`` (N > 1) runs this supervisor instead of one server.  Why not
uvicorn's own process manager: its workers are plain ``uvicorn.Server``s (no draining period,
so a rolling update would cut in-flight uploads and keep receiving new ones until the kill)
and each keeps its own Prometheus registry (a scrape would see one random worker's counters).

Here:

* every worker is a spawned process running :class:`iwscope.server.LameDuckServer` on the
  inherited sockets: the kernel spreads connections over the workers, admission
  (:mod:`iwscope.admission`) and the database pool are per worker;
* SIGTERM / SIGINT to the supervisor is forwarded to every worker, which answers ``/readyz``
  with 503 for ``IWSCOPE_DRAIN_SECONDS`` and then finishes its requests; the supervisor waits
  for them (killing only a worker still alive ``drain + GRACE_S`` later);
* a worker that dies is replaced, unless it died before it listened (the same error would
  repeat: a bad TLS key, an unloadable app), which stops the whole API with status 3;
* metrics are collected across workers through ``PROMETHEUS_MULTIPROC_DIR`` (a private
  temporary directory unless one is given), so ``/metrics`` of any worker reports the sums.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pathlib
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as EventType
from types import FrameType

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from iwscope.server import LameDuckServer

log = logging.getLogger(__name__)

#: Seconds a worker may take after its draining period before it is killed.
GRACE_S = 30.0


def _worker_main(config: uvicorn.Config, sockets: list[socket.socket], drain_seconds: float, started: EventType) -> None:
    """Body of one worker process (spawned: it imports the app itself); sets ``started`` once it listens."""
    config.configure_logging()
    server = LameDuckServer(config, drain_seconds, on_started=started.set)
    server.run(sockets=sockets)
    if not server.started:
        sys.exit(STARTUP_FAILURE)


class Supervisor:
    """Keeps ``workers`` API processes serving ``sockets`` until SIGTERM / SIGINT."""

    def __init__(self, config: uvicorn.Config, sockets: Sequence[socket.socket], workers: int, drain_seconds: float) -> None:
        self.config = config
        self.sockets = list(sockets)
        self.workers = workers
        self.drain_seconds = drain_seconds
        self._context = multiprocessing.get_context("spawn")
        self._processes: list[tuple[BaseProcess, EventType]] = []
        self._stop = threading.Event()
        self.exit_code = 0

    def _start_one(self) -> tuple[BaseProcess, EventType]:
        started = self._context.Event()
        process = self._context.Process(
            target=_worker_main, name="iwscope-api-worker", args=(self.config, self.sockets, self.drain_seconds, started)
        )
        process.start()
        log.info("API worker %d started", process.pid)
        return process, started

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self._stop.is_set():
            log.info(
                "%s: stopping %d API workers (each drains %.1f s first)",
                signal.Signals(signum).name,
                len(self._processes),
                self.drain_seconds,
            )
        self._stop.set()

    def _replace_dead(self) -> None:
        from prometheus_client import multiprocess

        for index, (process, started) in enumerate(self._processes):
            if process.is_alive() or self._stop.is_set():
                continue
            if process.pid is not None and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                multiprocess.mark_process_dead(process.pid)
            if not started.is_set():
                log.error("API worker %s failed to start (exit %s): stopping", process.pid, process.exitcode)
                self.exit_code = STARTUP_FAILURE
                self._stop.set()
                return
            log.warning("API worker %s died (exit %s): starting another", process.pid, process.exitcode)
            self._processes[index] = self._start_one()

    def _stop_all(self) -> None:
        for process, _ in self._processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.drain_seconds + GRACE_S
        for process, _ in self._processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.error("API worker %s still alive after draining: killed", process.pid)
                process.kill()
                process.join()

    def run(self) -> int:
        """Serve until told to stop; returns the exit status for the command."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        self._processes = [self._start_one() for _ in range(self.workers)]
        while not self._stop.wait(0.5):
            self._replace_dead()
        self._stop_all()
        return self.exit_code


def run_workers(config: uvicorn.Config, sockets: Sequence[socket.socket], workers: int, drain_seconds: float) -> int:
    """Run ``workers`` API processes with metrics shared through a multiprocess directory (a
    given one is emptied first: files of an earlier run would be summed in)."""
    private_dir = None
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        for stale in pathlib.Path(given).glob("*.db"):
            stale.unlink(missing_ok=True)
    else:
        private_dir = tempfile.mkdtemp(prefix="iwscope-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = private_dir
    try:
        return Supervisor(config, sockets, workers, drain_seconds).run()
    finally:
        if private_dir is not None:
            shutil.rmtree(private_dir, ignore_errors=True)
