"""The engine: the one loop (schedule, run, update) in its own thread, and the async bridge.

`submit()` validates a request, queues it with the scheduler (or refuses it: a full lane
queue, an oversized prompt) and hands back a `RequestStream` of events that asyncio code
iterates with `async for` and plain code with `for` (`intake.py`, `stream.py`). `abort()` frees a
request's sequence within one step. The scheduler is only touched under one lock; the runner works
outside it, so submissions and aborts never wait for a step to finish. A step's events reach their
asyncio readers with one wake-up per event loop, made just before the next decode, so the
readers run while llama.cpp computes instead of taking the GIL from the loop token by token;
background readers alone are woken at most every `BACKGROUND_WAKE_S` (a job reads its answer whole).
Planning each step while the one before computes (`plan_ahead`) is a mode of the one loop.

A failed step fails its own requests and the loop goes on; but a loop that ends by any
exception, or a runner that fails `MAX_FAILED_STEPS` steps in a row, is the engine's death:
every request in flight ends with "error", nothing more is admitted (`EngineStopped`), and
the `on_death` callbacks hear why (the daemon then exits non-zero, for systemd to restart it).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
import logging
import threading
import time
from collections import deque
from contextlib import contextmanager
from concurrent.futures import Future
from collections.abc import Callable

from homeai.engine.errors import EngineBroken, EngineStopped, InvalidRequest, PromptTooLong
from homeai.engine.intake import Intake
from homeai.engine.state import EngineState, PromptCacheUse, engine_state
from homeai.engine.stats import LaneWindow, RequestStats
from homeai.engine.stream import FinishEvent, RequestStream, TokenEvent, wake_all
from homeai.engine.gpu import plans_ahead
from homeai.engine.kvsize import without_model
from homeai.sched.request import Kind, Pool, Request
from homeai.sched.plan import new_tuple
from homeai.sched.draft import DraftSettings
from homeai.sched.prefix import Memory
from homeai.sched.scheduler import Output, QueueFull, Scheduler, SchedulerLimits, StepPlan
from lanes.base import LanePolicy

log = logging.getLogger("homeai.engine")

MAX_FAILED_STEPS = 3  # a runner failing this many steps in a row, with none served between, is broken
BACKGROUND_WAKE_S = 0.05  # background readers are woken at most this often while steps run

__all__ = ["Engine", "RequestStream", "TokenEvent", "FinishEvent", "InvalidRequest", "PromptTooLong",
           "QueueFull", "EngineStopped", "EngineBroken"]


class Engine(Intake):
    """The loop thread over one scheduler and one runner; requests come in through `Intake`."""

    def __init__(self, runner, policies: dict[str, LanePolicy], limits: SchedulerLimits,
                 clock: Callable[[], float] = time.monotonic, plan_ahead: bool = False,
                 drafting: DraftSettings = DraftSettings()):
        self.runner = runner
        # Plan each step while the one before computes (`_loop`): the runner must `launch` and `collect`.
        self.plan_ahead = plan_ahead
        self.policies = policies
        # where the model's sequences may be resumed (a sliding window's, a recurrent state's: prefix.Memory)
        self.scheduler = Scheduler(policies, limits, memory=getattr(runner, "kv_memory", None) or Memory(),
                                   drafting=drafting)  # (`[speculative]`: `draft_settings`)
        self.clock = clock
        self.max_seq_len = self.scheduler.max_seq_len(Pool.MAIN)  # the main cache's longest sequence
        self.interactive_max_seq_len = self.scheduler.max_seq_len(self.scheduler.layout.interactive_pool)
        self.embed_max_tokens = min(runner.info.embed_max_tokens, limits.embed_max_tokens)
        # The loop enters the condition's own lock directly, twice a step (a Condition's `with` is two
        # more Python calls); everything else takes `lock`.
        self._mutex = threading.RLock()
        self.lock = threading.Condition(self._mutex)
        self.streams: dict[str, RequestStream] = {}
        self.windows = {name: LaneWindow() for name in policies}
        self.on_finish: list[Callable[[RequestStats], None]] = []
        self.on_death: list[Callable[[str], None]] = []  # called once, from the dying loop thread
        self.failure: str | None = None  # why the loop died, once it has
        self.counters = {"rejected": {name: 0 for name in policies}, "steps": 0, "step_tokens": 0,
                         "planned_ahead": 0}  # steps planned while the one before computed
        self.prompt_cache = {name: PromptCacheUse() for name in policies}  # per lane, since the start
        self.member_prompt_cache: dict[tuple[str, str], PromptCacheUse] = {}  # per (lane, member): a member's own
        self._ids = itertools.count()
        self._calls: deque = deque()  # call_in_loop() work, run between steps
        self._to_wake: dict[RequestStream, None] = {}  # streams given events, their readers not yet woken (each once)
        self._background_woken = 0.0  # when background readers were last woken (`_wake_readers`)
        self._finished_waiting = False  # a finish among the events not yet woken: its reader waits for it
        self._interactive_waiting = False  # an interactive reader's event among them: it is woken at once
        self._background_holds = 0  # background_paused() blocks open: only interactive work steps
        self._accepting = True
        self._stop = False
        self._thread: threading.Thread | None = None
        self._thread_id: int | None = None  # the loop thread's ident, once it runs (`_send` asks it per event)

    # ---- lifecycle -------------------------------------------------------------

    def start(self) -> "Engine":
        self.runner.reset()
        self._thread = threading.Thread(target=self._run, name="homeai-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Admit nothing more, end every request with 'abort', and join the loop."""
        with self.lock:
            self._accepting = False
            for request_id in list(self.streams):
                self._abort_locked(request_id, "abort")
            self._stop = True
            self.lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- the loop --------------------------------------------------------------

    def call_in_loop(self, fn: Callable, timeout: float | None = None):
        """Run `fn(runner)` on the engine thread between steps (llama.cpp's thread pool belongs to
        the thread that decodes: benchmarks compare on the same thread)."""
        future: Future = Future()
        with self.lock:
            if self.failure:
                raise EngineStopped(f"the engine stopped: {self.failure}")
            self._calls.append((fn, future))
            self.lock.notify_all()
        return future.result(timeout)

    @contextmanager
    def background_paused(self):
        """While open, steps run only when interactive work is there: a spoken question's
        speech-to-text shares the CPU's cores with llama.cpp, and a background step beside it
        slows the transcription several times over. Background work waits, its cells kept."""
        with self.lock:
            self._background_holds += 1
        try:
            yield
        finally:
            with self.lock:
                self._background_holds -= 1
                self.lock.notify_all()

    def _run_calls(self) -> None:
        while self._calls:
            fn, future = self._calls.popleft()
            try:
                future.set_result(fn(self.runner))
            except Exception as exc:
                future.set_exception(exc)

    def _run(self) -> None:
        """The loop thread's body: whatever ends the loop other than `stop()` is its death."""
        self._thread_id = threading.get_ident()
        try:
            self._loop()
        except BaseException as exc:
            self._die(exc)
        finally:
            self._wake_readers()
            self._thread_id = None  # an ident is reused once its thread ends: later events are pushed

    def _die(self, exc: BaseException) -> None:
        self._wake_readers()  # the failed step's answers first, then these: before anyone hears of the death
        reason = f"{type(exc).__name__}: {exc}"
        log.critical("the engine loop died: %s", reason, exc_info=exc)
        with self.lock:
            self.failure = reason
            self._accepting = False
            for stream in list(self.streams.values()):
                self._close(stream.request, "error", f"the engine stopped: {reason}")
            calls, self._calls = list(self._calls), deque()
        self._wake_readers()
        for _, future in calls:
            future.set_exception(EngineStopped(f"the engine stopped: {reason}"))
        for callback in self.on_death:
            try:
                callback(reason)
            except Exception:
                log.exception("on_death callback failed")

    def _loop(self) -> None:
        """Plan a step, run it, settle it (`Scheduler.update`), deliver its outputs; a step that
        raised fails its own requests, and the loop goes on.

        With `plan_ahead`, each step is planned while the one before computes: launch step N (on a
        GPU `llama_decode` returns before computing it), settle what does not need its samples and
        plan N+1 (`Scheduler.ahead`, `schedule`), then read N's samples (`collect`, where a GPU is
        waited for) and settle them (`Scheduler.settle`: tokens written into N+1's items, ends of
        generation). An end is so found a step late: that sequence's row in N+1 is dropped before
        it runs (`prune`). N+1 is planned ahead only when it will hold decodes alone (nothing waits,
        no prompt is part-read: `only_decoding`), and planned again (`replan`) if a request came or
        background was held meanwhile, so both take effect as soon as without; else it is planned
        after N's samples, as without. A step that found no KV slot is settled whole (`update`), and
        the next is planned after it. On a CPU nothing overlaps (llama_decode computes before it
        returns): `scheduler.plan_ahead = "auto"` is on only with GPU offload."""
        num_failed = 0  # steps failed in a row
        plan: StepPlan | None = None  # planned while the step before computed (plan-ahead only)
        planned_held = False  # whether background was held when it was
        while True:
            with self._mutex:
                if self._stop:
                    return
                held = self._background_holds > 0
                if plan is not None:
                    self.scheduler.prune(plan)  # whatever ended since it was planned
                    if any(self.scheduler.waiting.values()) or held != planned_held:
                        plan = self.scheduler.replan(plan, self.clock(), hold_background=held)
                        if plan.idle:
                            plan = None
                if plan is None:
                    if self._calls and not self.scheduler.has_work():
                        self._wake_readers()
                        self._run_calls()
                        continue
                    plan = self.scheduler.schedule(self.clock(), hold_background=held)
                    if plan.idle:
                        plan = None
                        self._wake_readers()
                        # Background held with nothing interactive: the hold's end or a request notifies.
                        held_out = held and not self.scheduler.has_interactive_work()
                        self.lock.wait(0.05 if held_out else self._idle_timeout())
                        continue
            self._wake_readers(before_step=True)
            threads = getattr(self.runner, "num_threads", None)  # the core watch may change it in run()
            next_plan = pending = None
            try:
                if self.plan_ahead and not plan.num_drafted:  # (the step after drafts starts where they were cut)
                    result = self.runner.launch(plan)
                    if not result.no_kv_slot and not plan.empty:
                        with self._mutex:
                            pending = self.scheduler.ahead(plan, self.clock())
                            if self.scheduler.only_decoding():
                                planned_held = self._background_holds > 0
                                next_plan = self.scheduler.schedule(self.clock(), hold_background=planned_held)
                                self.counters["planned_ahead"] += 1
                    result = self.runner.collect(plan, result)
                else:
                    result = self.runner.run(plan)
            except Exception as exc:  # a broken step fails its requests, not the server
                log.exception("step %d failed", plan.step_id)
                with self.lock:
                    self._fail(plan, str(exc), pending)
                num_failed += 1
                if num_failed >= MAX_FAILED_STEPS:  # ... unless the runner itself is broken
                    raise EngineBroken(f"{num_failed} steps in a row failed, the last with: {exc}") from exc
                plan = next_plan if next_plan is not None and not next_plan.idle else None
                continue
            num_failed = 0
            with self._mutex:
                self._follow_threads(threads)
                self.counters["steps"] += 1
                self.counters["step_tokens"] += plan.num_tokens
                try:
                    if result.errors:  # (a dict, empty but for a grammar past its budget)
                        self._end_failed(result.errors)
                    if pending is None:
                        outputs = self.scheduler.update(plan, result, self.clock())
                    else:
                        outputs = self.scheduler.settle(plan, pending, result, self.clock(), next_plan)
                    self._deliver(outputs)
                except Exception as exc:  # a bug must fail its requests, not silently stop the loop
                    log.exception("step %d could not be recorded", plan.step_id)
                    self._fail(plan, f"internal error: {exc}", pending)
            plan = next_plan if next_plan is not None and not next_plan.idle else None

    def _follow_threads(self, before: int | None) -> None:
        """The step ran with fewer (or more) llama.cpp threads than the one before (the core watch):
        the scheduler's cost model is told the slowdown at once, as the ratio of the counts, so the
        next steps are sized for it rather than the ~10 s it takes to learn from the steps."""
        after = getattr(self.runner, "num_threads", None)
        if before and after and after != before:
            self.scheduler.cost.slowed(before / after)

    def _idle_timeout(self) -> float:
        now = self.clock()
        wake = self.scheduler.next_wakeup(now)
        # Submissions and aborts notify at once; the bound only keeps a missed wakeup from hanging.
        return 1.0 if wake is None else min(max(wake - now, 0.0005), 1.0)

    def _deliver(self, outputs: list[Output]) -> None:
        """A step's outputs to their streams, in order: each token's text (a stop string found in it
        ends its request), and each end. On the loop thread, for every sequence every step: one
        call for the step, what `_send` does for a token written out (calling it cost ~1,900
        instructions a token, ~2% of a step's Python at four sequences: `scripts/engine_instructions.py
        --side fake`; ~1 us of a tiny model's 1 ms step)."""
        streams, piece, clock = self.streams, self.runner.piece, self.clock
        for at, (request, sample, finished) in enumerate(outputs):
            stream = streams.get(request.request_id)
            if stream is None:
                continue
            if sample is not None:
                token = sample.token
                text = stream.text
                delta, stopped = text.add(piece(token))
                grammar = request.params.grammar
                if grammar is not None and not request.held and grammar.triggered(text.text, token):
                    request.held = True  # a tool call opened: its client takes it whole (the scheduler's pacing)
                # `self._send(stream, TokenEvent(...))`, inlined (see above): on the loop thread, for a token
                # (no finish), `_send` is these lines (`stream.add`, then the stream noted for its wake-up).
                stream._items.append(new_tuple(TokenEvent, (token, delta, sample.logprob, sample.top_logprobs)))
                if stream._sleepers:
                    stream.wake_sleepers()
                if stream not in self._to_wake:
                    self._to_wake[stream] = None
                    self._interactive_waiting |= request.interactive
                if stopped and not finished:
                    self.scheduler.finish(request.request_id, "stop", clock())
                    # drafted tokens accepted after the stop (`homeai.sched.draft`) were never sent: nor counted
                    after = sum(1 for o in outputs[at + 1:] if o[0] is request)
                    if after:
                        del request.output_tokens[-after:]
                    self._close(request, "stop")
                    continue
            if finished:
                self._close(request, request.finish_reason or "stop")

    def _close(self, request: Request, reason: str, error: str | None = None) -> None:
        stream = self.streams.pop(request.request_id, None)
        if stream is None:
            return
        stats = RequestStats.of(request, reason, self.clock())
        if request.kind is Kind.GENERATE:
            self.prompt_cache[request.lane] = self.prompt_cache[request.lane].plus(stats.prompt_tokens,
                                                                                 stats.cached_tokens)
            own = self.member_prompt_cache.get(request.key, PromptCacheUse())
            self.member_prompt_cache[request.key] = own.plus(stats.prompt_tokens, stats.cached_tokens)
        self._send(stream, FinishEvent(reason, stream.text.flush(), stats, request.embedding, error))
        self.windows[request.lane].add(stats)
        for callback in self.on_finish:
            try:
                callback(stats)
            except Exception:
                log.exception("on_finish callback failed")

    def _send(self, stream: RequestStream, event) -> None:
        """An event for a stream. On the loop thread its asyncio reader is woken with the step's others,
        just before the next decode (`_wake_readers`): the event loop then runs while llama.cpp
        computes without the GIL, instead of taking the GIL from the loop after every token. From
        another thread (an abort, `stop()`), at once."""
        if threading.get_ident() != self._thread_id:
            stream.push(event)
            return
        stream.add(event)
        if stream not in self._to_wake:  # each stream once (the flags are reset with the list)
            self._to_wake[stream] = None
            self._interactive_waiting |= stream.request.interactive
        self._finished_waiting |= isinstance(event, FinishEvent)

    def _wake_readers(self, before_step: bool = False) -> None:
        """Wake the readers of this step's events (on the loop thread: before a decode, an idle wait,
        a call between steps, or the loop's end). Before a step, background readers alone are woken
        at most every BACKGROUND_WAKE_S: their tokens wait in their streams meanwhile. A job reads its
        answer whole, and each wake-up costs a system call and the event loop's turn (at one
        sequence of a tiny model, ~0.05 ms of a 1 ms step); an interactive reader's event, or any
        request's finish (a job waiting for it to send the next), wakes them all at once."""
        if not self._to_wake:
            return
        now = time.monotonic()
        if (before_step and now - self._background_woken < BACKGROUND_WAKE_S and not self._finished_waiting
                and not self._interactive_waiting):
            return
        streams, self._to_wake = list(self._to_wake), {}
        self._finished_waiting = self._interactive_waiting = False
        self._background_woken = now
        wake_all(streams)

    def _end_failed(self, errors: dict[str, str]) -> None:
        """Requests the runner ended with an error of their own (a grammar past its step budget),
        ended before the step is settled as a failed step ends its requests; the step's others go on."""
        for request_id, error in errors.items():
            stream = self.streams.get(request_id)
            self.scheduler.abort(request_id, "error", self.clock())
            if stream is not None:
                self._close(stream.request, "error", error)

    def _fail(self, plan: StepPlan, error: str, pending=None) -> None:
        """A step that raised: the scheduler settles none of it and ends its requests; so do their
        streams. `pending`: the step's sampled rows, when it was settled ahead (`Scheduler.ahead`):
        the requests that ended there (their last token) are no longer the scheduler's, and hear
        why from here."""
        for request in self.scheduler.fail(plan, self.clock()):
            self._close(request, "error", error)
        for request, _, ended in pending or ():
            if ended:
                self._close(request, "error", error)

    # ---- what the box is doing -----------------------------------------------------

    def state(self) -> EngineState:
        """Each lane's policy and live state, each KV cache's use and the prompt cache's hits."""
        with self.lock:
            return engine_state(self)


def scheduler_limits(cfg, info=None) -> SchedulerLimits:
    """The scheduler's limits from the config's model and scheduler sections (and the loaded model's
    facts, when given: whether its embedding model can embed an input in chunks, the cells its caches got,
    the context it was trained on)."""
    m, s = cfg.model, cfg.scheduler
    cells = (info.n_ctx, info.interactive_n_ctx) if info is not None else without_model(m.n_ctx, m.interactive_n_ctx)
    return SchedulerLimits(
        num_cells=cells[0], num_seqs=m.n_seq_max, max_step_tokens=m.n_batch,
        embed_max_tokens=m.embed_n_ctx, embed_max_seqs=m.embed_n_seq_max, w_in=s.w_in, w_out=s.w_out,
        background_min_share=s.background_min_share, min_chunk=s.min_chunk, max_step_ms=s.max_step_ms,
        embed_chunked=info.embed_chunked if info is not None else True, interactive_cells=cells[1],
        prompt_cache=s.prompt_cache, prompt_cache_max_cells=s.prompt_cache_max_cells,
        prompt_cache_shared=s.prompt_cache_shared, member_seq_share=s.member_seq_share,
        max_seq_len=info.n_ctx_train if info is not None else 0)


def draft_settings(cfg) -> DraftSettings:
    """`[speculative]` for the scheduler: its lanes, else the interactive ones."""
    sp = cfg.speculative
    lanes = sp.lanes or tuple(name for name, policy in cfg.lanes.items() if policy.interactive)
    return DraftSettings(enabled=sp.enabled, max_draft=sp.max_draft, lanes=frozenset(lanes))


def create_engine(cfg, runner) -> Engine:
    """An engine over a loaded runner, with the scheduler limits the config and model allow."""
    ahead = plans_ahead(cfg.scheduler.plan_ahead, cfg.model, runner.info.gpu_offload)
    drafting = replace(draft_settings(cfg), model=getattr(runner, "draft", None) is not None)
    return Engine(runner, cfg.lanes, scheduler_limits(cfg, runner.info), plan_ahead=ahead, drafting=drafting)
