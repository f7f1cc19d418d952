"""What comes into the engine: a request checked (its prompt's tokens, its length against the caches
its lane may use, its answer's cap, its grammar), queued with the scheduler or refused, and handed
back as its `RequestStream`; aborts; `generate` and `embed`, a request run whole.

`Intake` is a part of `Engine` (`engine.py`), which holds the scheduler, the runner and the lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Sequence

from homeai.engine.errors import EngineStopped, InvalidRequest, PromptTooLong
from homeai.engine.stream import FinishEvent, RequestStream
from homeai.engine.prompt import ChatPrompt, PromptTokens
from homeai.sched.request import Kind, Request, SamplingParams
from homeai.sched.scheduler import QueueFull, UnknownLane


class Intake:
    """The engine's requests in (a part of `Engine`)."""

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
        holder = getattr(tokens, "holder", "")  # its images' embeddings, held until it is queued or refused
        try:
            return self._queue(tokens, lane, member, params, kind, loop, group, holder)
        except BaseException:
            if holder:
                self.runner.release_images(holder)
            raise

    def _queue(self, tokens: list[int], lane: str, member: str, params: SamplingParams, kind: Kind,
               loop: asyncio.AbstractEventLoop | None, group: str, holder: str) -> RequestStream:
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
                          held=params.grammar is not None and not params.grammar.lazy,
                          images=getattr(tokens, "images", ()), whole_images=getattr(tokens, "whole_images", False))
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
            if holder:  # (before its first step: the runner lets them go when it ends)
                self.runner.hold_images(holder, request.request_id)
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
        if isinstance(prompt, PromptTokens) and prompt.images:  # the runner's own, its images' placeholders in it
            return prompt
        tokens = [int(t) for t in prompt]
        if not tokens:
            raise InvalidRequest("the prompt is empty", "prompt")
        n_vocab = self.runner.info.n_vocab
        if any(t < 0 or t >= n_vocab for t in tokens):  # (a client's ids are never images: those come as pictures)
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


async def _last(stream: RequestStream) -> FinishEvent:
    async for _ in stream:
        pass
    return stream.finished
