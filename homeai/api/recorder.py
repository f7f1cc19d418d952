"""Finished requests into the store's `request_stats`, written in batches by one thread.

The engine calls `put` from its loop (`engine.on_finish`): it only queues. A thread drains
the queue every `interval_s` and commits what it found in one transaction, so neither the
engine thread nor the event loop ever waits on the database.
"""

from __future__ import annotations

import logging
import queue
import threading

from sqlalchemy.orm import Session, sessionmaker

from homeai.engine.stats import RequestStats
from homeai.store.models import RequestStat

log = logging.getLogger("homeai.api")

_STOP = object()


class StatsRecorder:
    def __init__(self, sessions: sessionmaker[Session], *, interval_s: float = 0.5, max_batch: int = 512):
        self.sessions = sessions
        self.interval_s = interval_s
        self.max_batch = max_batch
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.num_written = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="homeai-stats", daemon=True)

    def start(self) -> "StatsRecorder":
        self._thread.start()
        return self

    def put(self, stats: RequestStats) -> None:
        self.queue.put(stats)

    def stop(self, timeout: float = 5.0) -> None:
        """Write what is queued, then end the thread."""
        self._stopping.set()
        self.queue.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            batch = [self.queue.get()]
            self._stopping.wait(self.interval_s)  # let a batch gather, unless stopping
            while len(batch) < self.max_batch and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            self._write([item for item in batch if item is not _STOP])
            if self._stopping.is_set() and self.queue.empty():
                return

    def _write(self, batch: list[RequestStats]) -> None:
        if not batch:
            return
        rows = [RequestStat(request_id=s.request_id, lane=s.lane, member=s.member, prompt_tokens=s.prompt_tokens,
                            output_tokens=s.output_tokens, queue_ms=s.queue_ms, ttft_ms=s.ttft_ms,
                            e2e_ms=s.e2e_ms, preemptions=s.preemptions, outcome=s.outcome)
                for s in batch]
        try:
            with self.sessions() as session:
                session.add_all(rows)
                session.commit()
            self.num_written += len(rows)
        except Exception:  # statistics are not worth failing requests or the server for
            log.exception("could not record %d request statistics", len(rows))
