"""Drafting: tokens guessed for an answer and checked in the shared step (speculative decoding).

A sequence that decodes one token a step may carry drafted tokens after that token, in the same
row of the same `llama_decode` as everyone else's rows and chunks. The runner reads the logits at
each of them and samples as it always does, row after row: the answer keeps each drafted token its
own sampling picks, and the first token it picks otherwise (or one more after all of them), and
llama.cpp's cells past that are cut. So a step gives the answer 1 to k+1 tokens, each sampled from
the same logits, with the same sampler, in the same order as without drafting: greedy answers are
the same tokens, and sampled ones keep their distribution (a guess is a point mass, and sampling
the target and keeping the guess when they agree is the standard acceptance rule for it).

Guesses come from the request's own tokens (`Lookup`, prompt lookup): the longest recent n-gram
that ends the sequence is found earlier in it, and what followed it then is the guess; failing
that, in the member's own latest turns the prompt cache keeps (never another member's). The answers
a household waits for echo their prompt: a tool call names an entity the prompt listed, a summary
quotes its document, a follow-up repeats the last answer (the conversation so far is the prompt).

How many tokens each sequence may draft is the scheduler's choice each step (`Drafting.place`):
only drafting lanes' decoding sequences, none while an interactive prompt waits to be read, none
past its answer's last token or the cells free now, and only as many as pay for themselves. Per
(lane, member) the share of drafted tokens accepted is learnt (`Acceptance`), and a length is
chosen where the tokens expected per millisecond of the step (the cost model's) is highest, or
none: drafting that does not pay stops by itself, and is tried again now and then. What a
sequence drafted counts in fair share as what ran, accepted or not (`settle.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from homeai.sched.costmodel import StepCostModel, StepShape

NGRAM_MAX, NGRAM_MIN = 4, 2  # the n-grams looked up, longest first (a single token guesses too often wrongly)
# A pair's first guesses, believed lightly (as two guesses' worth): a guess after a draft wholly accepted
# (a quote running on) is likelier right than a fresh one
PRIOR_FRESH, PRIOR_RUN, PRIOR_TRIALS = 0.6, 0.8, 2.0
DECAY = 0.95  # the acceptance learnt counts the last ~20 drafts most
PROBE_EVERY = 32  # a pair whose guesses stopped paying drafts again after this many guesses passed over
PROBE_LENGTH = 2
HISTORY_TURNS = 4  # a member's latest cached turns looked in, when the request's own tokens guess nothing
HISTORY_TOKENS = 2048  # of each, its last tokens
HISTORY_KEPT = 64  # earlier turns' lookups kept, at most


@dataclass(frozen=True)
class DraftSettings:
    """`[speculative]`, as the scheduler reads it."""

    enabled: bool = False
    max_draft: int = 8  # the most tokens one sequence drafts in a step
    lanes: frozenset[str] = frozenset()  # the lanes whose answers draft (the interactive ones by default)
    model: bool = False  # the runner has a draft model, to guess where an answer's own tokens guess nothing


class Lookup:
    """A request's tokens indexed by n-gram (the position after each n-gram's latest occurrence), grown
    as its answer grows: a guess is what followed the latest earlier occurrence of the sequence's last
    n tokens, the longest n first. It keeps its own copy of the tokens, extended by the new ones only."""

    __slots__ = ("index", "tokens", "seen")

    def __init__(self):
        self.index: dict[tuple[int, ...], int] = {}
        self.tokens: list[int] = []
        self.seen = 0  # positions whose n-grams ending before them are indexed

    def guess(self, prompt: list[int], output: list[int], k: int) -> list[int]:
        """Up to `k` tokens guessed to follow a request's prompt and output so far."""
        tokens = self.tokens
        if not tokens:
            tokens += prompt
        have = len(tokens) - len(prompt)
        if have < len(output):
            tokens += output[have:]
        n = len(tokens)
        self._grow(n - 1)  # every n-gram but those ending the sequence: they are the ones looked up
        for size in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
            if n >= size:
                after = self.index.get(tuple(tokens[n - size:]))
                if after is not None:
                    return tokens[after:after + k]
        return []

    def follow(self, tokens: list[int], k: int) -> list[int]:
        """Up to `k` tokens that followed, in this lookup's tokens, the longest n-gram ending `tokens`
        (another sequence's: a member's earlier turn, all of it indexed)."""
        n = len(tokens)
        for size in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
            if n >= size:
                after = self.index.get(tuple(tokens[n - size:]))
                if after is not None and after < len(self.tokens):
                    return self.tokens[after:after + k]
        return []

    @classmethod
    def of(cls, tokens: list[int]) -> "Lookup":
        """A lookup over a whole finished sequence (every n-gram indexed)."""
        lookup = cls()
        lookup.tokens = tokens
        lookup._grow(len(tokens))
        return lookup

    def _grow(self, upto: int) -> None:
        """Index the n-grams that end before each position below `upto`, to the position after them."""
        index, tokens = self.index, self.tokens
        for end in range(max(self.seen, NGRAM_MIN), upto + 1):
            for size in range(NGRAM_MIN, min(NGRAM_MAX, end) + 1):
                index[tuple(tokens[end - size:end])] = end
        self.seen = max(self.seen, upto + 1)


@dataclass
class Acceptance:
    """One (lane, member)'s drafting: the share of drafted tokens its answers accepted (decayed, so it
    follows what the member asks now), apart for a fresh guess and for one that follows a draft wholly
    accepted (a run: a quote goes on); the length chosen last, and the totals shown."""

    accepted: list[float] = field(default_factory=lambda: [PRIOR_FRESH * PRIOR_TRIALS, PRIOR_RUN * PRIOR_TRIALS])
    trials: list[float] = field(default_factory=lambda: [PRIOR_TRIALS, PRIOR_TRIALS])  # tokens checked (fresh, run)
    length: int = 0  # the draft length chosen last
    passed: int = 0  # guesses passed over since it last drafted
    drafted: int = 0  # totals: tokens drafted, and accepted
    accepted_total: int = 0

    def rate(self, run: bool = False) -> float:
        """The chance a drafted token is accepted, given the ones before it were."""
        return self.accepted[run] / self.trials[run]

    def learn(self, drafted: int, accepted: int, run: bool = False) -> None:
        """A draft was checked: the first refused token counts, those after it were never checked."""
        self.accepted[run] = self.accepted[run] * DECAY + accepted
        self.trials[run] = self.trials[run] * DECAY + accepted + (1 if accepted < drafted else 0)
        self.drafted += drafted
        self.accepted_total += accepted


def expected_tokens(rate: float, k: int) -> float:
    """Tokens a step gives an answer drafting `k` (its own, and each guess accepted after the ones before)."""
    return sum(rate ** i for i in range(k + 1))


@dataclass
class Drafting:
    """The scheduler's drafting: each drafting request's lookup and whether its last draft was wholly
    accepted (a run), and each pair's acceptance."""

    settings: DraftSettings = DraftSettings()
    lookups: dict[str, Lookup] = field(default_factory=dict)
    runs: set[str] = field(default_factory=set)  # requests whose last draft was wholly accepted
    earlier: dict = field(default_factory=dict)  # the prompt cache's entries' lookups, by (pool, seq id)
    pairs: dict[tuple[str, str], Acceptance] = field(default_factory=dict)

    def drafts(self, lane: str) -> bool:
        return self.settings.enabled and lane in self.settings.lanes

    def acceptance(self, key: tuple[str, str]) -> Acceptance:
        pair = self.pairs.get(key)
        if pair is None:
            pair = self.pairs[key] = Acceptance()
        return pair

    def guess(self, request_id: str, prompt: list[int], output: list[int], history=tuple) -> list[int]:
        """Up to `max_draft` tokens guessed to follow a request's tokens: from its own lookup, else from
        `history()`, the member's own earlier turns the prompt cache holds (`KVPools.history`: (key,
        tokens) pairs, latest first; never another member's), asked only then."""
        lookup = self.lookups.get(request_id)
        if lookup is None:
            lookup = self.lookups[request_id] = Lookup()
        k = self.settings.max_draft
        found = _text(lookup.guess(prompt, output, k))
        if found:
            return found
        suffix = lookup.tokens[-NGRAM_MAX:]
        for key, tokens in history():
            found = _text(self._earlier(key, tokens).follow(suffix, k))
            if found:
                return found
        return []

    def _earlier(self, key, tokens) -> Lookup:
        """An earlier turn's lookup (its last `HISTORY_TOKENS`), built once while the cache keeps it."""
        known = self.earlier.get(key)
        if known is None or known[0] != len(tokens):
            if len(self.earlier) >= HISTORY_KEPT:
                self.earlier.clear()
            known = self.earlier[key] = (len(tokens), Lookup.of(tokens[-HISTORY_TOKENS:].tolist()))
        return known[1]

    def length(self, key: tuple[str, str], request_id: str, cost: StepCostModel, base: StepShape, cells: int,
               room: int, limit_ms: float, displaced: float = 0.0) -> int:
        """How many of a guess's tokens to draft, at most `room` (0: none pays), by the answer's expected
        tokens (its pair's acceptance) and the step's predicted time with the drafts added (each a
        token attending over `cells`), that time within `limit_ms`. In a step with room to spare, where
        the step's tokens per millisecond are highest. In a step that background's chunks fill
        (`displaced`: a background token's fair-share weight over the answer's lane's), each drafted
        token takes a background token's place: where the tokens the answer gains, less those it
        displaces at that weight, are most. A pair whose guesses stopped paying drafts `PROBE_LENGTH`
        again after `PROBE_EVERY` guesses passed over (in a step with room), so a member whose answers
        start echoing is noticed."""
        pair = self.acceptance(key)
        if room <= 0:
            return 0
        rate = pair.rate(request_id in self.runs)
        base_ms = cost.predict_ms(base)
        best, best_value = 0, 0.0 if displaced else (base.outputs / base_ms if base_ms > 0 else 0.0)
        for k in range(1, room + 1):
            ms = cost.predict_ms(base.plus(StepShape(0, k, k * cells / 1000.0, 0)))  # (`StepPlan.cost_shape`)
            if ms > limit_ms:
                break
            gained = expected_tokens(rate, k) - 1
            value = gained - displaced * k if displaced else (base.outputs + gained) / ms
            if value > best_value:
                best, best_value = k, value
        if best == 0:
            pair.passed += 1
            if pair.passed >= PROBE_EVERY and not displaced:  # (a probe never takes a background chunk's place)
                best = min(PROBE_LENGTH, room)
        if best:
            pair.passed = 0
        pair.length = best
        return best

    def learn(self, key: tuple[str, str], request_id: str, drafted: int, accepted: int) -> None:
        self.acceptance(key).learn(drafted, accepted, request_id in self.runs)
        if accepted == drafted:
            self.runs.add(request_id)
        else:
            self.runs.discard(request_id)

    def forget(self, request_id: str) -> None:
        self.lookups.pop(request_id, None)
        self.runs.discard(request_id)


def _text(guess: list[int]) -> list[int]:
    """A guess up to the first image placeholder (a negative id, `homeai.llama.vision`): an answer is text."""
    if guess and min(guess) < 0:
        return guess[:next(i for i, t in enumerate(guess) if t < 0)]
    return guess
