"""How many KV cells each generation cache gets, from the loaded model (or, for `homeai doctor`, its
GGUF header) and the memory free at load: the facts llama.cpp gives, handed to the pure sizing of
`homeai.engine.kvsize`. The memory free is the first GPU's when layers are offloaded (ggml's
device API), else RAM's.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import llama_cpp as ll

from homeai import gguf_header
from homeai.config import ModelConfig
from homeai.engine import gpu, kvsize
from homeai.llama.model import flash_attn_type, meta_value


def model_kv_sizes(model, cfg: ModelConfig) -> kvsize.Sizes:
    """The generation caches' cells: as configured, or from the loaded model within the memory budget."""
    arch = meta_value(model, "general.architecture")
    hparams = {"context_length": ll.llama_model_n_ctx_train(model), "block_count": ll.llama_model_n_layer(model),
               "embedding_length": ll.llama_model_n_embd(model), "attention.head_count": ll.llama_model_n_head(model),
               "attention.head_count_kv": ll.llama_model_n_head_kv(model)}
    for key in ("attention.key_length", "attention.value_length"):
        value = meta_value(model, f"{arch}.{key}")
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
                         flash_attn=flash_attn_type(cfg) != ll.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    return kvsize.plan(shape, n_ctx=cfg.n_ctx, interactive_n_ctx=cfg.interactive_n_ctx,
                       free_bytes=_free_bytes(offloaded), share=cfg.kv_memory_share)


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

