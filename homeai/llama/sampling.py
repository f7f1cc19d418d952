"""Sampling: each request's pick from its row's logits, by llama.cpp's samplers.

Each request samples with its own llama.cpp sampler chain, built once at its first sampled row and
kept across preemption so a resumed request continues its random stream; a greedy request with
nothing to weigh first (no penalty, no grammar) has no chain: its pick is the row's highest logit,
read in place (llama.cpp's greedy pick, a tie to the lowest id, without copying the vocabulary into
a candidate array: ~0.15 ms a row on the CPU). A request held to a grammar from its first token has
llama.cpp's grammar sampler beside its chain: the chain's pick is checked against the grammar, and
only a pick the grammar refuses pays for masking: the best-scored 256 tokens first, then further
chunks in score order only while they cannot give the same pick (llama.cpp's common sampler checks
the pick first too; masking first costs every token a pass over the vocabulary, ~0.4 s against a
256-value enum on 2 cores). The clock is read between chunks: a request whose grammar takes longer
than `[grammar] step_budget_ms` to pick a token ends with an error (`StepResult.errors`) instead of
holding the shared step. A lazy grammar is beside the chain too: until its trigger it allows every
token (its check costs a one-token pass), and after it the call it holds is weighed as any grammar
is, within the same budget. Log-probabilities are read from the row's logits after the pick.
"""

from __future__ import annotations

import ctypes
import logging
import random
import time
from dataclasses import dataclass

import llama_cpp as ll
import numpy as np

from homeai.llama.model import RunnerError
from homeai.sched.plan import new_tuple
from homeai.sched.request import Grammar, Sample, SamplingParams
from homeai.sched.scheduler import ScheduledItem

log = logging.getLogger(__name__)

WEIGHED_FIRST = 256  # tokens weighed against a grammar before the whole vocabulary is
CHUNK = 4096  # the most tokens weighed between two readings of the clock (~1/12 of SmolLM2's vocabulary)


class GrammarOverBudget(Exception):
    """A member's grammars took longer than the step budget to pick their tokens in one step: the
    request whose pick ran past it ends."""

    def __init__(self, took_s: float, budget_s: float, before_s: float = 0.0):
        others = f" (after {before_s * 1000:.0f} ms of its member's other grammars in this step)" if before_s else ""
        super().__init__(f"its grammar took {took_s * 1000:.0f} ms to pick one token{others}, more than "
                         f"[grammar] step_budget_ms = {budget_s * 1000:g}: the answer ends here")


class Candidates:
    """llama.cpp's candidate arrays over numpy buffers: the whole vocabulary, refilled from a row's
    logits for each sampling with a grammar, and a single token, to ask a grammar about it."""

    DTYPE = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # llama_token_data

    def __init__(self, n_vocab: int):
        self.ids = np.arange(n_vocab, dtype=np.int32)
        self.data = np.zeros(n_vocab, dtype=self.DTYPE)
        self.one = np.zeros(1, dtype=self.DTYPE)
        self.c = ll.llama_token_data_array(self.data.ctypes.data_as(ll.llama_token_data_p), n_vocab, -1, False)
        self.one_c = ll.llama_token_data_array(self.one.ctypes.data_as(ll.llama_token_data_p), 1, -1, False)

    def fill(self, logits: np.ndarray):
        self.data["id"] = self.ids  # samplers sort and cut the array in place: every field anew
        self.data["logit"] = logits
        self.data["p"] = 0.0
        self.c.data = self.data.ctypes.data_as(ll.llama_token_data_p)
        self.c.size, self.c.selected, self.c.sorted = len(self.data), -1, False
        return self.c

    def top_allowed(self, logits: np.ndarray, grammar, n: int, need: int):
        """The `n` best-scored tokens with those `grammar` refuses at -inf, when at least `need` of
        them are allowed (else None, the array weighed left in place): the chain then picks among them
        as it would among the whole vocabulary masked, at a few hundredth of the cost (a 256-value
        enum: ~0.4 s a whole pass here)."""
        top = np.argpartition(logits, -n)[-n:] if n < len(self.ids) else self.ids
        return self.c if self.weigh(grammar, top, logits).sum() >= need else None

    def weigh(self, grammar, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """Whether `grammar` allows each of `ids` (llama.cpp weighs each candidate on its own: a
        vocabulary weighed in chunks allows what it allows weighed whole)."""
        k = len(ids)
        self.data["id"][:k] = ids
        self.data["logit"][:k] = logits[ids]
        self.data["p"][:k] = 0.0
        self.c.data = self.data.ctypes.data_as(ll.llama_token_data_p)
        self.c.size, self.c.selected, self.c.sorted = k, -1, False
        ll.llama_sampler_apply(grammar, ctypes.byref(self.c))
        return np.isfinite(self.data["logit"][:k])

    def masked(self, ids: np.ndarray, logits: np.ndarray, allowed: np.ndarray):
        """The candidates `ids` with what is not `allowed` at -inf: what the grammar's own pass over
        them leaves (over the whole vocabulary in id order: exactly its pass over `fill`)."""
        k = len(ids)
        self.data["id"][:k] = ids
        self.data["logit"][:k] = np.where(allowed, logits[ids], -np.inf)
        self.data["p"][:k] = 0.0
        self.c.data = self.data.ctypes.data_as(ll.llama_token_data_p)
        self.c.size, self.c.selected, self.c.sorted = k, -1, False
        return self.c

    def allows(self, grammar, token: int) -> bool:
        self.one[0] = (token, 1.0, 0.0)
        self.one_c.size, self.one_c.selected, self.one_c.sorted = 1, -1, False
        ll.llama_sampler_apply(grammar, ctypes.byref(self.one_c))
        return bool(np.isfinite(self.one["logit"][0]))


DEFAULT_SAMPLING = SamplingParams()
SAMPLE_REST = Sample(0)[2:]  # a Sample's fields after (token, is_eog), as they default


@dataclass(frozen=True)
class _Sampling:
    """What one request samples with, built at its first sampled row and freed when it ends."""

    params: SamplingParams
    chain: object | None  # llama.cpp's sampler chain; None when greedy with nothing to weigh first
    grammar: object | None  # the request's grammar (lazy or not): beside the chain, not in it
    reads_logits: bool  # logprobs or recorded logits: the row's logits are read after the pick


class Sampler:
    """What a runner's rows are sampled with: each request's sampling (`_Sampling`), built at its first
    sampled row and freed when it ends; the candidate arrays grammars are weighed in; and the step's
    grammar time so far per member, against `[grammar] step_budget_ms`."""

    def __init__(self, vocab, n_vocab: int, turn_openers: frozenset[int], grammar_budget_s: float):
        self.vocab, self.n_vocab = vocab, n_vocab
        self._turn_openers = turn_openers  # end a reply, as its EOG does
        self.grammar_budget_s = grammar_budget_s  # one member's grammars, one step
        self._grammar_spent: dict[str, float] = {}  # this step's grammar time so far, per member (SamplingParams.owner)
        self.samplers: dict[str, _Sampling] = {}  # per request in flight, kept across preemption
        self._eog: dict[int, bool] = {}  # whether a token ends generation, asked once a token
        self.candidates = Candidates(n_vocab)

    def new_step(self) -> None:
        """A step begins: every member's grammars have the whole budget again."""
        if self._grammar_spent:
            self._grammar_spent.clear()

    def sample(self, ctx, item: ScheduledItem, row: int, outputs: np.ndarray, out: int, best: int) -> Sample:
        """Batch row `row`'s token: output row `out` of `outputs` (its scores, in place), whose first
        best-scored token is `best`."""
        sampling = self.samplers.get(item.request_id) or self._sampling(item.request_id, item.params)
        if item.forced is not None:
            token = item.forced
            if sampling.chain is not None:
                ll.llama_sampler_accept(sampling.chain, token)
        elif sampling.chain is None:  # greedy, nothing to weigh first: the row's best score
            token = best
        elif sampling.grammar is not None:
            token = self._sample_in_grammar(outputs[out], sampling.chain, sampling.grammar, sampling.params)
        else:
            token = ll.llama_sampler_sample(sampling.chain, ctx, row)
        if token is None:  # the grammar admits no token the model can write: the answer ends here
            log.warning("request %s: its grammar allows no token of this model's vocabulary here; "
                        "its answer ends", item.request_id)
            return new_tuple(Sample, (0, True) + SAMPLE_REST)  # (an end's token is never kept)
        is_eog = not sampling.params.ignore_eos and self._is_eog(token)
        if not sampling.reads_logits:
            return new_tuple(Sample, (token, is_eog) + SAMPLE_REST)  # Sample(token, is_eog), by tuple's C constructor
        params, logits = sampling.params, outputs[out]
        logprob, top = log_probs(logits, token, params.logprobs) if params.logprobs is not None else (None, ())
        return Sample(token, is_eog, logprob, top, logits.copy() if params.record_logits else None)

    def _sampling(self, request_id: str, params: SamplingParams | None) -> _Sampling:
        """A request's sampling, built at its first sampled row and kept until it ends."""
        params = params or DEFAULT_SAMPLING
        grammar = None
        if params.grammar is not None:
            grammar = grammar_sampler(self.vocab, params.grammar)
            if not grammar:  # submit checked it (grammar_ok): this is a bug, not the request's fault
                raise RunnerError("llama.cpp could not parse a grammar it parsed at submit")
        plain_greedy = params.temperature <= 0 and params.repeat_penalty == 1.0 and grammar is None
        chain = None if plain_greedy else build_sampler(params, self.n_vocab)
        reads_logits = params.logprobs is not None or params.record_logits
        sampling = self.samplers[request_id] = _Sampling(params, chain, grammar, reads_logits)
        return sampling


    def _is_eog(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(ll.llama_vocab_is_eog(self.vocab, token)) or token in self._turn_openers
        return eog


    def _sample_in_grammar(self, logits: np.ndarray, chain, grammar, params: SamplingParams) -> int | None:
        """The chain's pick if the grammar allows it, else the chain's pick among what the grammar
        allows (of the best-scored `WEIGHED_FIRST` tokens when that gives the same pick: greedy, or
        at least top_k of them allowed and no penalty; else of the whole vocabulary); both samplers
        then accept it. None, and nothing accepted, when the grammar allows no token at all (a
        schema's character the vocabulary cannot write: SmolLM2's has no token starting with the
        bytes 0xF1 or 0xF2; llama.cpp would abort the process on accepting a refused token).
        GrammarOverBudget when the grammar's part (the check, the weighing, its accept) took longer
        than what is left of the step budget of the request's member (`params.owner`): a member's
        grammars share one budget a step, so several requests cannot hold a step several budgets long."""
        cur = self.candidates.fill(logits)
        ll.llama_sampler_apply(chain, ctypes.byref(cur))
        token = cur.data[cur.selected].id
        before = self._grammar_spent.get(params.owner, 0.0)
        budget = self.grammar_budget_s - before
        start = time.perf_counter()
        try:
            if not self.candidates.allows(grammar, token):
                cur = self._weigh(logits, grammar, allowed_needed(params), start, budget)
                ll.llama_sampler_apply(chain, ctypes.byref(cur))
                if cur.selected < 0 or not np.isfinite(cur.data[cur.selected].logit):
                    return None
                token = cur.data[cur.selected].id
            ll.llama_sampler_accept(grammar, token)  # (with many stacks, costly too: timed with the rest)
        finally:
            took = time.perf_counter() - start
            self._grammar_spent[params.owner] = before + took
        if took > budget:
            raise GrammarOverBudget(took, self.grammar_budget_s, before)
        ll.llama_sampler_accept(chain, token)
        return token

    def _weigh(self, logits: np.ndarray, grammar, need: int, start: float, budget: float):
        """The candidates the chain picks among once it knows its pick is refused: the best-scored
        tokens weighed so far when `need` of them are allowed (the chain's pick among them is its pick
        among all the allowed ones), else the whole vocabulary with what the grammar refuses at -inf.
        Weighed in chunks, in score order (the best `WEIGHED_FIRST` first), each sized from the
        last's time to end within the budget, the clock read between them: GrammarOverBudget once
        `budget` since `start` is spent."""
        cands, n_vocab = self.candidates, self.n_vocab
        per_token = max(time.perf_counter() - start, 1e-6)  # one candidate's weighing (the pick's check), at most
        n = min(WEIGHED_FIRST, n_vocab, max(16, int(budget / 4 / per_token)))
        began = time.perf_counter()
        cur = cands.top_allowed(logits, grammar, n, need or n + 1)  # (need 0: never enough, weigh on)
        if cur is not None:
            return cur
        first, ok = cands.data["id"][:n].copy(), np.isfinite(cands.data["logit"][:n])
        found = int(ok.sum())
        allowed = np.zeros(n_vocab, dtype=bool)
        allowed[first] = ok
        weighed = np.zeros(n_vocab, dtype=bool)
        weighed[first] = True
        order = np.argsort(-logits, kind="stable") if need else cands.ids  # (no early end: any order will do)
        rest = order[~weighed[order]]
        pos, size = 0, n
        while pos < len(rest):
            now = time.perf_counter()
            per_token, left = max((now - began) / size, 1e-8), start + budget - now
            if left <= 0:
                raise GrammarOverBudget(now - start, self.grammar_budget_s, self.grammar_budget_s - budget)
            size = int(min(len(rest) - pos, CHUNK, max(16, left / 2 / per_token)))
            chunk = rest[pos:pos + size]
            began = time.perf_counter()
            ok = cands.weigh(grammar, chunk, logits)
            allowed[chunk] = ok
            found += int(ok.sum())
            pos += size
            if need and found >= need and pos < len(rest):
                prefix = np.concatenate((first, rest[:pos]))
                return cands.masked(prefix, logits, allowed[prefix])
        return cands.masked(cands.ids, logits, allowed)


    def allowed_guesses(self, item: ScheduledItem, guess: list[int]) -> int:
        """How many of a request's drafted tokens its grammar allows in turn (all, with none): a
        guess the grammar refuses is never proposed (its row would be a refused pick's cost, and
        nothing after it could be kept). Asked of a copy of the grammar, left as it was."""
        sampling = self.samplers.get(item.request_id) or self._sampling(item.request_id, item.params)
        if sampling.grammar is None:
            return len(guess)
        grammar = ll.llama_sampler_clone(sampling.grammar)
        try:
            for n, token in enumerate(guess):
                if not self.candidates.allows(grammar, token):
                    return n
                ll.llama_sampler_accept(grammar, token)
            return len(guess)
        finally:
            ll.llama_sampler_free(grammar)

    def free(self, request_id: str) -> None:
        sampling = self.samplers.pop(request_id, None)
        for sampler in (sampling.chain, sampling.grammar) if sampling is not None else ():
            if sampler is not None:
                ll.llama_sampler_free(sampler)


    def free_all(self) -> None:
        for request_id in list(self.samplers):
            self.free(request_id)



def allowed_needed(params: SamplingParams) -> int:
    """How many of the best-scored tokens must be allowed for the chain's pick among them to be its
    pick among all the allowed ones (0: no number will do, weigh the whole vocabulary)."""
    if params.repeat_penalty != 1.0:
        return 0  # penalties reorder the scores
    if params.temperature <= 0:
        return 1
    return params.top_k if 0 < params.top_k <= WEIGHED_FIRST else 0


def build_sampler(params: SamplingParams, n_vocab: int):
    """One request's sampler chain: penalties, then greedy or top-k/top-p/min-p/temperature/dist. Its
    grammar, if any, is not in the chain but beside it (`Sampler._sample_in_grammar`)."""
    chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    if params.repeat_penalty != 1.0:
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_penalties(n_vocab, 64, params.repeat_penalty, 0.0, 0.0))
    if params.temperature <= 0:
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_greedy())
        return chain
    if params.top_k > 0:
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_k(params.top_k))
    if params.top_p < 1.0:
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_p(params.top_p, 1))
    if params.min_p > 0:
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_min_p(params.min_p, 1))
    ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_temp(params.temperature))
    seed = params.seed if params.seed is not None else random.getrandbits(32)
    ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_dist(seed & 0xFFFFFFFF))
    return chain


def grammar_sampler(vocab, grammar: Grammar):
    """llama.cpp's grammar sampler for `grammar` (lazy when it has triggers); NULL (falsy) when
    llama.cpp cannot parse it (it logs why). Trigger patterns are homeai's own regexes, never a
    client's: an invalid one would throw inside llama.cpp."""
    text, root = grammar.text.encode("utf-8"), grammar.root.encode("utf-8")
    if not grammar.lazy:
        return ll.llama_sampler_init_grammar(vocab, text, root)
    patterns = (ctypes.c_char_p * len(grammar.trigger_patterns))(*[p.encode("utf-8") for p in grammar.trigger_patterns])
    tokens = (ll.llama_token * len(grammar.trigger_tokens))(*grammar.trigger_tokens)
    return ll.llama_sampler_init_grammar_lazy_patterns(vocab, text, root, patterns, len(grammar.trigger_patterns),
                                                       tokens, len(grammar.trigger_tokens))


def log_probs(logits: np.ndarray, token: int, k: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """The chosen token's log-probability and the top k, from raw logits (vectorised)."""
    top = float(logits.max())
    lse = top + float(np.log(np.exp(logits - top, dtype=np.float64).sum()))
    chosen = float(logits[token]) - lse
    if k <= 0:
        return chosen, ()
    idx = np.argpartition(logits, -k)[-k:]
    idx = idx[np.argsort(-logits[idx])]
    return chosen, tuple((int(i), float(logits[i]) - lse) for i in idx)
