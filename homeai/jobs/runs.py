"""Job runs in the store, with their progress, and the lock that makes one run of a job at a time.

A run is a `job_runs` row: status, items done and total, the current item, errors. Its
progress is written as it goes, so `GET /api/jobs` (or another process) can watch it.

`JobLock` is an exclusive `flock` on a file in the data directory, held for the whole run.
The kernel drops it when the process dies, however it dies (kill -9 included), so when a
new run takes the lock, any row of that job still marked "running" belongs to a dead
process: it is marked "interrupted", and the new run picks up where the files say
(documents written whole are not redone).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from homeai.store.models import JobRun, utcnow

MAX_ERRORS = 200  # a run over a broken disk should not grow one row without bound


class JobBusy(RuntimeError):
    """The job is already running (in this process or another)."""


class JobLock:
    _held: set[str] = set()  # flock is per open file: keep two threads of one process apart too
    _guard = threading.Lock()

    def __init__(self, folder: Path, job_name: str):
        self.path = folder / f"job-{job_name}.lock"
        self._fd: int | None = None

    def acquire(self) -> "JobLock":
        with self._guard:
            if str(self.path) in self._held:
                raise JobBusy("already running")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise JobBusy("already running in another process") from None
            self._fd = fd
            self._held.add(str(self.path))
        return self

    def release(self) -> None:
        with self._guard:
            if self._fd is not None:
                os.close(self._fd)  # closing the file drops the flock
                self._fd = None
                self._held.discard(str(self.path))


def start_run(sessions: sessionmaker[Session], job_name: str) -> int:
    """A new running row for `job_name` (call with its lock held); earlier 'running' rows were orphaned."""
    with sessions.begin() as session:
        session.execute(update(JobRun).where(JobRun.job_name == job_name, JobRun.status == "running")
                        .values(status="interrupted", finished_at=utcnow()))
        run = JobRun(job_name=job_name, status="running", items_done=0, errors=[])
        session.add(run)
        session.flush()
        return run.id


def orphaned(sessions: sessionmaker[Session], job_name: str) -> bool:
    """Whether the job's latest run never finished (its process died, or the server stopped mid-run)."""
    with sessions() as session:
        status = session.scalar(select(JobRun.status).where(JobRun.job_name == job_name)
                                .order_by(JobRun.id.desc()).limit(1))
    return status in ("running", "interrupted")


def recent_runs(session: Session, job_name: str, limit: int = 10) -> list[JobRun]:
    return list(session.scalars(select(JobRun).where(JobRun.job_name == job_name)
                                .order_by(JobRun.id.desc()).limit(limit)))


def run_dict(run: JobRun | None) -> dict | None:
    if run is None:
        return None
    return {"id": run.id, "job": run.job_name, "status": run.status,
            "started_at": run.started_at.isoformat(),
            "finished_at": run.finished_at.isoformat() if run.finished_at else None,
            "items_done": run.items_done, "items_total": run.items_total, "current_item": run.current_item,
            "errors": list(run.errors or [])}


class Progress:
    """One run's progress, handed to an optional callback at every move and written to its row
    at most every `WRITE_EVERY_S` (a run over thousands of unchanged files is not thousands of commits)."""

    WRITE_EVERY_S = 0.5

    def __init__(self, sessions: sessionmaker[Session], run_id: int,
                 callback: Callable[["Progress"], None] | None = None):
        self.sessions, self.run_id, self.callback = sessions, run_id, callback
        self.done, self.total, self.current = 0, 0, None
        self.errors: list[dict] = []
        self._written_at = 0.0

    def set_total(self, total: int) -> None:
        self.total = total
        self._moved(force=True)

    def working_on(self, item: str) -> None:
        self.current = item
        self._moved()

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._moved()

    def error(self, item: str, message: str) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append({"item": item, "error": message[:500]})
        self._moved(force=True)

    def finish(self, status: str) -> None:
        self.current = None
        self._write(status=status, finished_at=utcnow())
        if self.callback is not None:
            self.callback(self)

    def _moved(self, force: bool = False) -> None:
        if force or time.monotonic() - self._written_at >= self.WRITE_EVERY_S:
            self._write()
        if self.callback is not None:
            self.callback(self)

    def _write(self, **values) -> None:
        self._written_at = time.monotonic()
        with self.sessions.begin() as session:
            session.execute(update(JobRun).where(JobRun.id == self.run_id).values(
                items_done=self.done, items_total=self.total, current_item=self.current,
                errors=list(self.errors), **values))
