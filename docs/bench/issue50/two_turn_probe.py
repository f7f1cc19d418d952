"""Run from the repository root: PYTHONPATH=. .venv/bin/python docs/bench/issue50/two_turn_probe.py

Issue 50, point 4: Gemma 3's second turn with the prompt cache on and off. Greedy two-turn
conversation (Gemma's own turn format as a raw prompt); the first-token log-probabilities of
turn 2: cache off (alone), cache on (turn 1's cells reused), and, for the batch noise, the same
prompt beside others and read in smaller chunks. Output: docs/bench/issue50/cache-probe.md."""
import numpy as np
from tests.conftest import small_config, gemma_gguf
from homeai.app import load_runner
from homeai.sched.request import Request, SamplingParams
from tests.engine.test_prefix_reuse import Driver, forced
from tests.engine.test_batching import kl, log_softmax, batched_run, QUESTIONS

cfg = small_config(path=gemma_gguf())
runner = load_runner(cfg, embeddings=False, grammar=False)
tok = lambda text: runner.tokenize(text, special=True)
T1 = "<start_of_turn>user\nName three fruits.<end_of_turn>\n<start_of_turn>model\n"

def first_row(driver, tokens, rid):
    r = Request(rid, "chat", "a", list(tokens), 0.0, params=SamplingParams(temperature=0, max_tokens=12, record_logits=True))
    driver.run(r)
    return r

def describe(name, logits, ref=None):
    lp = log_softmax(logits)
    top = np.argsort(-lp)[:3]
    s = f"{name:34s} top: " + ", ".join(f"{runner.detokenize([int(t)])!r} {lp[t]:.3f}" for t in top)
    if ref is not None:
        s += f" | KL vs alone {kl(ref, logits):.2e}, max |dlogp| top10 {np.abs(log_softmax(ref)[np.argsort(-ref)[:10]] - lp[np.argsort(-ref)[:10]]).max():.2e}"
    print(s, flush=True)

# turn 1, then turn 2's prompt: turn 1 + its answer as text + the next question
d = Driver(runner, cache=False)
t1 = first_row(d, tok(T1), "t1")
answer = runner.detokenize(t1.output_tokens)
print("turn 1 answer:", repr(answer))
T2 = T1 + answer.strip() + "<end_of_turn>\n<start_of_turn>user\nName three vegetables.<end_of_turn>\n<start_of_turn>model\n"
p2 = tok(T2)
# alone, cache off
d = Driver(runner, cache=False)
alone = first_row(d, p2, "alone")
# cache on: turn 1 then turn 2 in the same driver
d = Driver(runner, cache=True)
first_row(d, tok(T1), "t1")
on = first_row(d, p2, "on")
print(f"turn 2 prompt {len(p2)} tokens; cache on reused {on.num_cached_tokens}")
describe("turn 2 first token, cache off", alone.samples[0].logits)
describe("turn 2 first token, cache on", on.samples[0].logits, alone.samples[0].logits)
print("answers  off:", repr(runner.detokenize(alone.output_tokens)))
print("answers   on:", repr(runner.detokenize(on.output_tokens)))
# position by position over the answer, teacher-forced with the cache-off tokens
d = Driver(runner, cache=True); first_row(d, tok(T1), "t1")
f_on = forced(p2, alone.output_tokens, "f_on"); d.run(f_on)
kls = [kl(a.logits, b.logits) for a, b in zip(alone.samples, f_on.samples)]
print("teacher-forced answer, cache on vs off: KL per position", [f"{k:.1e}" for k in kls])
# the noise: the same prompt beside others (no cache), teacher-forced
others = [runner.tokenize(f"<start_of_turn>user\n{q}<end_of_turn>\n<start_of_turn>model\n", special=True) for q in QUESTIONS]
batched = batched_run(runner, p2, alone.output_tokens, others_tokens=others)
kb = [kl(a.logits, b) for a, b in zip(alone.samples, batched)]
print("teacher-forced answer, beside others vs alone: KL per position", [f"{k:.1e}" for k in kb])
describe("turn 2 first token, beside others", batched[0], alone.samples[0].logits)
# the noise of reading the same prompt in other chunk sizes (first token of turn 2)
from tests.engine.test_batching import drive
for size in (8, 16, 32, 64):
    r = Request(f"c{size}", "chat", "a", list(p2), 0.0, params=SamplingParams(forced_tokens=tuple(alone.output_tokens[:1]), record_logits=True))
    drive(runner, {0: [r]}, max_step_tokens=size)
    print(f"turn 2 read in chunks of {size:3d}: first-token KL vs alone {kl(alone.samples[0].logits, r.samples[0].logits):.2e}")
