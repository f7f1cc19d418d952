"""A GGUF file's header: its key/value pairs (architecture, size label, file type, context length, ...).

A small reader that skips arrays (the tokenizer's vocabulary runs to megabytes) and stops before
the tensors, so listing models and describing them (`homeai models`, Ollama's `/api/tags`,
`/api/show`, `homeai doctor`'s memory estimate) needs no llama.cpp. Each file is read once per
(path, size, mtime).
"""

from __future__ import annotations

import functools
import struct
from pathlib import Path
from typing import BinaryIO

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
# llama.cpp's file types (`general.file_type`), as Ollama names the quantization level.
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
              12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
              19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
              26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
              36: "TQ1_0", 37: "TQ2_0"}


def metadata(path: str | Path) -> dict:
    """The header's scalar and string values; {} for a file that is not GGUF."""
    try:
        stat = Path(path).stat()
        return _read_metadata(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
    except (struct.error, KeyError, OSError):  # a truncated header, or a value type this reader does not know
        return {}


def quantization(meta: dict) -> str:
    return FILE_TYPES.get(meta.get("general.file_type"), "")


def context_length(meta: dict) -> int | None:
    """The context the model was trained for (`<arch>.context_length`)."""
    return meta.get(f"{meta.get('general.architecture', '')}.context_length")


def kv_bytes_per_cell(meta: dict) -> int | None:
    """Bytes one KV cell takes over all layers at llama.cpp's default f16 cache, from the header's
    shape (layers, KV heads, head sizes); None when the header does not say (per-layer head counts
    are arrays, which this reader skips)."""
    arch = meta.get("general.architecture", "")
    get = lambda key: meta.get(f"{arch}.{key}")  # noqa: E731
    layers, heads, kv_heads, width = (get("block_count"), get("attention.head_count"),
                                      get("attention.head_count_kv") or get("attention.head_count"),
                                      get("embedding_length"))
    if not (layers and heads and kv_heads and width):
        return None
    key_size = get("attention.key_length") or width // heads
    value_size = get("attention.value_length") or width // heads
    return 2 * layers * kv_heads * (key_size + value_size)


@functools.lru_cache(maxsize=32)
def _read_metadata(path: str, _size: int, _mtime_ns: int) -> dict:
    with open(path, "rb") as f:
        magic, version = struct.unpack("<4sI", f.read(8))
        if magic != b"GGUF" or version < 2:
            return {}
        _num_tensors, num_kv = struct.unpack("<QQ", f.read(16))
        meta = {}
        for _ in range(num_kv):
            key = _string(f)
            value = _value(f, _unpack(f, "<I"))
            if value is not None:
                meta[key] = value
        return meta


def _value(f: BinaryIO, kind: int):
    if kind == STRING:
        return _string(f)
    if kind == ARRAY:
        _skip_array(f)
        return None
    return _unpack(f, SCALARS[kind])


def _skip_array(f: BinaryIO) -> None:
    kind, count = struct.unpack("<IQ", f.read(12))
    if kind in SCALARS:
        f.seek(count * struct.calcsize(SCALARS[kind]), 1)
        return
    for _ in range(count):  # strings, or arrays of arrays
        _value(f, kind)


def _string(f: BinaryIO) -> str:
    return f.read(_unpack(f, "<Q")).decode("utf-8", errors="replace")


def _unpack(f: BinaryIO, fmt: str):
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]
