"""`homeai doctor`: the facts a user needs when the box is slow or broken, without loading a model."""

from __future__ import annotations

import os
from pathlib import Path

from homeai import __version__, threads
from homeai.config import Config
from homeai.models import embedded_gguf, embedding_model, generation_model


def _size(path: Path) -> str:
    if path.is_dir():
        total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    elif path.is_file():
        total = path.stat().st_size
    else:
        return "missing"
    return f"{total / 1e6:.1f} MB"


def _writable(path: Path) -> str:
    folder = path if path.is_dir() else path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return "writable" if os.access(folder, os.W_OK) else "NOT writable"


def facts(cfg: Config) -> dict:
    from homeai.engine import gpu
    from homeai.engine.runner import backend_facts

    backend = backend_facts()
    out = {"homeai": __version__, "config": cfg.source, "backends": backend["backends"],
           "gpu_offload": backend["gpu_offload"],
           "n_gpu_layers": gpu.describe_offload(cfg.model, backend["gpu_offload"]),
           "cuda_graphs": gpu.cuda_graphs(cfg.model, backend["gpu_offload"]).reason,
           "use_extra_bufts": cfg.model.use_extra_bufts, "cpu_features": backend["system_info"],
           "threads": _threads(cfg), "openmp_wait": threads.wait_policy()}
    try:
        model = generation_model(cfg)
        out["model"] = f"{model} ({_size(model)})" + (" [embedded]" if model == embedded_gguf() else "")
        out["chat_template"] = _chat_template(model)
    except FileNotFoundError as e:
        out["model"] = f"MISSING: {e}"
        out["chat_template"] = "unknown (no model)"
    emb = embedding_model(cfg)
    out["embedding_model"] = f"{emb} ({_size(emb)})" if emb else "the generation model, mean-pooled"
    out["speech_model"] = _speech_model(cfg)
    out["data_dir"] = f"{cfg.data_dir} ({_writable(cfg.data_dir)})"
    url = cfg.database_url
    if url.startswith("sqlite:///"):
        db = Path(url.removeprefix("sqlite:///"))
        out["database"] = f"{db} ({'exists' if db.exists() else 'will be created'}, {_writable(db)})"
    else:
        out["database"] = url.split("@")[-1]
    out["listen"] = f"{cfg.server.host}:{cfg.server.port} (auth {'required' if cfg.auth.required else 'off'})"
    return out


def _chat_template(model: Path) -> str:
    """Which chat template formats prompts; a template that does not compile is said here, in full."""
    from homeai.engine.runner import RunnerError, chat_template_choice

    try:
        return chat_template_choice(model).description
    except RunnerError as e:
        return f"UNKNOWN: {e}"


def _threads(cfg: Config) -> str:
    if cfg.model.n_threads:
        return f"{cfg.model.n_threads} (config)"
    return f"{threads.default_threads()} (every core but one of {os.cpu_count()})"


def _speech_model(cfg: Config) -> str:
    from homeai.speech.base import SpeechModelError, libraries_missing, resolve_model_dir

    missing = libraries_missing()
    if missing is not None:
        return f"UNAVAILABLE: {missing}"
    try:
        folder = resolve_model_dir(cfg.speech)
    except SpeechModelError as e:
        return f"MISSING: {e}"
    return f"{folder} ({_size(folder)}, {cfg.speech.device}/{cfg.speech.compute_type})"


def render(info: dict) -> str:
    labels = {"homeai": "homeai version", "config": "config file", "backends": "llama.cpp backends",
              "gpu_offload": "GPU offload available", "n_gpu_layers": "layers offloaded",
              "cuda_graphs": "CUDA graphs",
              "use_extra_bufts": "CPU extra buffer types", "cpu_features": "CPU features",
              "threads": "llama.cpp threads", "openmp_wait": "OpenMP wait policy",
              "model": "generation model", "chat_template": "chat template", "embedding_model": "embedding model",
              "speech_model": "speech model", "data_dir": "data directory", "database": "database",
              "listen": "listens on"}
    lines = []
    for key, label in labels.items():
        value = info[key]
        if isinstance(value, list):
            value = ", ".join(value)
        if isinstance(value, bool):
            value = "yes" if value else "no"
        lines.append(f"{label:28} {value}")
    if not info["gpu_offload"]:
        lines.append("hint: this llama.cpp build is CPU-only; for an NVIDIA GPU reinstall llama-cpp-python with "
                     "CMAKE_ARGS=\"-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=<arch>\" (see README)")
    return "\n".join(lines)
