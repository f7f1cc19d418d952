"""What llama.cpp costs to weigh one token of the whole vocabulary under a schema pattern's grammar,
beside whether `homeai.tools.patterns` takes the pattern (issue 55): the figures its rule is grounded in.

For each pattern: taken or refused, and the CPU milliseconds of one `llama_sampler_apply` over the
model's whole vocabulary (the least of 3) once the grammar has read `"` and the text after `@@`.
Only the vocabulary is loaded; a refused pattern is weighed too, so keep the nesting small.

    python scripts/pattern_cost.py                        # the table of the module's docstring
    python scripts/pattern_cost.py '^([a-z]+)+$@@abc' ...  # patterns of your own
"""

from __future__ import annotations

import ctypes
import sys
import time

import llama_cpp as ll
import numpy as np

from homeai.config import GrammarConfig, from_dict
from homeai.llama.grammar import json_schema_grammar
from homeai.llama.model import init_backend
from homeai.llama.sampling import Candidates
from homeai.models import generation_model
from homeai.tools.patterns import PatternError, check

DEFAULT = ["^[a-z]+$@@abc", "^((([a-z])+)+)+$@@abc", "^(((([a-z])+)+)+)+$@@abc", "^((((([a-z])+)+)+)+)+$@@abc",
           "^([a-df-z]|[a-df-z][a-df-z])+$@@aa", "^([a-df-z]|[a-df-z]|[a-df-z]|[a-df-z])+$@@aa",
           "^([a-z0-9-]+[.])+[a-z]{2,}$@@abc.de", "^[^@]+@[^@]+[.][a-z]{2,}$@@ab@cd", "^([0-9]+,)*[0-9]+$@@12,3",
           "^" + "[a-df-z]*" * 5 + "$@@aa", "^" + "[a-df-z]*" * 6 + "$@@aa", "^" + "[a-df-z]*" * 8 + "$@@aa",
           "^" + "[a-df-z]?" * 5 + "$@@aa", "^" + "[a-df-z]?" * 12 + "$@@aa",
           "^[a-df-z]{0,1000}$@@" + "a" * 40]


def main(lines: list[str]) -> None:
    init_backend()
    params = ll.llama_model_default_params()
    params.vocab_only = True
    model = ll.llama_model_load_from_file(str(generation_model(from_dict({"model": {}}))).encode(), params)
    vocab = ll.llama_model_get_vocab(model)
    candidates = Candidates(ll.llama_vocab_n_tokens(vocab))
    logits = np.random.default_rng(0).random(len(candidates.ids), dtype=np.float32)
    limits = GrammarConfig()
    for line in lines:
        pattern, _, text = line.partition("@@")
        try:
            check(pattern, limits.max_repeat, limits.max_enum)
            verdict = "taken"
        except PatternError:
            verdict = "refused"
        took = weigh(vocab, candidates, logits, json_schema_grammar({"type": "string", "pattern": pattern}), '"' + text)
        print(f"{took * 1000:9.1f} ms  {verdict:7}  {pattern}  (after {text!r})", flush=True)
    ll.llama_model_free(model)


def weigh(vocab, candidates: Candidates, logits: np.ndarray, gbnf: str, text: str) -> float:
    sampler = ll.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    if not sampler:
        raise SystemExit(f"llama.cpp refused the grammar of {gbnf[:200]!r}")
    try:
        tokens = (ll.llama_token * 256)()
        for token in tokens[:ll.llama_tokenize(vocab, text.encode(), len(text.encode()), tokens, 256, False, True)]:
            if not candidates.allows(sampler, token):
                raise SystemExit(f"the grammar does not take {text!r}")
            ll.llama_sampler_accept(sampler, token)
        took = []
        for _ in range(3):
            cur = candidates.fill(logits)
            start = time.process_time()
            ll.llama_sampler_apply(sampler, ctypes.byref(cur))
            took.append(time.process_time() - start)
        return min(took)
    finally:
        ll.llama_sampler_free(sampler)


if __name__ == "__main__":
    main(sys.argv[1:] or DEFAULT)
