"""The runner: the only module that imports llama_cpp.

It loads one model once, holds a generation context (one unified KV cache of `n_ctx`
cells, `n_seq_max` sequence ids), optionally a second one for the interactive lanes
(`interactive_n_ctx` cells), and an embeddings context (mean pooling, over the same
weights or a configured embedding GGUF). Each KV pool of the scheduler is one of these
contexts, its sequence ids the context's own. The runner turns each `StepPlan` into one
`llama_decode` per pool with tokens in the step: tokens, positions, sequence ids, and
logits only on the rows that will be sampled. Tokens are sampled only once every context
has decoded, so a step that finds no KV slot in one context is undone in the others and
keeps nothing. Each request samples with its own llama.cpp sampler chain, built once at its
first sampled row and kept across preemption so a resumed request continues its random stream;
a greedy request with nothing to weigh first (no penalty, no grammar) has no chain: its pick is
the row's highest logit, read in place (llama.cpp's greedy pick, a tie to the lowest id, without
copying the vocabulary into a candidate array: ~0.15 ms a row on the CPU). A request held to a
grammar from its first token has llama.cpp's grammar sampler beside its chain: the chain's pick
is checked against the grammar, and only a pick the grammar refuses pays for masking: the best-scored 256
tokens first, then further chunks in score order only while they cannot give the same pick (llama.cpp's common
sampler checks the pick first too; masking first costs every token a pass over the vocabulary,
~0.4 s against a 256-value enum on 2 cores). The clock is read between chunks: a request whose grammar
takes longer than `[grammar] step_budget_ms` to pick a token ends with an error (`StepResult.errors`)
instead of holding the shared step. A grammar is built here only once the grammar
checker's process has built it (`homeai.engine.grammar_check`). A lazy grammar is beside the chain
too: until its trigger it allows every token (its check costs a one-token pass), and after it the
call it holds is weighed as any grammar is, within the same budget.

The batch arrays are numpy buffers the `llama_batch` points into, so filling a step is a few
assignments a row (a chunk's by slices), not a Python loop over tokens.
"""

from __future__ import annotations

import copy
import ctypes
import json
import logging
import os
import random
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as ll
import numpy as np
from llama_cpp.llama_grammar import SchemaConverter

from homeai import gguf_header
from homeai.config import GrammarConfig, ModelConfig
from homeai.engine import families, gpu, kvsize, markup, template
from homeai.engine.grammar_check import GrammarChecker
from homeai.threads import CoreWatch
from homeai.sched.request import Grammar, Sample, SamplingParams
from homeai.sched.pools import GENERATE, Copy, Drop, Pool
from homeai.sched.plan import new_tuple
from homeai.sched.prefix import Memory
from homeai.sched.scheduler import ScheduledItem, StepPlan, StepResult

log = logging.getLogger(__name__)


class RunnerError(RuntimeError):
    """llama.cpp failed in a way the scheduler cannot work around (not a full KV cache)."""


class GrammarOverBudget(Exception):
    """A member's grammars took longer than the step budget to pick their tokens in one step: the
    request whose pick ran past it ends."""

    def __init__(self, took_s: float, budget_s: float, before_s: float = 0.0):
        others = f" (after {before_s * 1000:.0f} ms of its member's other grammars in this step)" if before_s else ""
        super().__init__(f"its grammar took {took_s * 1000:.0f} ms to pick one token{others}, more than "
                         f"[grammar] step_budget_ms = {budget_s * 1000:g}: the answer ends here")


class GrammarError(ValueError):
    """A JSON schema llama-cpp-python's converter cannot turn into a grammar: the request's fault."""


@dataclass(frozen=True)
class ModelInfo:
    path: str
    description: str
    size_bytes: int
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_ctx: int
    n_seq_max: int
    max_seq_len: int  # the longest sequence (prompt and output) one request may hold
    interactive_max_seq_len: int  # the same for the interactive lanes (their own cache, if any)
    embed_path: str
    embed_n_embd: int
    embed_max_tokens: int
    embed_chunked: bool  # the embedding model keeps a KV cache: an input may be embedded in chunks
    gpu_offload: bool
    system_info: str
    interactive_n_ctx: int = 0  # cells of the interactive lanes' own cache (0: they share the main one)
    kv: kvsize.Sizes | None = None  # how the generation caches were sized, and what their cells cost


_LOG_KEEP = {ll.GGML_LOG_LEVEL_ERROR} if hasattr(ll, "GGML_LOG_LEVEL_ERROR") else {4}


@ll.llama_log_callback
def _quiet_log(level, text, user_data):  # llama.cpp logs every tensor at load; keep errors
    if level in _LOG_KEEP:
        os.write(2, text)


_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        ll.llama_log_set(_quiet_log, ctypes.c_void_p(0))
        ll.llama_backend_init()
        _backend_ready = True


def backend_facts() -> dict:
    """What this llama.cpp build can do, for `homeai doctor`."""
    _init_backend()
    info = ll.llama_print_system_info().decode(errors="replace")
    names = ["CPU"] + [n for n in ("CUDA", "Metal", "Vulkan", "ROCm", "HIP", "SYCL") if n.upper() in info.upper()]
    return {"backends": names, "gpu_offload": bool(ll.llama_supports_gpu_offload()), "system_info": info.strip()}


def _chat_template_source(model, vocab, configured: str = "") -> dict:
    """What `template.choose` decides from: the GGUF's `tokenizer.chat_template` (None when it has
    none), its BOS and EOS token text, its architecture (`general.architecture`), the vocabulary's
    control-token texts, and the configured `model.chat_template`."""
    source = ll.llama_model_chat_template(model, None)
    return {"source": source.decode("utf-8", errors="replace") if source else None,
            "bos_token": _token_text(vocab, ll.llama_vocab_bos(vocab)),
            "eos_token": _token_text(vocab, ll.llama_vocab_eos(vocab)),
            "architecture": _meta(model, "general.architecture"),
            "control_texts": _control_texts(vocab), "configured": configured}


def _meta(model, key: str) -> str:
    """A GGUF metadata value as text ("" when the model has no such key)."""
    buf = ctypes.create_string_buffer(256)
    n = ll.llama_model_meta_val_str(model, key.encode(), buf, 256)
    return buf.value.decode("utf-8", errors="replace") if n >= 0 else ""


def _token_text(vocab, token: int) -> str:
    if token < 0:  # the model has no such token
        return ""
    buf = ctypes.create_string_buffer(256)
    n = ll.llama_token_to_piece(vocab, token, buf, 256, 0, True)
    return buf.raw[:max(n, 0)].decode("utf-8", errors="replace")


def _tokenize(vocab, text: str, add_special: bool, parse_special: bool) -> list[int]:
    data = text.encode("utf-8")
    capacity = len(data) + 16
    buf = (ll.llama_token * capacity)()
    n = ll.llama_tokenize(vocab, data, len(data), buf, capacity, add_special, parse_special)
    if n < 0:
        buf = (ll.llama_token * -n)()
        n = ll.llama_tokenize(vocab, data, len(data), buf, -n, add_special, parse_special)
    return list(buf[:n])


def _control_texts(vocab) -> tuple[str, ...]:
    """The texts of the vocabulary's control tokens (`<|im_start|>`, `<|im_end|>`, ...): what
    tokenizing with special tokens parsed turns into one token and plain text does not."""
    wanted = ll.LLAMA_TOKEN_ATTR_CONTROL | ll.LLAMA_TOKEN_ATTR_UNKNOWN
    texts = set()
    for token in range(ll.llama_vocab_n_tokens(vocab)):
        if ll.llama_vocab_get_attr(vocab, token) & wanted:
            text = (ll.llama_vocab_get_text(vocab, token) or b"").decode("utf-8", errors="replace")
            if text:
                texts.add(text)
    return tuple(sorted(texts))


def _reply_markup(vocab) -> frozenset[int]:
    """The control tokens whose text a reply keeps (`markup.REPLY`: tool-call and thinking markers),
    so that the reply's parsers see them; every other control token renders as nothing."""
    wanted = ll.LLAMA_TOKEN_ATTR_CONTROL | ll.LLAMA_TOKEN_ATTR_USER_DEFINED
    out = set()
    for token in range(ll.llama_vocab_n_tokens(vocab)):
        if ll.llama_vocab_get_attr(vocab, token) & wanted and not ll.llama_vocab_is_eog(vocab, token):
            if (ll.llama_vocab_get_text(vocab, token) or b"").decode("utf-8", errors="replace") in markup.REPLY:
                out.add(token)
    return frozenset(out)


def _control_tokens(vocab, texts: frozenset[str]) -> frozenset[int]:
    """The vocabulary's control tokens whose text is one of `texts`."""
    out = set()
    for token in range(ll.llama_vocab_n_tokens(vocab)):
        if ll.llama_vocab_get_attr(vocab, token) & ll.LLAMA_TOKEN_ATTR_CONTROL:
            if (ll.llama_vocab_get_text(vocab, token) or b"").decode("utf-8", errors="replace") in texts:
                out.add(token)
    return frozenset(out)


def chat_template_choice(model_path: Path, configured: str = "") -> template.TemplateChoice:
    """Which chat template a model would be served with, for `homeai doctor`: reads the
    vocabulary and metadata only (a fraction of a second), not the weights."""
    _init_backend()
    params = ll.llama_model_default_params()
    params.vocab_only = True
    model = ll.llama_model_load_from_file(str(model_path).encode(), params)
    if not model:
        raise RunnerError(f"llama.cpp could not read the model {model_path}")
    try:
        return template.choose(**_chat_template_source(model, ll.llama_model_get_vocab(model), configured))
    finally:
        ll.llama_model_free(model)


class _Batch:
    """A llama_batch whose arrays are numpy buffers, one sequence id per token."""

    def __init__(self, capacity: int):
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        row = ctypes.POINTER(ctypes.c_int32)
        base = self.seq.ctypes.data
        self.seq_ptrs = (row * capacity)(*[ctypes.cast(base + 4 * i, row) for i in range(capacity)])
        self.num_outputs = 0  # rows of the last fill that want logits
        self.c = ll.llama_batch()
        self.c.token = self.token.ctypes.data_as(ctypes.POINTER(ll.llama_token))
        self.c.embd = None
        self.c.pos = self.pos.ctypes.data_as(ctypes.POINTER(ll.llama_pos))
        self.c.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.c.seq_id = ctypes.cast(self.seq_ptrs, ctypes.POINTER(ctypes.POINTER(ll.llama_seq_id)))
        self.c.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))

    def fill(self, rows: list[tuple[int, int, list[int], bool]]) -> list[int]:
        """Rows are (seq_id, start, tokens, wants_last_logits); returns each row's last index (and
        counts the rows wanting logits, `num_outputs`). A
        decode row (one token) is written element by element: a numpy slice assignment costs ~3,000
        instructions, an element ~800 (so up to ~16 decode rows cost less than a column at a time)."""
        token, pos, seq, logits = self.token, self.pos, self.seq, self.logits
        n = outputs = 0
        last = []
        for seq_id, start, tokens, wants in rows:
            k = len(tokens)
            if k == 1:
                token[n] = tokens[0]
                pos[n] = start
                seq[n] = seq_id
                logits[n] = wants
            else:
                token[n:n + k] = tokens
                pos[n:n + k] = np.arange(start, start + k, dtype=np.int32)
                seq[n:n + k] = seq_id
                logits[n:n + k] = 0
                if wants:
                    logits[n + k - 1] = 1
            n += k
            outputs += wants
            last.append(n - 1)
        self.c.n_tokens = n
        self.num_outputs = outputs  # the rows llama.cpp computes logits for
        return last


class _Candidates:
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


def _load_model(path: Path, cfg: ModelConfig):
    params = ll.llama_model_default_params()
    params.n_gpu_layers = gpu.offloaded_layers(cfg, bool(ll.llama_supports_gpu_offload()))
    params.use_extra_bufts = cfg.use_extra_bufts
    model = ll.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise RunnerError(f"llama.cpp could not load the model {path}")
    return model


def _flash_attn(cfg: ModelConfig) -> int:
    """llama.cpp's CPU flash attention is several times slower than plain attention once a sequence's
    own context is long (a 16-token chunk at position 2048: 510 ms against 112 ms on 2 cores), so
    `auto` turns it on only when layers are offloaded to a GPU."""
    if cfg.flash_attn == "on":
        return ll.LLAMA_FLASH_ATTN_TYPE_ENABLED
    if cfg.flash_attn == "off" or not gpu.offloaded_layers(cfg, bool(ll.llama_supports_gpu_offload())):
        return ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
    return ll.LLAMA_FLASH_ATTN_TYPE_AUTO


def _context(model, *, n_ctx: int, n_batch: int, n_seq_max: int, n_threads: int, embeddings: bool,
             flash_attn: int):
    params = ll.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = params.n_ubatch = n_batch  # one decode is one ubatch: a failed one keeps nothing
    params.n_seq_max = n_seq_max
    params.n_threads = params.n_threads_batch = n_threads
    params.kv_unified = True
    # A sliding-window model's window cells as many as the cache's (llama.cpp's C default, llama-server's
    # --swa-full): the scheduler counts a cache's cells once for every layer, which holds for the
    # windowed layers only so. Window-sized (n_swa a sequence), cells two sequences share (seq_cp,
    # never given away) could fill them while the count says there is room.
    params.swa_full = True
    params.flash_attn_type = flash_attn
    params.no_perf = True
    if embeddings:
        params.embeddings = True
        params.pooling_type = ll.LLAMA_POOLING_TYPE_MEAN
    ctx = ll.llama_init_from_model(model, params)
    if not ctx:
        raise RunnerError(f"llama.cpp could not create a context of {n_ctx} cells")
    return ctx


def _kv_sizes(model, cfg: ModelConfig) -> kvsize.Sizes:
    """The generation caches' cells: as configured, or from the loaded model within the memory budget."""
    arch = _meta(model, "general.architecture")
    hparams = {"context_length": ll.llama_model_n_ctx_train(model), "block_count": ll.llama_model_n_layer(model),
               "embedding_length": ll.llama_model_n_embd(model), "attention.head_count": ll.llama_model_n_head(model),
               "attention.head_count_kv": ll.llama_model_n_head_kv(model)}
    for key in ("attention.key_length", "attention.value_length"):
        value = _meta(model, f"{arch}.{key}")
        hparams[key] = int(value) if value and value.isdigit() else None
    return _plan(cfg, hparams)


def kv_sizes(cfg: ModelConfig, model_path: Path) -> kvsize.Sizes | None:
    """The same without loading the model (`homeai doctor`), from its GGUF header; None when the
    header does not say its shape (per-layer head counts are arrays the reader skips)."""
    meta = gguf_header.metadata(model_path)
    arch = meta.get("general.architecture", "")
    keys = ("context_length", "block_count", "embedding_length", "attention.head_count",
            "attention.head_count_kv", "attention.key_length", "attention.value_length")
    hparams = {key: meta.get(f"{arch}.{key}") for key in keys}
    hparams["attention.head_count_kv"] = hparams["attention.head_count_kv"] or hparams["attention.head_count"]
    if not all(isinstance(hparams[key], int) for key in keys[:5]):
        return None
    return _plan(cfg, hparams)


def _plan(cfg: ModelConfig, hparams: dict) -> kvsize.Sizes:
    n_head, n_head_kv = max(hparams["attention.head_count"], 1), max(hparams["attention.head_count_kv"], 1)
    key_len = hparams.get("attention.key_length") or hparams["embedding_length"] // n_head
    value_len = hparams.get("attention.value_length") or key_len
    offloaded = gpu.offloaded_layers(cfg, bool(ll.llama_supports_gpu_offload())) != 0
    shape = kvsize.Shape(n_ctx_train=hparams["context_length"], n_layer=hparams["block_count"], n_head=n_head,
                         n_embd_k=n_head_kv * key_len, n_embd_v=n_head_kv * value_len, n_batch=cfg.n_batch,
                         flash_attn=_flash_attn(cfg) != ll.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    return kvsize.plan(shape, n_ctx=cfg.n_ctx, interactive_n_ctx=cfg.interactive_n_ctx,
                       free_bytes=_free_bytes(offloaded), share=cfg.kv_memory_share)


def _meta(model, key: str) -> str | None:
    buf = ctypes.create_string_buffer(128)
    n = ll.llama_model_meta_val_str(model, key.encode(), buf, 128)
    return buf.value.decode(errors="replace") if n >= 0 else None


def _free_bytes(gpu_offload: bool) -> int:
    """Memory free for KV cells now: the first GPU's when layers are offloaded, else RAM's (MemAvailable)."""
    if gpu_offload:
        free = _gpu_free_bytes()
        if free:
            return free
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _gpu_free_bytes() -> int:
    from llama_cpp._ggml import libggml as g  # ggml's device API, which llama_cpp does not wrap

    g.ggml_backend_dev_get.restype = ctypes.c_void_p
    g.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    g.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    g.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                          ctypes.POINTER(ctypes.c_size_t)]
    g.ggml_backend_dev_count.restype = ctypes.c_size_t
    for i in range(g.ggml_backend_dev_count()):
        dev = g.ggml_backend_dev_get(i)
        if g.ggml_backend_dev_type(dev) in (1, 2):  # GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            return free.value
    return 0


class Runner:
    grammar_checker: GrammarChecker | None = None  # started at the first grammar (`check_grammar`)

    def __init__(self, cfg: ModelConfig, model_path: Path, embedding_path: Path | None = None,
                 grammar: GrammarConfig | None = None):
        _init_backend()
        self.cfg = cfg
        self.grammar_limits = grammar or GrammarConfig()
        self.grammar_budget_s = self.grammar_limits.step_budget_ms / 1000.0  # one member's grammars, one step
        self._grammar_spent: dict[str, float] = {}  # this step's grammar time so far, per member (SamplingParams.owner)
        # 0: every core while the box is quiet, fewer while other processes keep cores busy (homeai.threads)
        self.core_watch = None if cfg.n_threads else CoreWatch()
        threads = cfg.n_threads or self.core_watch.threads()
        self.num_threads = threads
        gpu.apply(gpu.cuda_graphs(cfg, bool(ll.llama_supports_gpu_offload())))  # before any decode
        self.model = _load_model(model_path, cfg)
        self.vocab = ll.llama_model_get_vocab(self.model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        facts = _chat_template_source(self.model, self.vocab, cfg.chat_template)
        self.chat = template.load(**facts)  # compiled once, here
        self.control_texts = facts["control_texts"]  # wrapped apart in members' text (template.Marks)
        self._turn_openers = _control_tokens(self.vocab, families.TURN_OPENERS)  # end a reply, as its EOG does
        self._markup = _reply_markup(self.vocab)  # control tokens a reply's text keeps (markup.REPLY)
        self.kv = _kv_sizes(self.model, cfg)
        self.ctx = _context(self.model, n_ctx=self.kv.main, n_batch=cfg.n_batch, n_seq_max=cfg.n_seq_max,
                            n_threads=threads, embeddings=False, flash_attn=_flash_attn(cfg))
        self.memory = ll.llama_get_memory(self.ctx)
        self.ictx = None  # the interactive lanes' context, when they have their own cache
        if self.kv.interactive:
            self.ictx = _context(self.model, n_ctx=self.kv.interactive, n_batch=cfg.n_batch,
                                 n_seq_max=cfg.n_seq_max, n_threads=threads, embeddings=False,
                                 flash_attn=_flash_attn(cfg))
        self.imemory = ll.llama_get_memory(self.ictx) if self.ictx else None
        self.embed_model = _load_model(embedding_path, cfg) if embedding_path else self.model
        self.embed_ctx = _context(self.embed_model, n_ctx=cfg.embed_n_ctx, n_batch=cfg.embed_n_ctx,
                                  n_seq_max=cfg.embed_n_seq_max, n_threads=threads, embeddings=True,
                                  flash_attn=_flash_attn(cfg))
        self.embed_memory = ll.llama_get_memory(self.embed_ctx)
        self._contexts = {Pool.MAIN: self.ctx, Pool.INTERACTIVE: self.ictx, Pool.EMBED: self.embed_ctx}
        self._memories = {Pool.MAIN: self.memory, Pool.INTERACTIVE: self.imemory, Pool.EMBED: self.embed_memory}
        # where a sequence may be resumed, for the scheduler's prompt cache (llama.cpp's facts, prefix.Memory)
        self.kv_memory = Memory(window=max(ll.llama_model_n_swa(self.model), 0),
                                recurrent=ll.llama_model_is_recurrent(self.model) or ll.llama_model_is_hybrid(self.model),
                                held=self.held)
        self.batch = _Batch(cfg.n_batch)
        self.embed_batch = _Batch(cfg.embed_n_ctx)
        self.samplers: dict[str, _Sampling] = {}  # per request in flight, kept across preemption
        self._eog: dict[int, bool] = {}  # whether a token ends generation, asked once a token
        self.candidates = _Candidates(self.n_vocab)
        self._pooled: dict[str, np.ndarray] = {}  # embedding inputs in flight: their chunks' summed vectors
        self._pieces: dict[int, bytes] = {}
        self._launched = 0.0  # when the step in flight was launched (`launch`), and what it decoded
        self._decoded: list = []
        self.info = self._info(model_path, embedding_path)

    def _info(self, model_path: Path, embedding_path: Path | None) -> ModelInfo:
        desc = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self.model, desc, 256)
        n_ctx_train = ll.llama_model_n_ctx_train(self.model)
        return ModelInfo(
            path=str(model_path), description=desc.value.decode(errors="replace"),
            size_bytes=ll.llama_model_size(self.model), n_vocab=self.n_vocab, n_ctx_train=n_ctx_train,
            n_embd=ll.llama_model_n_embd(self.model), n_ctx=self.kv.main, n_seq_max=self.cfg.n_seq_max,
            max_seq_len=min(self.kv.main, n_ctx_train),
            interactive_max_seq_len=min(self.kv.interactive or self.kv.main, n_ctx_train),
            embed_path=str(embedding_path or model_path), embed_n_embd=ll.llama_model_n_embd(self.embed_model),
            embed_max_tokens=self.cfg.embed_n_ctx, embed_chunked=bool(self.embed_memory),
            gpu_offload=bool(ll.llama_supports_gpu_offload()),
            system_info=ll.llama_print_system_info().decode(errors="replace").strip(),
            interactive_n_ctx=self.kv.interactive, kv=self.kv)

    # ---- text ------------------------------------------------------------------

    def tokenize(self, text: str | template.ChatPrompt, *, add_special: bool = True, embedding: bool = False,
                 special: bool = False) -> list[int]:
        """Text's tokens, BOS (and EOS, for a vocabulary that wants one) added with `add_special`.
        Text is text: a control token's text in it (`<|im_start|>`) is characters, unless `special`
        (a raw prompt, all its member's own). A `ChatPrompt` is tokenized part by part, control
        tokens parsed only in the template's own text, into `PromptTokens` that know its public
        prefix."""
        if isinstance(text, template.ChatPrompt):
            return self._tokenize_chat(text, add_special)
        vocab = ll.llama_model_get_vocab(self.embed_model) if embedding else self.vocab
        return _tokenize(vocab, text, add_special, special)

    def _tokenize_chat(self, prompt: template.ChatPrompt, add_special: bool) -> template.PromptTokens:
        """Each part apart, so no token spans two writers: the public prefix's tokens are the same
        whatever a member wrote after it, and a member's text never merges into a control token."""
        tokens: list[int] = []
        if add_special and ll.llama_vocab_get_add_bos(self.vocab) and ll.llama_vocab_bos(self.vocab) >= 0:
            tokens.append(ll.llama_vocab_bos(self.vocab))
        public_len = client_len = None  # where the first text a member wrote starts; and a user
        for part in prompt.parts:
            if public_len is None and part.source in (template.Source.CLIENT, template.Source.MEMBER):
                public_len = len(tokens)
            if client_len is None and part.source is template.Source.MEMBER:
                client_len = len(tokens)
            tokens += _tokenize(self.vocab, part.text, False, part.source is template.Source.TEMPLATE)
        if add_special and ll.llama_vocab_get_add_eos(self.vocab) and ll.llama_vocab_eos(self.vocab) >= 0:
            tokens.append(ll.llama_vocab_eos(self.vocab))
        return template.PromptTokens(tokens, len(tokens) if public_len is None else public_len,
                                     len(tokens) if client_len is None else client_len)

    def piece(self, token: int) -> bytes:
        """A token's bytes; special tokens (end of turn, ...) render as nothing, except the reply's
        markup (`markup.REPLY`: `[TOOL_CALLS]`, `<|channel|>`, ...), which renders as its text."""
        cached = self._pieces.get(token)
        if cached is None:
            special = token in self._markup
            buf = ctypes.create_string_buffer(64)
            n = ll.llama_token_to_piece(self.vocab, token, buf, 64, 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
            cached = self._pieces[token] = buf.raw[:n]
        return cached

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None,
                            extra: dict | None = None, client: bool = True) -> template.ChatPrompt:
        """Render messages (and tools) for the model, ending at the assistant's turn, with the chat
        template chosen at load (`self.chat`: the configured one, the GGUF's own, or the built-in one
        of the model's family: homeai.engine.template). The prompt is in parts by who wrote them,
        for `tokenize` (special tokens added), so it holds one BOS, not two. `extra`: further
        variables for the template (`enable_thinking`, ...); `client`: whether the tools and leading
        system messages are the client's (`template.Source.CLIENT`). Raises ChatRenderError for
        messages the template refuses."""
        return self.chat.template.prompt(messages, tools, control_texts=self.control_texts, extra=extra,
                                         tokenizer_adds_bos=bool(ll.llama_vocab_get_add_bos(self.vocab)),
                                         client=client)

    # ---- one step --------------------------------------------------------------

    def run(self, plan: StepPlan) -> StepResult:
        return self.collect(plan, self.launch(plan))

    def launch(self, plan: StepPlan) -> StepResult:
        """A step up to its decodes' return: its cache operations, then a `llama_decode` per pool.
        On a GPU llama.cpp returns before it has computed (the logits are read in `collect`), so
        the caller may work meanwhile; on a CPU it has computed. The result so far says whether
        llama.cpp found no KV slot (then nothing of the step was kept)."""
        self._launched = time.perf_counter()
        self._follow_cores()
        for pool, ops in plan.cache_ops.items():
            memory = self._memory(pool)
            if not memory:  # an encoder without a KV cache keeps nothing to drop
                continue
            for op in ops:
                if isinstance(op, Copy):
                    ll.llama_memory_seq_cp(memory, op.src, op.dst, 0, op.length)
                elif not ll.llama_memory_seq_rm(memory, op.seq_id, op.start, -1):
                    self._refused_cut(plan, pool, op)
        for request_id in plan.done:
            self._free_sampler(request_id)
            self._pooled.pop(request_id, None)
        result = StepResult()
        self._decoded = self._decode(plan, result)
        return result

    def _refused_cut(self, plan: StepPlan, pool: Pool, op: Drop) -> None:
        """llama.cpp cannot cut a sequence there (a recurrent state): none of it is kept, so no later
        step reads a state past the cut. A sequence this step computes on cannot go on: the step fails
        (its requests end with an error) rather than compute on a cache it refused."""
        ll.llama_memory_seq_rm(self._memory(pool), op.seq_id, -1, -1)  # a whole sequence always goes
        if any(item.seq_id == op.seq_id for item in plan.batches[pool]):
            raise RunnerError(f"llama.cpp could not cut sequence {op.seq_id} at position {op.start}")
        log.warning("llama.cpp could not cut sequence %d at position %d: dropped whole", op.seq_id, op.start)

    def held(self, pool: Pool, seq_id: int) -> tuple[int, int]:
        """The positions [first, end) llama.cpp's cache `pool` holds of a sequence; (0, 0): none."""
        memory = self._memory(pool)
        first = ll.llama_memory_seq_pos_min(memory, seq_id)
        return (first, ll.llama_memory_seq_pos_max(memory, seq_id) + 1) if first >= 0 else (0, 0)

    def collect(self, plan: StepPlan, result: StepResult) -> StepResult:
        """The rest of a launched step: its rows sampled (waiting for llama.cpp to finish computing),
        its embedding inputs run; the step's time from its launch."""
        if self._grammar_spent:
            self._grammar_spent.clear()
        if not result.no_kv_slot:
            for pool, group, rows, num_outputs in self._decoded:
                if not num_outputs:
                    continue
                ctx = self._context(pool)
                outputs = self._outputs(ctx, num_outputs)
                best = outputs.argmax(axis=1).tolist()  # every row's greedy pick, in one pass
                out = 0
                for item, row in zip(group, rows):
                    if item.sample:
                        try:
                            sample = self._sample(ctx, item, row, outputs, out, best[out])
                        except GrammarOverBudget as e:  # that request ends with an error, the step goes on
                            log.warning("request %s: %s", item.request_id, e)
                            result.errors[item.request_id] = str(e)
                            sample = new_tuple(Sample, (0, True) + SAMPLE_REST)
                        result.samples[item.request_id] = sample
                        out += 1
            if plan.batches[Pool.EMBED]:
                self._embed(plan.batches[Pool.EMBED], result)
        self._decoded = []
        result.elapsed_ms = (time.perf_counter() - self._launched) * 1000.0
        return result

    def _follow_cores(self) -> None:
        """Every context takes the thread count the core watch gives for this step (n_threads 0)."""
        threads = self.core_watch.threads() if self.core_watch else self.num_threads
        if threads != self.num_threads:
            for ctx in (self.ctx, self.ictx, self.embed_ctx):
                if ctx:
                    ll.llama_set_n_threads(ctx, threads, threads)
            self.num_threads = threads

    def _context(self, pool: Pool):
        return self._contexts[pool]

    def _memory(self, pool: Pool):
        return self._memories[pool]

    def _decode(self, plan: StepPlan, result: StepResult) -> list:
        """Each generating pool's `llama_decode`; returns what was decoded, (pool, items, rows) each."""
        decoded = []
        for pool in GENERATE:
            group = plan.batches[pool]
            if not group:
                continue
            ctx = self._context(pool)
            rows = self.batch.fill([(i.seq_id, i.start, i.tokens, i.sample) for i in group])
            rc = ll.llama_decode(ctx, self.batch.c)
            if rc != 0:
                for done_pool, done, _, _ in decoded:  # undo the contexts already decoded: the step keeps nothing
                    for i in done:
                        if not ll.llama_memory_seq_rm(self._memory(done_pool), i.seq_id, i.start, -1):
                            raise RunnerError(f"llama.cpp could not undo sequence {i.seq_id}'s step")
            if rc == 1:  # no KV slot: llama.cpp restored the cache; the scheduler shrinks or preempts
                result.no_kv_slot = True
                return []
            if rc != 0:
                raise RunnerError(f"llama_decode failed with code {rc}")
            decoded.append((pool, group, rows, self.batch.num_outputs))
        return decoded

    def _sample(self, ctx, item: ScheduledItem, row: int, outputs: np.ndarray, out: int, best: int) -> Sample:
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

    def _outputs(self, ctx, n: int) -> np.ndarray:
        """The logits of the context's last decode, in place: its `n` output rows (the batch's tokens
        flagged for logits), in batch order, one read for them all (a row at a time costs ~2.5 us more a row)."""
        address = ctypes.addressof(ll.llama_get_logits(ctx).contents)
        flat = np.frombuffer((ctypes.c_float * (n * self.n_vocab)).from_address(address), dtype=np.float32)
        return flat.reshape(n, self.n_vocab)

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
                cur = self._weigh(logits, grammar, _allowed_needed(params), start, budget)
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

    def check_grammar(self, grammar: Grammar, timeout_s: float, member: str = "") -> str | None:
        """Why llama.cpp cannot take `grammar` within `timeout_s` (None: it can), tried in a grammar
        checker's process (`homeai.engine.grammar_check`), never first in this one; `member`'s
        checks take their turn with the others' (GrammarBusy: `member` has too many waiting)."""
        with _checker_lock:
            if self.grammar_checker is None:
                limits = self.grammar_limits
                self.grammar_checker = GrammarChecker(self.info.path, max_token_ms=limits.max_token_ms,
                                                      max_pending=limits.max_pending_checks_per_member)
        return self.grammar_checker.check(grammar.text, grammar.root, timeout_s, member)

    def grammar_ok(self, grammar: Grammar) -> bool:
        """Whether llama.cpp parses `grammar`: checked when a request is submitted, since a grammar
        that fails in the middle of a step would fail the step's other requests too. It is tried
        in the checker's process first (its answer is kept: the routes asked it already)."""
        if self.check_grammar(grammar, self.grammar_limits.build_timeout_s) is not None:
            return False
        sampler = grammar_sampler(self.vocab, grammar)  # its trigger patterns too
        if not sampler:
            return False
        ll.llama_sampler_free(sampler)
        return True

    def _free_sampler(self, request_id: str) -> None:
        sampling = self.samplers.pop(request_id, None)
        for sampler in (sampling.chain, sampling.grammar) if sampling is not None else ():
            if sampler is not None:
                ll.llama_sampler_free(sampler)

    def _embed(self, items: list[ScheduledItem], result: StepResult) -> None:
        """Mean-pool each input's chunk; an input spread over several steps keeps its cells in the
        embedding context (so later chunks attend to earlier ones) and its token-weighted sum here."""
        self.embed_batch.fill([(item.seq_id, item.start, item.tokens, True) for item in items])
        self.embed_batch.logits[: self.embed_batch.c.n_tokens] = 1
        rc = ll.llama_decode(self.embed_ctx, self.embed_batch.c)
        if rc != 0:
            raise RunnerError(f"embedding llama_decode failed with code {rc}")
        n_embd = ll.llama_model_n_embd(self.embed_model)
        for item in items:
            ptr = ll.llama_get_embeddings_seq(self.embed_ctx, item.seq_id)
            total = np.ctypeslib.as_array(ptr, shape=(n_embd,)).astype(np.float64) * len(item.tokens)
            if item.request_id in self._pooled:
                total += self._pooled.pop(item.request_id)
            if not item.sample:  # more chunks to come
                self._pooled[item.request_id] = total
                continue
            vec = (total / (item.start + len(item.tokens))).astype(np.float32)
            norm = float(np.linalg.norm(vec))
            result.embeddings[item.request_id] = vec / norm if norm > 0 else vec

    def decode_greedy(self, groups: list[tuple[Pool, list[tuple[int, int, list[int]]]]]) -> list[list[int]]:
        """Bare decodes: each group's rows (seq_id, start position, tokens) in its pool's context, one
        `llama_decode` a group, back to back over the one batch, then each row's greedy next token
        (every context decodes before any samples, as in `run`; picked as `run` picks greedy, every row
        from one read of the context's output rows). No plan,
        no sampler chain, nothing kept but the cells: the raw loops of `homeai.bench.raw_loop` are built on it."""
        decoded = []
        for pool, rows in groups:
            ctx = self._context(pool)
            last = self.batch.fill([(seq_id, start, tokens, True) for seq_id, start, tokens in rows])
            rc = ll.llama_decode(ctx, self.batch.c)
            if rc != 0:
                raise RunnerError(f"llama_decode failed with code {rc}")
            decoded.append((ctx, len(last)))
        return [self._outputs(ctx, n).argmax(axis=1).tolist() for ctx, n in decoded]

    def reset(self) -> None:
        """Forget every sequence and sampler (a new engine starts from an empty cache)."""
        for request_id in list(self.samplers):
            self._free_sampler(request_id)
        self._pooled.clear()
        ll.llama_memory_clear(self.memory, True)
        if self.imemory:
            ll.llama_memory_clear(self.imemory, True)
        if self.embed_memory:
            ll.llama_memory_clear(self.embed_memory, True)

    def close(self) -> None:
        if self.grammar_checker is not None:
            self.grammar_checker.stop()
        for request_id in list(self.samplers):
            self._free_sampler(request_id)
        ll.llama_free(self.embed_ctx)
        if self.ictx:
            ll.llama_free(self.ictx)
        ll.llama_free(self.ctx)
        if self.embed_model is not self.model:
            ll.llama_model_free(self.embed_model)
        ll.llama_model_free(self.model)


WEIGHED_FIRST = 256  # tokens weighed against a grammar before the whole vocabulary is
CHUNK = 4096  # the most tokens weighed between two readings of the clock (~1/12 of SmolLM2's vocabulary)


def _allowed_needed(params: SamplingParams) -> int:
    """How many of the best-scored tokens must be allowed for the chain's pick among them to be its
    pick among all the allowed ones (0: no number will do, weigh the whole vocabulary)."""
    if params.repeat_penalty != 1.0:
        return 0  # penalties reorder the scores
    if params.temperature <= 0:
        return 1
    return params.top_k if 0 < params.top_k <= WEIGHED_FIRST else 0


def build_sampler(params: SamplingParams, n_vocab: int):
    """One request's sampler chain: penalties, then greedy or top-k/top-p/min-p/temperature/dist. Its
    grammar, if any, is not in the chain but beside it (`Runner._sample_in_grammar`)."""
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


def json_schema_grammar(schema: dict, rule: str = "root") -> str:
    """GBNF rules for JSON that matches `schema`, its top rule named `rule`, by llama-cpp-python's
    converter (pure Python, but importing it loads llama.cpp, hence here). Local `$ref`s resolve;
    remote ones are refused. Keywords the converter does not know are either refused (`not`) or
    ignored (`format`): the caller validates the output against the schema as well."""
    converter = _JsonConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    try:
        top = converter.visit(converter.resolve_refs(copy.deepcopy(schema), "request"),
                              "" if rule == "root" else rule)
    except Exception as e:  # the converter asserts on what it cannot handle (its message may hold the schema)
        raise GrammarError(f"this JSON schema cannot be turned into a grammar: {str(e)[:160]}") from None
    text = strict_strings(converter.format_grammar())
    return text if top == rule else f"{text}\n{rule} ::= {top}\n"


class _JsonConverter(SchemaConverter):
    """llama-cpp-python's converter, its literals written as JSON text holds them. Its own left a
    backslash as it was (a const `a"b` made a broken grammar, `a\\b` the wrong value, `a\\nb` a raw
    newline) and put a pattern's literal text raw inside the string (`^say "hi"$`: a raw quote)."""

    _in_pattern = False

    def _format_literal(self, literal: str) -> str:  # JSON text: a const, an enum value, a property name
        return _gbnf_literal(_readable_json(literal))

    def _visit_pattern(self, pattern, name):
        self._in_pattern = True
        try:
            return super()._visit_pattern(pattern, name)
        finally:
            self._in_pattern = False

    def _add_rule(self, name, rule):
        return super()._add_rule(name, _pattern_as_json(rule) if self._in_pattern else rule)


def _readable_json(text: str) -> str:
    """JSON text with its letters beyond ASCII as themselves (`ü`, not `\\u00fc`: what a model writes)."""
    try:
        readable = json.dumps(json.loads(text), ensure_ascii=False)
        readable.encode("utf-8")  # a lone surrogate stays escaped
        return readable
    except (ValueError, UnicodeEncodeError):
        return text


def _gbnf_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


STRING_OPEN, STRING_CLOSE = '"\\"" ', ' "\\"" space'  # around the converter's rule for a pattern


def _pattern_as_json(rule: str) -> str:
    """A rule the converter wrote for a pattern (or a part of one) with each literal as JSON writes
    that text inside a string: `"` as `\\"`, `\\` as `\\\\`, a newline as `\\n`. A literal llama.cpp
    would not parse (`\\d`) is left for it to refuse."""
    if rule.startswith(STRING_OPEN) and rule.endswith(STRING_CLOSE) and len(rule) >= len(STRING_OPEN + STRING_CLOSE):
        return STRING_OPEN + _pattern_as_json(rule[len(STRING_OPEN):-len(STRING_CLOSE)]) + STRING_CLOSE
    out, i = [], 0
    while i < len(rule):
        end = _literal_end(rule, i, '"' if rule[i] == '"' else "]") if rule[i] in '"[' else i + 1
        text = _gbnf_text(rule[i + 1:end - 1]) if rule[i] == '"' else None
        out.append(rule[i:end] if text is None else _gbnf_literal(_readable_json(json.dumps(text))[1:-1]))
        i = end
    return "".join(out)


def _gbnf_text(body: str) -> str | None:
    """The text a GBNF literal's body stands for; None when llama.cpp would not parse it."""
    chars, i = [], 0
    try:
        while i < len(body):
            code, i = _gbnf_char(body, i)
            chars.append(chr(code))
    except (IndexError, KeyError, ValueError):
        return None
    return "".join(chars)


NOT_IN_JSON_STRINGS = '"\\\\\\x00-\\x1F\\x7F'  # GBNF: a quote, a backslash and the control characters


def strict_strings(gbnf: str) -> str:
    """The converter's GBNF with every negated character class (`char ::= [^"\\]`, a pattern's
    `.` and `[^...]`) also refusing raw control characters, quotes and backslashes, as JSON strings
    must (llama.cpp's own converter writes `[^"\\\x7F\x00-\x1F]`): else a reply could hold a raw
    newline or tab inside a string, which strict `json.loads` refuses. A pattern's own class
    (`[ -~]`) loses them too (`_json_class`)."""
    out, i, n = [], 0, len(gbnf)
    while i < n:
        c = gbnf[i]
        if c == '"':  # a literal: kept as it is
            end = _literal_end(gbnf, i, '"')
            out.append(gbnf[i:end])
            i = end
        elif c == "[":
            end = _literal_end(gbnf, i, "]")
            negated = gbnf.startswith("[^", i)
            out.append(f"[^{NOT_IN_JSON_STRINGS}{gbnf[i + 2:end]}" if negated else _json_class(gbnf[i:end]))
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


NOT_IN_JSON = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F))
ESCAPED = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}  # llama.cpp's parse_char


def _json_class(cls: str) -> str:
    """A GBNF class `[...]` without what cannot stand raw in a JSON string (as it is, when it holds
    none of that or llama.cpp would not parse it anyway)."""
    ranges = _class_ranges(cls[1:-1])
    if ranges is None or not any(lo <= b and a <= hi for lo, hi in ranges for a, b in NOT_IN_JSON):
        return cls
    for a, b in NOT_IN_JSON:
        ranges = [part for lo, hi in ranges for part in ((lo, min(hi, a - 1)), (max(lo, b + 1), hi)) if part[0] <= part[1]]
    if not ranges:
        return "[^\\x00-\\U0010FFFF]"  # nothing: the pattern asked only for characters JSON escapes
    return "[" + "".join(_escape_code(lo) + ("" if lo == hi else "-" + _escape_code(hi)) for lo, hi in ranges) + "]"


def _class_ranges(body: str) -> list[tuple[int, int]] | None:
    """The code point ranges of a GBNF class's body; None when it does not parse."""
    ranges, i = [], 0
    try:
        while i < len(body):
            lo, i = _gbnf_char(body, i)
            hi = lo
            if i + 1 < len(body) and body[i] == "-":
                hi, i = _gbnf_char(body, i + 1)
            ranges.append((lo, hi))
    except (IndexError, KeyError, ValueError):
        return None
    return ranges


def _gbnf_char(body: str, i: int) -> tuple[int, int]:
    """The code point of the (perhaps escaped) character at `i` of a GBNF literal or class, and where
    the next begins, as llama.cpp's parse_char reads it."""
    if body[i] != "\\":
        return ord(body[i]), i + 1
    kind = body[i + 1]
    digits = {"x": 2, "u": 4, "U": 8}.get(kind)
    if digits:
        if len(body[i + 2:i + 2 + digits]) != digits:
            raise ValueError("short escape")
        return int(body[i + 2:i + 2 + digits], 16), i + 2 + digits
    return ESCAPED[kind], i + 2


def _escape_code(code: int) -> str:
    return f"\\x{code:02X}" if code < 0x100 else f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"


def _literal_end(text: str, start: int, close: str) -> int:
    i = start + 1
    while i < len(text) and text[i] != close:
        i += 2 if text[i] == "\\" else 1
    return i + 1


_checker_lock = threading.Lock()
CHECK_STACK_BYTES = 1 << 20  # the checker builds grammars on a stack smaller than any of the daemon's threads'


def grammar_worker(model_path: str, conn) -> None:
    """The grammar checker's process (`homeai.engine.grammar_check`): the model's vocabulary only;
    for each (text, root, walks, walk_tokens, budget_s, max_token_ms) received, why llama.cpp cannot
    take the grammar ("": it can). llama.cpp's messages (a refused grammar's whole text among them)
    go to a scratch file, of which the first line is the reason."""
    scratch = tempfile.TemporaryFile()
    os.dup2(scratch.fileno(), 2)
    _init_backend()
    params = ll.llama_model_default_params()
    params.vocab_only = True
    model = ll.llama_model_load_from_file(model_path.encode(), params)
    vocab = ll.llama_model_get_vocab(model)
    walker = _Walker(vocab)
    conn.send("ready")

    def serve() -> None:
        while True:
            try:
                text, root, walks, walk_tokens, budget_s, max_token_ms = conn.recv()
            except EOFError:
                return
            scratch.seek(0)
            scratch.truncate()
            why = _try_grammar(walker, text, root, walks, walk_tokens, budget_s, max_token_ms)
            conn.send(_first_line(scratch) if why == "" else why or "")

    threading.stack_size(CHECK_STACK_BYTES)
    thread = threading.Thread(target=serve, name="grammar-check")
    thread.start()
    thread.join()


RETRIES = 2  # a weighing a little past the limit is repeated (one slowed by a cache or page miss: 66 ms, then 22)


class _Walker:
    """What the checker walks a grammar with: the vocabulary's candidates, each token's length, which
    hold a quote (in a string: its end), which a bracket (elsewhere: an array's or object's end),
    and which end generation."""

    def __init__(self, vocab):
        n = ll.llama_vocab_n_tokens(vocab)
        self.vocab, self.candidates = vocab, _Candidates(n)
        texts = [_token_text(vocab, t) for t in range(n)]
        self.length = np.array([len(t) for t in texts], dtype=np.int32)
        self.quote = np.array(['"' in t for t in texts])
        self.bracket = np.array([("]" in t or "}" in t) and '"' not in t for t in texts])
        self.eog = np.array([bool(ll.llama_vocab_is_eog(vocab, t)) for t in range(n)])
        self.logits = np.random.default_rng(0).random(n, dtype=np.float32)

    def weigh(self, sampler) -> tuple[np.ndarray, float]:
        """The tokens the grammar allows, from a pass over the whole vocabulary in the engine's chunks
        (a part cannot tell the whole's cost: it lies in a few paths through the tokens' characters,
        not in their number; and with many stacks each chunk costs nearly a whole pass), and the
        pass's CPU time in ms (its thread's own: the box's other work does not count)."""
        ids = self.candidates.ids
        began = time.thread_time()
        ok = np.concatenate([self.candidates.weigh(sampler, ids[i:i + CHUNK], self.logits)
                             for i in range(0, len(ids), CHUNK)])
        return ids[ok], (time.thread_time() - began) * 1000.0

    def choose(self, allowed: np.ndarray, rng) -> int:
        """A token that moves the walk on: one that ends a string, or else an array or object (free
        text is walked through, not into), the longest (a literal's rest), or any."""
        roll = rng.random()
        for kind, below in ((self.quote, 0.5), (self.bracket, 0.7)):
            closing = allowed[kind[allowed]]
            if roll < below and len(closing):
                return int(closing[rng.integers(len(closing))])
        if roll < 0.85:
            lengths = self.length[allowed]
            longest = allowed[lengths >= lengths.max()]
            return int(longest[rng.integers(len(longest))])
        return int(allowed[rng.integers(len(allowed))])


def _try_grammar(walker: _Walker, text: str, root: str, walks: int, walk_tokens: int, budget_s: float,
                 max_token_ms: float) -> str | None:
    """Build the grammar and walk it `walks` times, each up to `walk_tokens` tokens or its end, for at
    most half of `budget_s` in all, each token weighed against the whole vocabulary (timed) and one
    chosen to move on (`_Walker.choose`). Why not (a token's weighing or taking past `max_token_ms`,
    the build past `budget_s`); None when it went, "" when llama.cpp refused it."""
    start = time.perf_counter()
    sampler = ll.llama_sampler_init_grammar(walker.vocab, text.encode("utf-8"), root.encode("utf-8"))
    if not sampler:
        return ""
    rng = np.random.default_rng(len(text))
    try:
        for walk in range(walks):
            if walk:  # each walk from the start
                ll.llama_sampler_reset(sampler)
            for _ in range(walk_tokens):
                if time.perf_counter() - start > budget_s / 2:
                    break  # walked as far as the time allows
                allowed, ms = walker.weigh(sampler)
                for _ in range(RETRIES if max_token_ms < ms < 4 * max_token_ms else 0):  # the least counts
                    ms = min(ms, walker.weigh(sampler)[1])
                if ms > max_token_ms:
                    return (f"llama.cpp took {ms:.0f} ms to weigh one token of it against the vocabulary "
                            f"(at most {max_token_ms:g} ms: [grammar] max_token_ms)")
                moving = allowed[~walker.eog[allowed]]
                if not len(moving):
                    break  # its end (or a place no token can write)
                before = time.thread_time()
                ll.llama_sampler_accept(sampler, walker.choose(moving, rng))
                ms = (time.thread_time() - before) * 1000.0
                if ms > max_token_ms:
                    return f"llama.cpp took {ms:.0f} ms to take one token of it (at most {max_token_ms:g} ms)"
    finally:
        ll.llama_sampler_free(sampler)
    took = time.perf_counter() - start
    if took > budget_s:
        return f"llama.cpp took {took:.1f} s to build it and weigh its tokens (at most {budget_s:g} s)"
    return None


def _first_line(scratch) -> str:
    """llama.cpp's reason for refusing a grammar: the first line it wrote, cut short."""
    scratch.seek(0)
    line = scratch.read(4096).decode("utf-8", "replace").strip().split("\n", 1)[0]
    return "llama.cpp refused its grammar: " + (line.split("error parsing grammar: ", 1)[-1][:200] or "no reason given")


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


if __name__ == "__main__":  # the grammar checker's process (`grammar_check`): python -m homeai.engine.runner MODEL FD
    import sys
    from multiprocessing.connection import Connection

    grammar_worker(sys.argv[1], Connection(int(sys.argv[2])))
