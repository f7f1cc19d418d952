"""The served GGUF files as Ollama describes its models: `/api/tags`, `/api/show`, `/api/ps` entries.

Ollama reports a model's facts from its GGUF header (architecture, size label, file type,
context length, ...); so does this module, with a small reader of the header's key/value
pairs that skips arrays (the tokenizer's vocabulary runs to megabytes) and stops before the
tensors. It reads each file once per (path, size, mtime).

The digest is the SHA-256 of the file's resolved path, size and modification time, not of
its bytes: hashing a 5 GB model takes a CPU core tens of seconds, and Home Assistant asks for
`/api/tags` every 30 s from the moment the server starts. Clients only compare digests, and
this one changes whenever the file is replaced.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO

from homeai.sched.request import SamplingParams

TAG = "latest"  # Ollama names are name:tag; the served model is listed as `<id>:latest`
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
# llama.cpp's file types (`general.file_type`), as Ollama names the quantization level.
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
              12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
              19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
              26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
              36: "TQ1_0", 37: "TQ2_0"}


def ollama_name(model_id: str) -> str:
    return f"{model_id}:{TAG}"


# Every served model takes tools: in its template's own call format, or in the generic one
# (described in the system prompt, held to the schemas by a grammar) when its template has none.
TOOL_CALLING = True


def capabilities(purposes: set[str]) -> list[str]:
    """What `/api/show` says a served model can do (Home Assistant offers tools only with "tools")."""
    out = []
    if "generate" in purposes:
        out += ["completion", "tools"] if TOOL_CALLING else ["completion"]
    if "embed" in purposes:
        out.append("embedding")
    return out


def served(runtime, name: str) -> tuple[object, set[str]] | None:
    """The served card `name` names (`<id>`, `<id>:latest`, the file's name, or an alias) and its purposes."""
    bare = name.removesuffix(f":{TAG}")
    found = None
    purposes = set()
    for purpose in ("generate", "embed"):
        if runtime.resolve_model(bare, purpose) is not None:
            found = found or runtime.models[purpose]
            if runtime.models[purpose] == found:
                purposes.add(purpose)
    return (found, purposes) if found is not None else None


def not_found(name: str) -> str:
    return f'model "{name}" not found, try pulling it first'


def tag_entry(card) -> dict:
    """One `/api/tags` model."""
    stat = Path(card.path).stat()
    return {"name": ollama_name(card.id), "model": ollama_name(card.id), "modified_at": _rfc3339(stat.st_mtime),
            "size": stat.st_size, "digest": digest(card.path), "details": details(card.path)}


def ps_entry(card, *, context_length: int, on_gpu: bool) -> dict:
    """One `/api/ps` model: always loaded, never unloaded (no expiry of its own)."""
    entry = tag_entry(card)
    entry.pop("modified_at")
    return {**entry, "expires_at": "9999-12-31T23:59:59Z", "size_vram": entry["size"] if on_gpu else 0,
            "context_length": context_length}


def show(card, *, capabilities: list[str], context_length: int, full_path: bool = False) -> dict:
    """`/api/show`: details, the header's facts, the chat template, the default parameters. The
    modelfile names the file; its folders (a home directory, a user name) only with `full_path`."""
    meta = metadata(card.path)
    model_info = {k: v for k, v in meta.items() if k != "tokenizer.chat_template"}
    d = SamplingParams()
    parameters = "\n".join(f"{name:<15}{value}" for name, value in (
        ("temperature", d.temperature), ("top_k", d.top_k), ("top_p", d.top_p), ("min_p", d.min_p),
        ("repeat_penalty", d.repeat_penalty), ("num_ctx", context_length)))
    source = card.path if full_path else Path(card.path).name
    return {"license": meta.get("general.license", ""), "modelfile": f"FROM {source}\n",
            "parameters": parameters, "template": meta.get("tokenizer.chat_template", ""),
            "details": details(card.path), "model_info": model_info, "capabilities": capabilities,
            "modified_at": _rfc3339(Path(card.path).stat().st_mtime)}


def details(path: str) -> dict:
    meta = metadata(path)
    family = meta.get("general.architecture", "")
    return {"parent_model": "", "format": "gguf", "family": family, "families": [family] if family else None,
            "parameter_size": meta.get("general.size_label", ""),
            "quantization_level": FILE_TYPES.get(meta.get("general.file_type"), "")}


def digest(path: str) -> str:
    p = Path(path).resolve()
    stat = p.stat()
    return hashlib.sha256(f"{p}\n{stat.st_size}\n{stat.st_mtime_ns}".encode()).hexdigest()


def metadata(path: str) -> dict:
    """The GGUF header's scalar and string values; {} for a file that is not GGUF."""
    stat = Path(path).stat()
    try:
        return _read_metadata(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
    except (struct.error, KeyError, OSError):  # a truncated header, or a value type this reader does not know
        return {}


@functools.lru_cache(maxsize=8)
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


def _rfc3339(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat().replace("+00:00", "Z")
