"""The model as llama.cpp loads it: the backend, the weights and their contexts, the model's facts
(`ModelInfo`, GGUF metadata, which chat template it is served with) and its vocabulary (text to
tokens, a token's text, the control tokens that open a turn or that a reply keeps as markup).

Loading decides what llama.cpp is told once: layers offloaded (`homeai.engine.gpu`), flash
attention, and each context's cells, batch, sequence ids and threads.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as ll

from homeai.config import ModelConfig
from homeai.engine import gpu, kvsize, markup, template


class RunnerError(RuntimeError):
    """llama.cpp failed in a way the scheduler cannot work around (not a full KV cache)."""


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
    mmproj_path: str = ""  # the vision projector read beside the model ("": images are not understood)


_LOG_KEEP = {ll.GGML_LOG_LEVEL_ERROR} if hasattr(ll, "GGML_LOG_LEVEL_ERROR") else {4}


@ll.llama_log_callback
def _quiet_log(level, text, user_data):  # llama.cpp logs every tensor at load; keep errors
    if level in _LOG_KEEP:
        os.write(2, text)


_backend_ready = False


def init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        ll.llama_log_set(_quiet_log, ctypes.c_void_p(0))
        ll.llama_backend_init()
        _backend_ready = True


def backend_facts() -> dict:
    """What this llama.cpp build can do, for `homeai doctor`."""
    init_backend()
    info = ll.llama_print_system_info().decode(errors="replace")
    names = ["CPU"] + [n for n in ("CUDA", "Metal", "Vulkan", "ROCm", "HIP", "SYCL") if n.upper() in info.upper()]
    return {"backends": names, "gpu_offload": bool(ll.llama_supports_gpu_offload()), "system_info": info.strip()}


def chat_template_source(model, vocab, configured: str = "") -> dict:
    """What `template.choose` decides from: the GGUF's `tokenizer.chat_template` (None when it has
    none), its BOS and EOS token text, its architecture (`general.architecture`), the vocabulary's
    control-token texts, and the configured `model.chat_template`."""
    source = ll.llama_model_chat_template(model, None)
    return {"source": source.decode("utf-8", errors="replace") if source else None,
            "bos_token": token_text(vocab, ll.llama_vocab_bos(vocab)),
            "eos_token": token_text(vocab, ll.llama_vocab_eos(vocab)),
            "architecture": meta_value(model, "general.architecture"),
            "control_texts": _control_texts(vocab), "configured": configured}


def token_text(vocab, token: int) -> str:
    if token < 0:  # the model has no such token
        return ""
    buf = ctypes.create_string_buffer(256)
    n = ll.llama_token_to_piece(vocab, token, buf, 256, 0, True)
    return buf.raw[:max(n, 0)].decode("utf-8", errors="replace")


def tokenize_text(vocab, text: str, add_special: bool, parse_special: bool) -> list[int]:
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


def reply_markup(vocab) -> frozenset[int]:
    """The control tokens whose text a reply keeps (`markup.REPLY`: tool-call and thinking markers),
    so that the reply's parsers see them; every other control token renders as nothing."""
    wanted = ll.LLAMA_TOKEN_ATTR_CONTROL | ll.LLAMA_TOKEN_ATTR_USER_DEFINED
    out = set()
    for token in range(ll.llama_vocab_n_tokens(vocab)):
        if ll.llama_vocab_get_attr(vocab, token) & wanted and not ll.llama_vocab_is_eog(vocab, token):
            if (ll.llama_vocab_get_text(vocab, token) or b"").decode("utf-8", errors="replace") in markup.REPLY:
                out.add(token)
    return frozenset(out)


def control_tokens(vocab, texts: frozenset[str]) -> frozenset[int]:
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
    init_backend()
    params = ll.llama_model_default_params()
    params.vocab_only = True
    model = ll.llama_model_load_from_file(str(model_path).encode(), params)
    if not model:
        raise RunnerError(f"llama.cpp could not read the model {model_path}")
    try:
        return template.choose(**chat_template_source(model, ll.llama_model_get_vocab(model), configured))
    finally:
        ll.llama_model_free(model)


def meta_value(model, key: str) -> str | None:
    """A GGUF metadata value as text (None when the model has no such key)."""
    buf = ctypes.create_string_buffer(128)
    n = ll.llama_model_meta_val_str(model, key.encode(), buf, 128)
    return buf.value.decode(errors="replace") if n >= 0 else None


def load_model(path: Path, cfg: ModelConfig):
    params = ll.llama_model_default_params()
    params.n_gpu_layers = gpu.offloaded_layers(cfg, bool(ll.llama_supports_gpu_offload()))
    params.use_extra_bufts = cfg.use_extra_bufts
    model = ll.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise RunnerError(f"llama.cpp could not load the model {path}")
    return model


def flash_attn_type(cfg: ModelConfig) -> int:
    """llama.cpp's CPU flash attention is several times slower than plain attention once a sequence's
    own context is long (a 16-token chunk at position 2048: 510 ms against 112 ms on 2 cores), so
    `auto` turns it on only when layers are offloaded to a GPU."""
    if cfg.flash_attn == "on":
        return ll.LLAMA_FLASH_ATTN_TYPE_ENABLED
    if cfg.flash_attn == "off" or not gpu.offloaded_layers(cfg, bool(ll.llama_supports_gpu_offload())):
        return ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
    return ll.LLAMA_FLASH_ATTN_TYPE_AUTO


def new_context(model, *, n_ctx: int, n_batch: int, n_seq_max: int, n_threads: int, embeddings: bool,
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

