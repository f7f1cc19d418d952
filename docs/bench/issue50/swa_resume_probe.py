"""Run from the repository root: PYTHONPATH=. .venv/bin/python docs/bench/issue50/swa_resume_probe.py

Raw llama.cpp, Gemma 3 270M: resuming a prefix whose window cells were given away, against the
same prefix intact and against reading it again, with the same chunks (no batch noise between them).
Output: docs/bench/issue50/cache-probe.md."""
import numpy as np, llama_cpp as ll
from pathlib import Path
from tests.conftest import small_config, gemma_gguf
from homeai.llama import model as R
from tests.engine.test_batching import kl

def ctx_for(model):
    p = ll.llama_context_default_params()
    p.n_ctx = 4096; p.n_batch = p.n_ubatch = 128; p.n_seq_max = 16; p.kv_unified = True
    p.n_threads = p.n_threads_batch = 2; p.swa_full = True; p.no_perf = True
    p.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
    return ll.llama_init_from_model(model, p)

def decode(ctx, seq, start, tokens, n_vocab):
    out = None
    for s in range(0, len(tokens), 128):
        chunk = tokens[s:s + 128]
        b = ll.llama_batch_init(len(chunk), 0, 1)
        for i, t in enumerate(chunk):
            b.token[i] = t; b.pos[i] = start + s + i; b.n_seq_id[i] = 1; b.seq_id[i][0] = seq; b.logits[i] = i == len(chunk) - 1
        b.n_tokens = len(chunk)
        assert ll.llama_decode(ctx, b) == 0
        ll.llama_batch_free(b)
        out = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
    return out

R.init_backend()
cfg = small_config(path=gemma_gguf())
model = R.load_model(Path(gemma_gguf()), cfg.model)
vocab = ll.llama_model_get_vocab(model); n_vocab = ll.llama_vocab_n_tokens(vocab)
tok = lambda text, bos=True: R.tokenize_text(vocab, text, bos, True)
house = "<start_of_turn>user\nThe house: " + " ".join(f"room {k} has lamp {k} and blind {k}." for k in range(60))
E = tok(house)[:640] + tok(" Which rooms have blinds?<end_of_turn>\n<start_of_turn>model\n", False)  # 640 = 5 chunks of 128
tail = tok(" Which lamp is on?<end_of_turn>\n<start_of_turn>model\n", False)
A = tok("Good morning, house. What is the weather like today in the garden?")
F = tok("Story: " + "the warm quiet room " * 70)
mem = lambda ctx: ll.llama_get_memory(ctx)
results = {}
for case in ("fresh", "intact", "given away"):
    for n in (256, 384):
        ctx = ctx_for(model); m = mem(ctx)
        decode(ctx, 0, 0, A, n_vocab)
        decode(ctx, 1, 0, E, n_vocab)
        ll.llama_memory_seq_rm(m, 0, -1, -1)  # A's hole
        if case == "given away":
            decode(ctx, 2, 0, F, n_vocab)  # placed in A's hole, then in E's out-of-window cells
        held = (ll.llama_memory_seq_pos_min(m, 1), ll.llama_memory_seq_pos_max(m, 1))
        if case == "fresh":
            decode(ctx, 3, 0, E[:n], n_vocab)  # the same chunks as E's first n
        else:
            ll.llama_memory_seq_cp(m, 1, 3, 0, n)
        results[case, n] = decode(ctx, 3, n, tail, n_vocab)
        print(f"{case:10s} resumed at {n}: E held {held}", flush=True)
        ll.llama_free(ctx)
for n in (256, 384):
    f = results["fresh", n]
    print(f"resume at {n}: KL(fresh, intact) = {kl(f, results['intact', n]):.2e}; KL(fresh, given away) = {kl(f, results['given away', n]):.2e};"
          f" top token fresh {int(np.argmax(f))} intact {int(np.argmax(results['intact', n]))} given away {int(np.argmax(results['given away', n]))}")
