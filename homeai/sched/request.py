"""Request state as the scheduler sees it: token counts, status and timings, no model.

The invariant (after vLLM v1): a request has `num_tokens` (prompt plus output so far) and
`num_computed_tokens` (those whose KV is in the cache); each step moves the second towards
the first. A prefill chunk is "several tokens this step", a decode is "one token"; the
token after the last computed one is sampled when the two meet.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import NamedTuple


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Kind(enum.Enum):
    GENERATE = "generate"
    EMBED = "embed"


# The members read for every sequence every step, as plain names: in Python 3.11 `Status.RUNNING`
# goes through the enum metaclass's attribute hook (it defines `__getattr__`), ~20 times slower
# than reading a global.
RUNNING, WAITING, GENERATE_KIND = Status.RUNNING, Status.WAITING, Kind.GENERATE


class Pool(enum.Enum):
    """A KV cache a request's cells live in (`pools.py`)."""

    MAIN = "main"
    INTERACTIVE = "interactive"
    EMBED = "embed"

    # A dict key dozens of times a step: hashed by identity (as members compare), not by
    # Enum's Python-level hash of the name (nothing iterates a set of pools, so no order changes).
    __hash__ = object.__hash__


@dataclass(frozen=True)
class Grammar:
    """A GBNF grammar the sampler holds the output to (llama.cpp's grammar sampler). A lazy grammar
    (trigger patterns or tokens) lets the output run free until a trigger appears, so a reply that
    may be text or a tool call pays for the grammar only once it is a call."""

    text: str  # GBNF rules
    root: str = "root"
    trigger_patterns: tuple[str, ...] = ()  # regexes over the whole output so far; the first group starts the grammar
    trigger_tokens: tuple[int, ...] = ()
    param: str = "response_format"  # the request field it comes from, named in a refusal

    @property
    def lazy(self) -> bool:
        return bool(self.trigger_patterns or self.trigger_tokens)

    def triggered(self, text: str, token: int) -> bool:
        """Whether the output so far (`text`, ending in `token`) starts the grammar, as llama.cpp
        finds a trigger (a search; homeai's patterns are anchored, so they match all of it)."""
        return token in self.trigger_tokens or any(re.search(p, text) for p in self.trigger_patterns)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8  # 0: greedy
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    seed: int | None = None  # None: a fresh seed per request
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # None: none; k: the chosen token's logprob and the top k
    forced_tokens: tuple[int, ...] | None = None  # teacher forcing: output these tokens, for evaluation
    record_logits: bool = False  # keep each sampled row's logits (evaluation and tests)
    ignore_eos: bool = False  # keep going past end-of-generation tokens (benchmarks)
    grammar: Grammar | None = None  # hold the output to a grammar (tool calls, structured output)
    owner: str = ""  # whose grammars share a step's grammar budget (the engine sets the request's member)


class Sample(NamedTuple):
    """What the runner hands back for one sampled position (a named tuple: immutable, and made
    for every sequence every step several times faster than a frozen dataclass)."""

    token: int
    is_eog: bool = False
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    logits: object = None  # a numpy row when SamplingParams.record_logits


@dataclass(eq=False, slots=True)
class Request:
    request_id: str
    lane: str
    member: str
    prompt_tokens: list[int]
    arrival_time: float
    kind: Kind = Kind.GENERATE
    params: SamplingParams = field(default_factory=SamplingParams)
    interactive: bool = False  # its lane's class (set from the lane's policy when it is added)
    priority: int = 0  # its lane's priority: lower goes first, and is preempted last
    # The caches it may be admitted to, in the order tried (`Scheduler.pools_for`, set when it is
    # added): those of its lane that hold its prompt and answer, its lane's own first.
    pools: tuple[Pool, ...] = ()
    # The cache its cells live in, chosen when it is admitted (`Admission.place`: one of `pools` with
    # room now); while it waits, a provisional guess (the first, or the one it last ran in). Its
    # lane's rules go with it everywhere.
    pool: Pool | None = None
    output_tokens: list[int] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)  # each sampled row, kept only with params.record_logits
    num_computed_tokens: int = 0
    num_charged_prompt: int = 0  # prompt tokens charged to fair share (or found cached): a recompute is free
    status: Status = Status.WAITING  # written by the scheduler alone (`Scheduler._start`, `_requeue`, `_finish`)
    seq_id: int | None = None
    finish_reason: str | None = None  # stop | length | abort | error
    num_preemptions: int = 0
    admitted_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    itls: list[float] = field(default_factory=list)  # seconds between consecutive output tokens
    embedding: object = None  # an embed request's vector once done
    num_cached_tokens: int = 0  # prompt tokens its first admission found in the prompt cache
    # Leading prompt tokens no member wrote (the template's own default system prompt, a lane's
    # configured prompt): the only part of a prompt another member's request may reuse from the
    # prompt cache. The rest is reused only by requests of the same member.
    public_len: int = 0
    # The trusted proxy member it came through ("": none; set by the server from the member's proxy
    # flag, never read from a key), and its leading prompt tokens no user wrote (>= public_len: the
    # client's tool definitions and system text before the first user message): the part the proxy's
    # other users' requests may reuse from the prompt cache (`prefix.reusable`).
    group: str = ""
    client_len: int = 0
    # Its output is held to a grammar (a tool call once it opens, structured output): its client
    # takes it whole, not a token at a time, so it decodes as fast as steps allow, not at reading pace.
    held: bool = False
    prompt_array: object = field(default=None, repr=False)  # the prompt as a numpy array, for prefix matching
    # Its images' placeholder spans [start, end) in the prompt (`homeai.llama.vision`: negative ids), and
    # whether each is read in one step (a projector whose image attends to all of itself: Gemma 3)
    images: tuple[tuple[int, int], ...] = ()
    whole_images: bool = False

    def chunk_end(self, start: int, n: int) -> int:
        """How many of the `n` tokens from `start` a chunk may read: not ending inside an image read
        whole (it stops before the image, or, starting at it, reads all of it)."""
        if not self.whole_images:
            return n
        end = start + n
        for first, last in self.images:
            if first < end < last:
                return last - start if start >= first else first - start
        return n

    @property
    def key(self) -> tuple[str, str]:
        return (self.lane, self.member)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_tokens)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_tokens) + len(self.output_tokens)

    @property
    def num_remaining(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:  # asked of every running request several times a step: num_remaining inlined
        return (self.status is RUNNING and bool(self.output_tokens)
                and len(self.prompt_tokens) + len(self.output_tokens) - self.num_computed_tokens == 1)

    @property
    def max_tokens(self) -> int:
        forced = self.params.forced_tokens
        return len(forced) if forced is not None else self.params.max_tokens

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def tokens_slice(self, start: int, stop: int) -> list[int]:
        n_prompt = len(self.prompt_tokens)
        if stop <= n_prompt:
            return self.prompt_tokens[start:stop]
        if start >= n_prompt:  # a decode: its last output token, not a copy of the whole sequence
            return self.output_tokens[start - n_prompt:stop - n_prompt]
        return self.prompt_tokens[start:] + self.output_tokens[:stop - n_prompt]
