"""Drafted tokens in a step (`homeai.sched.draft` guesses them, the scheduler places them): cut where a
request's grammar refuses them before the step is decoded (`fit_guesses`), then checked row by row
once it is (`verify`), with the request's own sampler, as one token a step would be sampled.
"""

from __future__ import annotations

import logging

import llama_cpp as ll
import numpy as np

from homeai.llama.model import RunnerError
from homeai.llama.sampling import SAMPLE_REST, GrammarOverBudget, Sampler
from homeai.sched.plan import ScheduledItem, StepPlan, StepResult, new_tuple
from homeai.sched.pools import GENERATE
from homeai.sched.request import Sample

log = logging.getLogger(__name__)


def draft_guesses(plan: StepPlan, draft) -> None:
    """The draft model's guesses for the answers the scheduler asked it of (`StepPlan.model_drafts`), every
    one in its draft sequence at once (`DraftModel.guesses`): each added to its item's row and to
    `drafts`; an answer its draft sequence is still catching up with gets none this step."""
    wants, items = [], []
    for pool in GENERATE:
        for item in plan.batches[pool]:
            asked = plan.model_drafts.get(item.request_id)
            if asked is not None:
                prompt, output, k = asked
                wants.append((draft.seq(pool, item.seq_id), prompt + output, k))
                items.append(item)
    for item, guess in zip(items, draft.guesses(wants)):
        if guess:
            item.tokens.extend(guess)  # (a decode item's own list: `placement.decode_item`)
            plan.drafts[item.request_id] = guess


def fit_guesses(plan: StepPlan, sampler: Sampler) -> None:
    """Drafted tokens a request's grammar refuses are cut from its row before it is decoded (from the
    first refused one on), and from its draft (`StepPlan.drafts`, which the step is settled by)."""
    drafts = plan.drafts
    for pool in GENERATE:
        for item in plan.batches[pool]:
            guess = drafts.get(item.request_id)
            if guess is None or item.params is None or item.params.grammar is None:
                continue
            n = sampler.allowed_guesses(item, guess)
            if n < len(guess):
                del guess[n:], item.tokens[1 + n:]
                if not guess:
                    del drafts[item.request_id]


def verify(sampler: Sampler, memory, ctx, item: ScheduledItem, row: int, outputs: np.ndarray, out: int,
           best: list[int], guess: list[int], result: StepResult) -> int:
    """A decode that carried drafted tokens: its rows (batch rows `row - len(guess)` to `row`, output rows
    from `out`) sampled in turn, as one token a step would sample them, while each pick is the next
    guess. The guesses picked are `result.accepted`, the first other pick (or the one after the last
    guess) `result.samples`, and `memory`'s cells past the accepted guesses are cut. A greedy pick is
    the row's best; a sampled one is drawn from the row as without drafting, so a guess is kept with
    the chance the model gives it, and the pick after a refused one follows the model with that guess
    left out: the standard acceptance rule for a guess that is a single token. Returns the next output row."""
    k = len(guess)
    first = row - k
    accepted: list = []
    try:
        for i in range(k + 1):
            sample = sampler.sample(ctx, item, first + i, outputs, out + i, best[out + i])
            if i == k or sample.is_eog or sample.token != guess[i]:
                break
            accepted.append(sample)
    except GrammarOverBudget as e:  # that request ends with an error, the step goes on
        log.warning("request %s: %s", item.request_id, e)
        result.errors[item.request_id] = str(e)
        sample = new_tuple(Sample, (0, True) + SAMPLE_REST)
    result.samples[item.request_id] = sample
    result.accepted[item.request_id] = accepted
    if len(accepted) < k and not ll.llama_memory_seq_rm(memory, item.seq_id, item.start + 1 + len(accepted), -1):
        raise RunnerError(f"llama.cpp could not cut sequence {item.seq_id}'s refused guesses")
    return out + k + 1
