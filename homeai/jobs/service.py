"""The jobs the daemon runs in the background, what the API and the CLI call to run them.

    service = JobService(cfg, service.work, sessions).start()   # homeai.app: the program's jobs
    service.run_now("index")            # POST /api/jobs/index/run: a thread, returns the run
    service.run("index", paths=[...])   # homeai index: in this thread, with a progress callback
    await service.search("tax 2023")    # GET /api/search
    await service.build_document_context(question)   # chat with "documents": true
    service.shutdown()                  # the program's stop, before the engine stops

Schedules are APScheduler 3 jobs in a `SQLAlchemyJobStore` on the same database, so they
survive restarts: a job whose schedule is unchanged keeps its stored next run time, and a
run missed while the box was off starts on restart if no later than `misfire_grace_s`
(several missed runs coalesce into one). A run left unfinished by a crash or a stop is
resumed when the service starts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from homeai.config import Config
from homeai.cron import parse_schedule
from homeai.jobs.indexer import Indexer, Report, Stopped
from homeai.jobs.runs import JobBusy, JobLock, Progress, orphaned, recent_runs, run_dict, start_run
from homeai.jobs.scope import root_path
from homeai.jobs.search import Hit, Searcher
from homeai.jobs.summarise import Summariser
from homeai.service.background import EngineStopped, Work
from homeai.store.models import Chunk, Document, JobRun

log = logging.getLogger("homeai.jobs")

JOBS = {"index": "read the configured folders: index new and changed documents, drop deleted ones, summarise"}
JOB_FUNC = "homeai.jobs.service:run_scheduled"  # the job store keeps a function's name, not an object
ENGINE_WAIT_S = 900.0  # a scheduled or resumed run waits this long for the model to load

__all__ = ["JobService", "JobBusy", "UnknownJob", "EngineNotReady", "JOBS"]

_active: "JobService | None" = None


class UnknownJob(KeyError):
    pass


class EngineNotReady(RuntimeError):
    pass


def run_scheduled(name: str) -> None:
    """What APScheduler calls: the job `name` of this process's running service."""
    service = _active
    if service is None:
        log.warning("scheduled job %s fired with no job service running", name)
        return
    try:
        service.run(name, wait_for_engine=True)
    except JobBusy:
        log.info("scheduled job %s skipped: already running", name)


class JobService:
    def __init__(self, cfg: Config, work, sessions: sessionmaker[Session]):
        self.cfg, self.sessions = cfg, sessions
        # The program loads its model in the background: take the service's getter (`service.work`,
        # None while loading), or the work itself.
        self.work: Callable[[], Work | None] = work if callable(work) else (lambda: work)
        self.searcher = Searcher(sessions, self.work)
        self.scheduler: BackgroundScheduler | None = None
        self._stop = threading.Event()
        self._threads: dict[str, threading.Thread] = {}

    # ---- lifecycle -------------------------------------------------------------

    def start(self) -> "JobService":
        global _active
        _active = self
        grace = self.cfg.jobs.misfire_grace_s
        store = SQLAlchemyJobStore(engine=self.sessions.kw["bind"], tablename="apscheduler_jobs")
        self.scheduler = BackgroundScheduler(
            jobstores={"default": store}, executors={"default": ThreadPoolExecutor(max_workers=len(JOBS))},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": grace})
        self.scheduler.start(paused=True)
        self._sync_schedule(grace)
        self.scheduler.resume()
        for name in JOBS:
            # A killed `homeai index PATH` over other folders is resumed by running it again.
            if self.cfg.jobs.index_paths and orphaned(self.sessions, name):
                log.info("resuming the unfinished %s run", name)
                try:
                    self._spawn(name, wait_for_engine=True)
                except JobBusy:  # `homeai index` is running it right now
                    log.info("the %s run is going on in another process", name)
        return self

    def _sync_schedule(self, grace: int) -> None:
        for name in JOBS:
            trigger = parse_schedule(self.cfg.jobs.schedule) if self.cfg.jobs.schedule else None
            stored = self.scheduler.get_job(name)
            if trigger is None:
                if stored is not None:
                    stored.remove()
                continue
            if stored is not None and str(stored.trigger) == str(trigger) and stored.misfire_grace_time == grace:
                continue  # keep its next run time: a run missed while the box was off still happens
            self.scheduler.add_job(JOB_FUNC, trigger, args=[name], id=name, name=name, replace_existing=True,
                                   misfire_grace_time=grace, coalesce=True, max_instances=1)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop scheduling, ask running jobs to stop (each marks its run interrupted), wait for them."""
        global _active
        self._stop.set()
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        for thread in list(self._threads.values()):
            thread.join(timeout)
        if _active is self:
            _active = None

    # ---- running jobs ----------------------------------------------------------------

    def run_now(self, name: str) -> dict:
        """Start a run in a thread and return it; UnknownJob, JobBusy or EngineNotReady."""
        self._check(name)
        if self.work() is None:
            raise EngineNotReady("the model is still loading; retry shortly")
        return self._spawn(name, wait_for_engine=False)

    def _spawn(self, name: str, *, wait_for_engine: bool) -> dict:
        lock = self._lock(name).acquire()
        try:
            run_id = start_run(self.sessions, name)
        except BaseException:
            lock.release()
            raise

        def target() -> None:
            try:
                self._execute(name, run_id, wait_for_engine=wait_for_engine)
            finally:
                lock.release()
                self._threads.pop(name, None)

        thread = threading.Thread(target=target, name=f"homeai-job-{name}", daemon=True)
        self._threads[name] = thread
        thread.start()
        return self.run_info(run_id)

    def run(self, name: str, *, paths: list[str] | None = None, summarise: bool | None = None,
            on_progress: Callable[[Progress], None] | None = None, wait_for_engine: bool = False) -> int:
        """Run the job in this thread; its run id (its row says how it ended). JobBusy if running."""
        self._check(name)
        lock = self._lock(name).acquire()
        try:
            run_id = start_run(self.sessions, name)
            self._threads.setdefault(name, threading.current_thread())
            self._execute(name, run_id, paths=paths, summarise=summarise, on_progress=on_progress,
                          wait_for_engine=wait_for_engine)
            return run_id
        finally:
            if self._threads.get(name) is threading.current_thread():
                self._threads.pop(name)
            lock.release()

    def _execute(self, name: str, run_id: int, *, paths: list[str] | None = None, summarise: bool | None = None,
                 on_progress=None, wait_for_engine: bool = False) -> Report | None:
        progress = Progress(self.sessions, run_id, on_progress)
        work = self._wait_for_engine() if wait_for_engine else self.work()
        if work is None:
            progress.error(name, "the model is not loaded")
            progress.finish("interrupted" if self._stop.is_set() else "failed")
            return None
        roots = [root_path(p) for p in (paths or self.cfg.jobs.index_paths)]
        if not roots:
            progress.error(name, "no folders to index: set jobs.index_paths or name them")
            progress.finish("failed")
            return None
        do_summaries = self.cfg.jobs.summarise if summarise is None else summarise
        summariser = Summariser(work, max_tokens=self.cfg.jobs.summary_tokens) if do_summaries else None
        indexer = Indexer(work, self.sessions, self.cfg.jobs, limits=self.cfg.limits, summariser=summariser,
                          stop=self._stop)
        try:
            report = indexer.run(roots, progress)
        except (Stopped, EngineStopped):
            progress.finish("interrupted")
            return None
        except KeyboardInterrupt:  # Ctrl-C on `homeai index`: the next run resumes
            progress.finish("interrupted")
            raise
        except Exception as e:
            log.exception("job %s failed", name)
            progress.error(name, f"{type(e).__name__}: {e}")
            progress.finish("failed")
            return None
        progress.finish("done")
        log.info("job %s done: %s", name, report)
        return report

    def _wait_for_engine(self):
        deadline = time.monotonic() + ENGINE_WAIT_S
        while (work := self.work()) is None and not self._stop.is_set() and time.monotonic() < deadline:
            self._stop.wait(0.5)
        return work

    def _check(self, name: str) -> None:
        if name not in JOBS:
            raise UnknownJob(f"no job named {name!r} (jobs: {', '.join(JOBS)})")

    def _lock(self, name: str) -> JobLock:
        return JobLock(self.cfg.data_dir / "locks", name)

    # ---- what the API shows -------------------------------------------------------

    def run_info(self, run_id: int) -> dict | None:
        with self.sessions() as session:
            return run_dict(session.get(JobRun, run_id))

    def jobs(self) -> dict:
        """Every job with its schedule, next run and recent runs; the index's document counts."""
        out = []
        with self.sessions() as session:
            for name, description in JOBS.items():
                runs = [run_dict(r) for r in recent_runs(session, name)]
                stored = self.scheduler.get_job(name) if self.scheduler is not None and self.scheduler.running else None
                next_run = stored.next_run_time.isoformat() if stored and stored.next_run_time else None
                out.append({"name": name, "description": description, "schedule": self.cfg.jobs.schedule or None,
                            "next_run_at": next_run, "paths": list(self.cfg.jobs.index_paths),
                            "running": bool(runs) and runs[0]["status"] == "running",
                            "last_run": runs[0] if runs else None, "runs": runs})
            return {"jobs": out, "documents": _document_counts(session)}

    async def search(self, query: str, k: int = 5) -> list[Hit]:
        return await self.searcher.search(query, k)

    async def build_document_context(self, query: str, k: int = 5) -> tuple[str, list[dict]]:
        """(system_text, citations) for a chat answer that uses the household's documents."""
        return await self.searcher.document_context(query, k)


def _document_counts(session: Session) -> dict:
    by_status = dict(session.execute(select(Document.status, func.count()).group_by(Document.status)).all())
    return {"indexed": by_status.get("indexed", 0), "skipped": by_status.get("skipped", 0),
            "summarised": session.scalar(select(func.count()).where(Document.summary.is_not(None))) or 0,
            "chunks": session.scalar(select(func.count(Chunk.id))) or 0}
