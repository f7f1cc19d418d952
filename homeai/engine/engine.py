"""The engine: the one loop (schedule, run, update) in its own thread, and the async bridge.

`submit()` validates a request, queues it with the scheduler (or refuses it: a full lane
queue, an oversized prompt) and hands back a `RequestStream` of events that asyncio code
iterates with `async for` and plain code with `for`. `abort()` frees a request's sequence
within one step. The scheduler is only touched under one lock; the runner works outside
it, so submissions and aborts never wait for a step to finish. A step's events reach their
asyncio readers with one wake-up per event loop, made just before the next decode, so the
readers run while llama.cpp computes instead of taking the GIL from the loop token by token;
background readers alone are woken at most every `BACKGROUND_WAKE_S` (a job reads its answer whole).

A failed step fails its own requests and the loop goes on; but a loop that ends by any
exception, or a runner that fails `MAX_FAILED_STEPS` steps in a row, is the engine's death:
every request in flight ends with "error", nothing more is admitted (`EngineStopped`), and
the `on_death` callbacks hear why (the daemon then exits non-zero, for systemd to restart it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import threading
import time
import uuid
from collections import deque
from contextlib import contextmanager
from concurrent.futures import Future
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from homeai.engine.state import CacheState, EngineState, LaneState, Latency, PromptCacheUse
from homeai.engine.stats import LaneWindow, RequestStats
from homeai.engine.template import ChatPrompt, PromptTokens
from homeai.engine.gpu import plans_ahead
from homeai.engine.kvsize import without_model
from homeai.engine.text import TextStream
from homeai.sched import costmodel
from homeai.sched.request import Kind, Pool, Request, SamplingParams
from homeai.sched.plan import new_tuple
from homeai.sched.prefix import Memory
from homeai.sched.scheduler import Output, QueueFull, Scheduler, SchedulerLimits, StepPlan, UnknownLane
from lanes.base import LanePolicy

log = logging.getLogger("homeai.engine")

MAX_FAILED_STEPS = 3  # a runner failing this many steps in a row, with none served between, is broken
BACKGROUND_WAKE_S = 0.05  # background readers are woken at most this often while steps run

__all__ = ["Engine", "RequestStream", "TokenEvent", "FinishEvent", "InvalidRequest", "PromptTooLong",
           "QueueFull", "EngineStopped", "EngineBroken"]


class InvalidRequest(ValueError):
    """A request the engine will not take, with the parameter at fault."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request"):
        super().__init__(message)
        self.param, self.code = param, code


class PromptTooLong(InvalidRequest):
    """`limit`: the most tokens a prompt may have; `where`: per cache (by name) when a lane's
    request may be read in more than one (`limit` is then the largest)."""

    def __init__(self, num_tokens: int, limit: int, where: dict[str, int] | None = None):
        if where and len(where) > 1:
            (name, n), *rest = where.items()
            fits = f"{n} fit the {name} cache" + "".join(f" and {n} the {name} cache" for name, n in rest)
            message = (f"the prompt has {num_tokens} tokens but at most {fits} "
                       f"(each holds the prompt and at least 1 token of the answer)")
        else:
            message = (f"the prompt has {num_tokens} tokens but at most {limit} fit the context "
                       f"(model context {limit + 1} tokens, at least 1 for the answer)")
        super().__init__(message, "messages", "context_length_exceeded")
        self.num_tokens, self.limit = num_tokens, limit


class EngineStopped(RuntimeError):
    """The engine is shutting down, or has died, and admits nothing more."""


class EngineBroken(RuntimeError):
    """The runner failed step after step: the loop stops rather than fail every request."""


class TokenEvent(NamedTuple):
    """One generated token's event (a named tuple, built with tuple's own constructor: one is made
    for every sequence every step, and a frozen dataclass costs several times as much)."""

    token: int
    text: str  # the new text this token makes safe to show (may be empty)
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class FinishEvent:
    reason: str  # stop | length | abort | error
    text: str  # text held back until the end (a partial stop string that was not one)
    stats: RequestStats
    embedding: object = None
    error: str | None = None


class RequestStream:
    """Events of one request, pushed by the engine thread, read from asyncio or plain threads."""

    def __init__(self, request: Request, engine: "Engine", loop: asyncio.AbstractEventLoop | None):
        self.request = request
        self.engine = engine
        self.text = TextStream(request.params.stop)
        self._items: deque = deque()
        self._cond = threading.Condition()
        self._sleepers = 0  # plain threads waiting in `__iter__`: only they need the condition notified
        self._loop = loop
        self._wakeup = asyncio.Event() if loop else None
        self.finished: FinishEvent | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def push(self, event) -> None:
        """Queue an event and wake its asyncio reader now."""
        self.add(event)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wakeup.set)

    def add(self, event) -> None:
        """Queue an event; a plain thread's reader wakes now, an asyncio reader when `wake_all` says.
        (The event is queued before the sleepers are counted, and a sleeper is counted before it
        looks at the queue, so no wake-up is lost without taking the lock for every token.)"""
        self._items.append(event)
        if self._sleepers:
            self.wake_sleepers()

    def wake_sleepers(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _pop(self):
        try:
            return self._items.popleft()
        except IndexError:
            return None

    def __aiter__(self):
        return self

    async def __anext__(self):
        while True:
            if self._done_reading():
                raise StopAsyncIteration
            self._wakeup.clear()
            item = self._pop()
            if item is not None:
                return self._seen(item)
            await self._wakeup.wait()

    def __iter__(self):
        while not self._done_reading():
            with self._cond:
                self._sleepers += 1
                try:
                    self._cond.wait_for(lambda: self._items, timeout=1.0)
                finally:
                    self._sleepers -= 1
            item = self._pop()
            if item is not None:
                yield self._seen(item)

    def _seen(self, item):
        if isinstance(item, FinishEvent):
            self.finished = item
        return item

    def _done_reading(self) -> bool:
        return self.finished is not None and not self._items

    def abort(self) -> None:
        self.engine.abort(self.request_id)


def wake_all(streams: Sequence[RequestStream]) -> None:
    """Wake the asyncio readers of `streams`: one call into each event loop, however many streams."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Event]] = {}
    for stream in streams:
        if stream._loop is not None:
            by_loop.setdefault(stream._loop, []).append(stream._wakeup)
    for loop, events in by_loop.items():
        if not loop.is_closed():
            loop.call_soon_threadsafe(_set_all, events)


def _set_all(events: list[asyncio.Event]) -> None:
    for event in events:
        event.set()


class Engine:
    def __init__(self, runner, policies: dict[str, LanePolicy], limits: SchedulerLimits,
                 clock: Callable[[], float] = time.monotonic, plan_ahead: bool = False):
        self.runner = runner
        # Plan each step while the one before computes (`_loop_ahead`): the runner must `launch` and `collect`.
        self.plan_ahead = plan_ahead
        self.policies = policies
        # where the model's sequences may be resumed (a sliding window's, a recurrent state's: prefix.Memory)
        self.scheduler = Scheduler(policies, limits, memory=getattr(runner, "kv_memory", None) or Memory())
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

    # ---- requests --------------------------------------------------------------

    def submit(self, prompt: str | ChatPrompt | Sequence[int], *, lane: str = "chat", member: str = "household",
               params: SamplingParams | None = None, kind: Kind = Kind.GENERATE,
               loop: asyncio.AbstractEventLoop | None = None, group: str = "") -> RequestStream:
        """Queue one request; raises InvalidRequest, PromptTooLong, QueueFull or EngineStopped.

        `prompt` is a rendered chat (`ChatPrompt`, or its `PromptTokens`: control tokens only where
        the template wrote them, and the public prefix no member wrote), a raw prompt's text (all
        its member's own, control tokens included, as they are in token ids), or token ids. Text to
        embed is text: control tokens' texts in it are characters. `group`: the trusted proxy
        member whose user `member` is (its users share the prompt's client prefix); "": none."""
        try:
            policy = self.scheduler.lane(lane)
        except UnknownLane as exc:  # the scheduler's check, as the engine's refusal
            raise InvalidRequest(str(exc), "lane", "unknown_lane") from exc
        params = params or SamplingParams(max_tokens=policy.max_tokens or 256)
        tokens = self._tokens(prompt, kind)
        public_len = min(getattr(tokens, "public_len", 0), len(tokens))
        client_len = max(public_len, min(getattr(tokens, "client_len", 0), len(tokens))) if group else public_len
        params = self._check(tokens, params, kind, lane)
        if params.grammar is not None and params.owner != member:  # a member's grammars share a step's budget
            params = dataclasses.replace(params, owner=member)
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        request = Request(f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}", lane, member, tokens,
                          self.clock(), kind=kind, params=params, public_len=public_len,
                          group=group, client_len=client_len,
                          held=params.grammar is not None and not params.grammar.lazy)
        stream = RequestStream(request, self, loop)
        with self.lock:
            if not self._accepting:
                raise EngineStopped(f"the engine stopped: {self.failure}" if self.failure
                                    else "the server is shutting down")
            try:
                self.scheduler.add_request(request)
            except QueueFull:
                self.counters["rejected"][lane] += 1
                raise
            self.streams[request.request_id] = stream
            self.lock.notify_all()
        return stream

    def _tokens(self, prompt: str | ChatPrompt | Sequence[int], kind: Kind) -> list[int]:
        if isinstance(prompt, ChatPrompt):
            return self.runner.tokenize(prompt)
        if isinstance(prompt, str):
            if not prompt.strip():
                raise InvalidRequest("the prompt is empty", "prompt")
            embed = kind is Kind.EMBED
            return self.runner.tokenize(prompt, embedding=embed, special=not embed)
        tokens = [int(t) for t in prompt]
        if not tokens:
            raise InvalidRequest("the prompt is empty", "prompt")
        n_vocab = self.runner.info.n_vocab
        if any(t < 0 or t >= n_vocab for t in tokens):
            raise InvalidRequest(f"prompt token ids must be in [0, {n_vocab})", "prompt")
        return PromptTokens(tokens, prompt.public_len, prompt.client_len) if isinstance(prompt, PromptTokens) else tokens

    def max_seq_len_for(self, lane: str) -> int:
        """The longest sequence (prompt and answer) a request of this lane may hold: the largest cache
        it may be read in (an interactive lane's prompt too long for its own is read in the main one)."""
        return max(self.scheduler.max_seq_lens(lane).values())

    def _check(self, tokens: list[int], params: SamplingParams, kind: Kind, lane: str) -> SamplingParams:
        """Refuse what no cache can hold; the answer's length capped to the room left in the first
        cache the scheduler may read it in (`Scheduler.pool_for`), so that prompt and answer fit
        whichever of its caches it is admitted to (`Scheduler.pools_for`)."""
        if kind is Kind.EMBED:
            if len(tokens) > self.embed_max_tokens:
                raise PromptTooLong(len(tokens), self.embed_max_tokens)
            return params
        forced = params.forced_tokens
        answer = len(forced) if forced is not None else params.max_tokens
        pool = self.scheduler.pool_for(lane, len(tokens), max(answer, 1))
        if pool is None:
            where = {p.value: n - 1 for p, n in self.scheduler.max_seq_lens(lane).items()}
            raise PromptTooLong(len(tokens), max(where.values()), where)
        max_seq_len = self.scheduler.max_seq_len(pool)
        if params.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be at least 1, got {params.max_tokens}", "max_tokens")
        if forced is not None and len(tokens) + len(forced) > max_seq_len:
            raise PromptTooLong(len(tokens) + len(forced), max_seq_len)
        if params.grammar is not None:
            self._check_grammar(params)
        room = max_seq_len - len(tokens)
        if params.max_tokens > room:  # a long answer ends with "length" at the context's edge
            params = SamplingParams(**{**params.__dict__, "max_tokens": room})
        return params

    def _check_grammar(self, params: SamplingParams) -> None:
        """A grammar llama.cpp cannot parse is refused here, not found mid-step; so is one beside teacher
        forcing or ignored end tokens (a finished grammar allows nothing but the end token)."""
        grammar = params.grammar
        if params.forced_tokens is not None or params.ignore_eos:
            raise InvalidRequest("a grammar cannot be combined with forced tokens or ignore_eos", grammar.param)
        if not self.runner.grammar_ok(grammar):
            raise InvalidRequest("llama.cpp could not parse the grammar made for this request",
                                 grammar.param, "invalid_grammar")

    def abort(self, request_id: str) -> None:
        with self.lock:
            self._abort_locked(request_id, "abort")
            self.lock.notify_all()

    def _abort_locked(self, request_id: str, reason: str) -> None:
        request = self.scheduler.abort(request_id, reason, self.clock())
        if request is not None:
            self._close(request, reason)

    async def generate(self, prompt, **kwargs) -> tuple[str, FinishEvent]:
        """Run one request to its end; the whole text and the finish event."""
        stream = self.submit(prompt, **kwargs)
        parts = []
        try:
            async for event in stream:
                parts.append(event.text)
        finally:
            if stream.finished is None:
                stream.abort()
        return "".join(parts), stream.finished

    async def embed(self, texts: Sequence[str], *, lane: str = "embeddings", member: str = "household"):
        """Embed texts through the scheduler (one request each, batched by the lane's window)."""
        streams: list[RequestStream] = []
        try:
            for text in texts:  # all or nothing: a refusal aborts what was already queued
                streams.append(self.submit(text, lane=lane, member=member, kind=Kind.EMBED))
            finals = [await _last(s) for s in streams]
        finally:
            for s in streams:
                if s.finished is None:
                    s.abort()
        for f in finals:
            if f.reason == "error":
                raise RuntimeError(f.error or "embedding failed")
        return [f.embedding for f in finals], sum(f.stats.prompt_tokens for f in finals)

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
        if self.plan_ahead:
            return self._loop_ahead()
        num_failed = 0  # steps failed in a row
        while True:
            with self._mutex:
                if self._stop:
                    return
                if self._calls and not self.scheduler.has_work():
                    self._wake_readers()
                    self._run_calls()
                    continue
                held = self._background_holds > 0
                plan = self.scheduler.schedule(self.clock(), hold_background=held)
                if plan.idle:
                    self._wake_readers()
                    # Background held with nothing interactive: the hold's end or a request notifies.
                    held_out = held and not self.scheduler.has_interactive_work()
                    self.lock.wait(0.05 if held_out else self._idle_timeout())
                    continue
            self._wake_readers(before_step=True)
            threads = getattr(self.runner, "num_threads", None)  # the core watch may change it in run()
            try:
                result = self.runner.run(plan)
            except Exception as exc:  # a broken step fails its requests, not the server
                log.exception("step %d failed", plan.step_id)
                with self.lock:
                    self._fail(plan, str(exc))
                num_failed += 1
                if num_failed >= MAX_FAILED_STEPS:  # ... unless the runner itself is broken
                    raise EngineBroken(f"{num_failed} steps in a row failed, the last with: {exc}") from exc
                continue
            num_failed = 0
            with self._mutex:
                self._follow_threads(threads)
                self.counters["steps"] += 1
                self.counters["step_tokens"] += plan.num_tokens
                try:
                    if result.errors:  # (a dict, empty but for a grammar past its budget)
                        self._end_failed(result.errors)
                    self._deliver(self.scheduler.update(plan, result, self.clock()))
                except Exception as exc:  # a bug must fail its requests, not silently stop the loop
                    log.exception("step %d could not be recorded", plan.step_id)
                    self._fail(plan, f"internal error: {exc}")

    def _loop_ahead(self) -> None:
        """The loop with each step planned while the one before computes: launch step N (on a GPU
        `llama_decode` returns before computing it), settle what does not need its samples and
        plan N+1 (`Scheduler.ahead`, `schedule`), then read N's samples (`collect`, where a GPU is
        waited for) and settle them (`Scheduler.settle`: tokens written into N+1's items, ends of
        generation). An end is so found a step late: that sequence's row in N+1 is dropped before
        it runs. N+1 is planned ahead only when it will hold decodes alone (nothing waits, no
        prompt is part-read: `only_decoding`), and planned again (`replan`) if a request came or
        background was held meanwhile, so both take effect as soon as in the plain loop; else it
        is planned after N's samples, as the plain loop plans it. A step that found no KV slot, or
        raised, is settled as the plain loop settles it, and the next is planned after it. On a
        CPU nothing overlaps (llama_decode computes before it returns): `scheduler.plan_ahead =
        "auto"` is on only with GPU offload."""
        num_failed = 0  # steps failed in a row
        plan: StepPlan | None = None  # planned while the step before computed
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
                        held_out = held and not self.scheduler.has_interactive_work()
                        self.lock.wait(0.05 if held_out else self._idle_timeout())
                        continue
            self._wake_readers(before_step=True)
            threads = getattr(self.runner, "num_threads", None)
            next_plan = pending = None
            try:
                result = self.runner.launch(plan)
                if not result.no_kv_slot and not plan.empty:
                    with self._mutex:
                        pending = self.scheduler.ahead(plan, self.clock())
                        if self.scheduler.only_decoding():
                            planned_held = self._background_holds > 0
                            next_plan = self.scheduler.schedule(self.clock(), hold_background=planned_held)
                            self.counters["planned_ahead"] += 1
                result = self.runner.collect(plan, result)
            except Exception as exc:  # a broken step fails its requests, not the server
                log.exception("step %d failed", plan.step_id)
                with self.lock:
                    self._fail_ahead(plan, pending, str(exc))
                num_failed += 1
                if num_failed >= MAX_FAILED_STEPS:
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
                except Exception as exc:
                    log.exception("step %d could not be recorded", plan.step_id)
                    self._fail_ahead(plan, pending, f"internal error: {exc}")
            plan = next_plan if next_plan is not None and not next_plan.idle else None

    def _fail_ahead(self, plan: StepPlan, pending, error: str) -> None:
        """`_fail`, for a step settled ahead: the requests `ahead` already ended (their last token)
        are no longer the scheduler's, and hear why from here."""
        self._fail(plan, error)
        for request, _, ended in pending or ():
            if ended:
                self._close(request, "error", error)

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
        call for the step, what `_send` does for a token written out (a call a token cost ~1 us of
        a tiny model's 1 ms step at four sequences)."""
        streams, piece, clock = self.streams, self.runner.piece, self.clock
        for request, sample, finished in outputs:
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
                stream._items.append(new_tuple(TokenEvent, (token, delta, sample.logprob, sample.top_logprobs)))
                if stream._sleepers:  # (`stream.add`, written out)
                    stream.wake_sleepers()
                if stream not in self._to_wake:  # `_send`, for a token
                    self._to_wake[stream] = None
                    self._interactive_waiting |= request.interactive
                if stopped and not finished:
                    self.scheduler.finish(request.request_id, "stop", clock())
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

    def _fail(self, plan: StepPlan, error: str) -> None:
        """A step that raised: the scheduler settles none of it and ends its requests; so do their streams."""
        for request in self.scheduler.fail(plan, self.clock()):
            self._close(request, "error", error)

    # ---- what the box is doing -----------------------------------------------------

    def state(self) -> EngineState:
        """Each lane's policy and live state, each KV cache's use and the prompt cache's hits."""
        with self.lock:
            sched = self.scheduler
            running = {name: 0 for name in self.policies}
            for request in sched.running:
                running[request.lane] += 1
            lanes = {name: self._lane_state(name, policy, running[name]) for name, policy in self.policies.items()}
            caches = {pool.value: CacheState(kv.num_cells, kv.num_used_cells, kv.num_cached_cells,
                                             sched.limits.num_seqs, len(kv.allocated), len(kv.cached))
                      for pool in reversed(sched.pools.generating) for kv in [sched.pools.kv[pool]]}
            return EngineState(lanes, caches, self.counters["steps"], costmodel.named(sched.cost.coefficients))

    def _lane_state(self, name: str, policy: LanePolicy, running: int) -> LaneState:
        recent = self.windows[name].summary()
        return LaneState(policy, self.scheduler.num_waiting(name), running, self.counters["rejected"][name],
                         round(self.scheduler.typical_output(name), 1), _rounded(self.scheduler.reading_pace(name)),
                         recent["finished"], Latency(**recent["ttft_ms"]), Latency(**recent["itl_ms"]),
                         self.prompt_cache[name],
                         {m: use for (lane, m), use in self.member_prompt_cache.items() if lane == name})


def _rounded(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 1)


async def _last(stream: RequestStream) -> FinishEvent:
    async for _ in stream:
        pass
    return stream.finished


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


def create_engine(cfg, runner) -> Engine:
    """An engine over a loaded runner, with the scheduler limits the config and model allow."""
    ahead = plans_ahead(cfg.scheduler.plan_ahead, cfg.model, runner.info.gpu_offload)
    return Engine(runner, cfg.lanes, scheduler_limits(cfg, runner.info), plan_ahead=ahead)
