"""Models as Ollama describes them: `/api/tags`, `/api/show`, `/api/ps` entries, for the served GGUF
files and every local model (`homeai.catalog`).

Ollama reports a model's facts from its GGUF header (architecture, size label, file type,
context length, ...); so does this module, through `homeai.gguf_header`.

A pulled model's digest is its (first) file's sha256 as the hub gave it. Any other file's is the
SHA-256 of its resolved path, size and modification time, not of its bytes: hashing a 5 GB model
takes a CPU core tens of seconds, and Home Assistant asks for `/api/tags` every 30 s from the
moment the server starts. Clients only compare digests, and this one changes whenever the file
is replaced.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from homeai import catalog
from homeai.gguf_header import metadata, quantization
from homeai.engine.template import ChatTemplate, TemplateCompileError
from homeai.service import names, sampling, thinking

TAG = "latest"  # Ollama names are name:tag; the served model is listed as `<id>:latest`
EMBEDDING_ARCHITECTURES = ("bert", "nomic-bert", "jina-bert-v2", "t5encoder")  # GGUFs that only embed


@dataclass(frozen=True)
class Listed:
    """A model as the listing routes name it: its Ollama name, the file llama.cpp loads, its size, its digest."""
    name: str
    path: str
    size: int
    digest: str

    @classmethod
    def of_card(cls, card) -> "Listed":
        return cls(ollama_name(card.id), card.path, Path(card.path).stat().st_size, digest(card.path))

    @classmethod
    def of_local(cls, model: catalog.LocalModel) -> "Listed":
        pulled = model.files[0].digest.removeprefix("sha256:") if model.manifest is not None else ""
        return cls(ollama_name(model.name), str(model.path), model.size, pulled or digest(str(model.path)))


def is_projector(path: str) -> bool:
    """Whether a GGUF is a vision projector (`homeai pull --mmproj`), not a model."""
    return metadata(path).get("general.architecture") == "clip"


def ollama_name(model_id: str) -> str:
    """`<id>:latest`, or a local model's name as it is (it has its tag: `hf.co/<org>/<repo>:Q4_K_M`)."""
    return model_id if ":" in model_id else f"{model_id}:{TAG}"


# Every served model takes tools: in its template's own call format, or in the generic one
# (described in the system prompt, held to the schemas by a grammar) when its template has none.
TOOL_CALLING = True


def capabilities(purposes: set[str], *, thinks: bool = False, vision: bool = False) -> list[str]:
    """What `/api/show` says a served model can do (Home Assistant offers tools only with "tools";
    it and Open WebUI offer the thinking toggle only with "thinking"; Home Assistant's AI Task sends
    camera snapshots only to a model with "vision")."""
    out = []
    if "generate" in purposes:
        out += ["completion", "tools"] if TOOL_CALLING else ["completion"]
        out += ["thinking"] if thinks else []
        out += ["vision"] if vision else []
    if "embed" in purposes:
        out.append("embedding")
    return out


def served(service, name: str) -> tuple[object, set[str]] | None:
    """The served card `name` names (`<id>`, `<id>:latest`, `<id>:<lane>`, the file's name, an alias, or
    the served file's local name, `hf.co/<org>/<repo>:<tag>`) and its purposes."""
    bare = names.split(name.removesuffix(f":{TAG}"), service.cfg.lanes)[0]
    local = catalog.find(catalog.folder(service.cfg.data_dir), name)
    found = None
    purposes = set()
    for purpose in ("generate", "embed"):
        card = service.loaded_cards()[purpose]
        named = local is not None and Path(card.path).resolve() == local.path.resolve()
        if named or service.names_served(bare, purpose):
            found = found or card
            if card == found:
                purposes.add(purpose)
    return (found, purposes) if found is not None else None


def not_found(name: str) -> str:
    return f'model "{name}" not found, try pulling it first'


def tag_entry(model: Listed) -> dict:
    """One `/api/tags` model."""
    return {"name": model.name, "model": model.name, "modified_at": _rfc3339(Path(model.path).stat().st_mtime),
            "size": model.size, "digest": model.digest, "details": details(model.path)}


def ps_entry(card, *, context_length: int, on_gpu: bool) -> dict:
    """One `/api/ps` model: always loaded, never unloaded (no expiry of its own)."""
    entry = tag_entry(Listed.of_card(card))
    entry.pop("modified_at")
    return {**entry, "expires_at": "9999-12-31T23:59:59Z", "size_vram": entry["size"] if on_gpu else 0,
            "context_length": context_length}


def local_capabilities(path: str) -> list[str]:
    """What a local model that is not served could do, from its header: embed only, or complete with
    tools (and think, when its own chat template can)."""
    meta = metadata(path)
    if meta.get("general.architecture") in EMBEDDING_ARCHITECTURES:
        return ["embedding"]
    return capabilities({"generate"}, thinks=_thinks(meta.get("tokenizer.chat_template")))


def _thinks(source) -> bool:
    if not isinstance(source, str) or not source:
        return False
    try:
        return thinking.form_of(ChatTemplate(source, bos_token="", eos_token="")).can_think
    except TemplateCompileError:
        return False


def served_template(choice, thinking) -> dict:
    """`/api/show`'s `chat_template` for the served model: which template it is served with, why,
    and how it thinks (`choice` a `TemplateChoice`, `thinking` a `homeai.service.thinking.Form`)."""
    return {"name": choice.name, "description": choice.description, "thinking": thinking.describe()}


def show(path: str, *, capabilities: list[str], context_length: int, full_path: bool = False,
         chat_template: dict | None = None, template: str | None = None) -> dict:
    """`/api/show`: details, the header's facts, the chat template, the default parameters. The
    modelfile names the file; its folders (a home directory, a user name) only with `full_path`.
    For the served model, `template` is the template it is served with (the GGUF's own, a file's or
    a built-in one) and `chat_template` says which and why (homeai's own field)."""
    meta = metadata(path)
    model_info = {k: v for k, v in meta.items() if k != "tokenizer.chat_template"}
    d = sampling.defaults()
    parameters = "\n".join(f"{name:<15}{value}" for name, value in (
        ("temperature", d.temperature), ("top_k", d.top_k), ("top_p", d.top_p), ("min_p", d.min_p),
        ("repeat_penalty", d.repeat_penalty), ("num_ctx", context_length)))
    source = path if full_path else Path(path).name
    out = {"license": meta.get("general.license", ""), "modelfile": f"FROM {source}\n",
           "parameters": parameters,
           "template": template if template is not None else meta.get("tokenizer.chat_template", ""),
           "details": details(path), "model_info": model_info, "capabilities": capabilities,
           "modified_at": _rfc3339(Path(path).stat().st_mtime)}
    return {**out, "chat_template": chat_template} if chat_template is not None else out


def details(path: str) -> dict:
    meta = metadata(path)
    family = meta.get("general.architecture", "")
    return {"parent_model": "", "format": "gguf", "family": family, "families": [family] if family else None,
            "parameter_size": meta.get("general.size_label", ""), "quantization_level": quantization(meta)}


def digest(path: str) -> str:
    p = Path(path).resolve()
    stat = p.stat()
    return hashlib.sha256(f"{p}\n{stat.st_size}\n{stat.st_mtime_ns}".encode()).hexdigest()


def _rfc3339(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat().replace("+00:00", "Z")
