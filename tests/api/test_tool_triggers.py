"""A lazy tool grammar's trigger, in llama.cpp itself, for every family's form (tests/tools/): the
grammar starts at a call's opening and nowhere else. llama.cpp searches the output for the trigger
and hands the grammar the text from the match to the end; text there that the grammar refuses
aborts the whole process (a C++ exception through the C API). So every check runs in a child
process: an abort fails this test, naming the text, instead of killing the test session.

Run: .venv/bin/python -m pytest tests/api/test_tool_triggers.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]

CHILD = r'''
import random
import llama_cpp as ll
from homeai.app import load_runner
from homeai.llama.sampling import grammar_sampler
from tests.conftest import small_config
from tests.tools.replies import plan_for
from tests.tools.test_grammars import CALLS, FORMS, IDS, written

cfg = small_config(n_ctx=256, n_seq_max=1, n_threads=1)
runner = load_runner(cfg, embeddings=False, grammar=False)
tokens = lambda text: runner.tokenize(text, add_special=False)

# Replies a small model writes: an example call after some text, a call's opener inside text,
# JSON that is not a call; and random strings of every family's openers, brackets and words.
texts = ["Here is an example: {}",
         "You can call them as:\n{\"tool_calls\": [{\"name\": \"turn_on\", \"arguments\": {}}",
         "Set it to {{temperature}}.", "Try [TOOL_CALLS] later {}", "x <tool_call>{}</tool_call>", "{}", " {{}}",
         "{\"city\": \"Paris\"}", "Sure! {\"name\": {}}", "<tool_call>\n<function=>", "[TOOL_CALLS]x[ARGS]{}",
         "<|python_tag|>print(1)", "<start_function_call>call:x{}", "<|tool_call>call:{}",
         "<|tool_call|>{}<|/tool_call|>"]
fragments = ["{", "}", "{}", "{{", "{\"", "\"", "[", "]", ":", ",", ";", " ", "\n", "tool_calls", "name", "arguments",
             "parameters", "intent__HassTurnOn", "intent", "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]",
             "<function=", "<parameter=", "<|python_tag|>", "<|tool_call|>", "<|/tool_call|>", "functools[",
             "<start_function_call>", "<|tool_call>", "call:", "<escape>", "<|channel|>", "commentary",
             " to=functions.", "<|start|>assistant", "<|constrain|>json", "<|message|>", "Sure", " here"]
rng = random.Random(7)
texts += ["".join(rng.choice(fragments) for _ in range(rng.randint(1, 14))) for _ in range(400)]

for (fmt, source, _before), name in zip(FORMS, IDS):
    plan = plan_for(fmt, source)
    grammar = plan.grammar()
    for text in texts:
        print(name, repr(text), flush=True)  # the last line names the text if llama.cpp aborts
        sampler = grammar_sampler(runner.vocab, grammar)
        for token in tokens(text):  # as the sampler chain does: a token the grammar masks is never picked
            if not runner.sampler.candidates.allows(sampler, token):
                break
            ll.llama_sampler_accept(sampler, token)
        ll.llama_sampler_free(sampler)
    # The trigger still fires: once a reply opens a call, the grammar holds the rest of it.
    call = written(plan, CALLS[:1])
    opening = call[:call.index("intent__")]
    sampler = grammar_sampler(runner.vocab, grammar)
    for token in tokens(opening):
        ll.llama_sampler_accept(sampler, token)
    held = [runner.sampler.candidates.allows(sampler, tokens(word)[0]) for word in ("intent", "Hello")]
    print("held", name, held, flush=True)
    ll.llama_sampler_free(sampler)
print("checked", len(texts), flush=True)
'''


def test_a_call_opener_inside_text_never_starts_the_grammar_there():
    from tests.tools.test_grammars import IDS

    child = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=900)
    lines = [line for line in child.stdout.splitlines() if line.startswith((*IDS, "held ", "checked "))]
    why = [line for line in (child.stdout + child.stderr).splitlines() if "what()" in line or "Error" in line]
    assert child.returncode == 0, f"llama.cpp aborted at {lines[-1] if lines else '?'}: {why[-3:]}"
    assert lines[-1] == "checked 415"
    held = [line for line in lines if line.startswith("held ")]
    assert held == [f"held {name} [True, False]" for name in IDS], held
