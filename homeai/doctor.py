"""`homeai doctor`: the facts a user needs when the box is slow or broken, without loading a model,
and warnings: the embedded demo model served, a model and its KV caches larger than the memory it
sees (the GPU's with layers offloaded, by nvidia-smi; else RAM).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from homeai import __version__, threads
from homeai import catalog
from homeai.api.connections import Caps
from homeai.config import Config
from homeai.gguf_header import context_length, kv_bytes_per_cell, metadata
from homeai.models import embedded_gguf, embedding_model, generation_model, projector

MEMORY_SLACK = 0.9  # llama.cpp's compute buffers, the CUDA context and the system need the rest


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
    from homeai.llama import backend_facts

    backend = backend_facts()
    out = {"homeai": __version__, "config": cfg.source, "backends": backend["backends"],
           "gpu_offload": backend["gpu_offload"],
           "n_gpu_layers": gpu.describe_offload(cfg.model, backend["gpu_offload"]),
           "cuda_graphs": gpu.cuda_graphs(cfg.model, backend["gpu_offload"]).reason,
           "plan_ahead": gpu.describe_plan_ahead(cfg.scheduler.plan_ahead, cfg.model, backend["gpu_offload"]),
           "use_extra_bufts": cfg.model.use_extra_bufts, "cpu_features": backend["system_info"],
           "threads": _threads(cfg), "openmp_wait": threads.wait_policy()}
    try:
        model = generation_model(cfg)
        out["model"] = f"{model} ({_size(model)})" + (" [embedded]" if model == embedded_gguf() else "")
        out["chat_template"], template_warning = _chat_template(model, cfg.model.chat_template)
        out["kv_caches"] = _kv_caches(cfg, model)
        out["speculative"] = _drafting(cfg, model)
    except FileNotFoundError as e:
        out["model"] = f"MISSING: {e}"
        out["chat_template"] = out["kv_caches"] = out["speculative"] = "unknown (no model)"
        template_warning = None
    out["images"] = _images(cfg)
    out["turn_formats"] = _turn_formats()
    emb = embedding_model(cfg)
    out["embedding_model"] = f"{emb} ({_size(emb)})" if emb else "the generation model, mean-pooled"
    out["speech_model"] = _speech_model(cfg)
    out["tts_voice"] = _tts_voice(cfg)
    out["data_dir"] = f"{cfg.data_dir} ({_writable(cfg.data_dir)})"
    url = cfg.database_url
    if url.startswith("sqlite:///"):
        db = Path(url.removeprefix("sqlite:///"))
        out["database"] = f"{db} ({'exists' if db.exists() else 'will be created'}, {_writable(db)})"
    else:
        out["database"] = url.split("@")[-1]
    out["listen"] = f"{cfg.server.host}:{cfg.server.port} (auth {'required' if cfg.auth.required else 'off'})"
    out["memory"], out["warnings"] = _memory_facts(cfg, backend["gpu_offload"])
    caps = Caps.of(cfg.server)  # each connection is an open file: the caps stay below the limit
    out["connections"] = caps.describe()
    if caps.warning() is not None:
        out["warnings"].append(caps.warning())
    if template_warning is not None:
        out["warnings"].append(template_warning)
    return out


def _memory_facts(cfg: Config, gpu_offload: bool) -> tuple[str, list[str]]:
    """What the model and its caches take beside the memory there is, and the warnings that follow."""
    try:
        model, embedding = generation_model(cfg), embedding_model(cfg)
    except FileNotFoundError:
        return "unknown (no model)", []
    warnings = []
    if model == embedded_gguf():
        warnings.append("the served model is the embedded SmolLM2-135M, a demo: it repeats itself and cannot call "
                        "Home Assistant's tools. Pull a real one (`homeai pull`, README: models that fit this box) "
                        "and set model.path to its name")
    where, total = _memory(gpu_offload and cfg.model.n_gpu_layers != 0)
    models = catalog.folder(cfg.data_dir)
    weights = _model_bytes(model, models) + (_model_bytes(embedding, models) if embedding else 0)
    kv, cells = _kv_bytes(cfg, model, embedding or model, total)
    needed = weights + kv
    fact = f"{needed / 1e9:.2f} GB (weights {weights / 1e9:.2f} GB + KV {kv / 1e9:.2f} GB, {cells}) of {where}'s " \
           f"{total / 1e9:.1f} GB"
    if needed > MEMORY_SLACK * total:
        warnings.append(f"the model and its KV caches need about {needed / 1e9:.1f} GB but {where} has "
                        f"{total / 1e9:.1f} GB: lower model.n_ctx and model.interactive_n_ctx, or pull a smaller "
                        f"model or quantisation")
    return fact, warnings


def _kv_bytes(cfg: Config, model: Path, embedder: Path, total: int) -> tuple[int, str]:
    """KV bytes at f16 of the configured caches; a cache sized from the model (n_ctx 0, interactive_n_ctx -1)
    counts its training context, within `model.kv_memory_share` of the memory."""
    m, meta = cfg.model, metadata(model)
    per_cell = kv_bytes_per_cell(meta) or 0
    fixed = sum(n for n in (m.n_ctx, m.interactive_n_ctx) if n > 0)
    num_auto = (m.n_ctx == 0) + (m.interactive_n_ctx == -1)
    auto = num_auto * (context_length(meta) or 0) * per_cell
    if num_auto:
        auto = min(auto, int(getattr(m, "kv_memory_share", 1.0) * total))
    embed = m.embed_n_ctx * (kv_bytes_per_cell(metadata(embedder)) or 0)
    text = f"{fixed + m.embed_n_ctx:,} cells configured"
    if num_auto:
        text += f", {num_auto} cache(s) sized from the model"
    return fixed * per_cell + auto + embed, text


def _model_bytes(path: Path, models: Path) -> int:
    """A model's bytes: a split model's every part (the catalog knows them), else its one file."""
    for model in catalog.listed(models):
        if model.path.resolve() == path.resolve():
            return model.size
    return path.stat().st_size


def _memory(on_gpu: bool) -> tuple[str, int]:
    """The first NVIDIA GPU's memory when layers are offloaded (nvidia-smi), else the machine's RAM."""
    if on_gpu:
        try:
            answer = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                                    capture_output=True, text=True, timeout=10, check=True)
            return "the GPU", int(answer.stdout.split()[0]) * 1024 * 1024
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            pass
    return "RAM", os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _chat_template(model: Path, configured: str = "") -> tuple[str, str | None]:
    """Which chat template formats prompts and why, and a warning when it is a guess or stands in
    for one that does not compile; a `model.chat_template` that names nothing is said in full."""
    from homeai.llama import RunnerError, chat_template_choice
    from homeai.engine.template import TemplateCompileError

    try:
        choice = chat_template_choice(model, configured)
    except TemplateCompileError as e:
        return f"ERROR: {e}", f"homeai serve will not start: {e}"
    except RunnerError as e:
        return f"UNKNOWN: {e}", None
    if choice.error:
        return choice.description, f"the model's chat template is not in use: {choice.error}"
    if choice.guessed:
        return choice.description, ("no chat template and no known turn format in the model: if answers run on "
                                    "past their turn, name its format in model.chat_template")
    return choice.description, None


def _turn_formats() -> str:
    from homeai.engine import families

    return f"{', '.join(families.NAMES)} (model.chat_template names one, or a Jinja2 file)"


def _kv_caches(cfg: Config, model: Path) -> str:
    """Cells and bytes of each generation cache, and how they were sized (homeai.engine.kvsize)."""
    from homeai.llama import kv_sizes

    sizes = kv_sizes(cfg.model, model)
    if sizes is None:
        return "sized when the model loads (its GGUF does not say its shape)"
    return "; ".join(f"{name}: {value}" for name, value in sizes.describe().items())


def _drafting(cfg: Config, model: Path) -> str:
    """Whether answers draft tokens (`[speculative]`), and why not where the model's cache cannot be
    cut back to the guesses it accepted (its GGUF header: a sliding window, a recurrent state)."""
    from homeai.engine.engine import draft_settings

    sp = cfg.speculative
    if not sp.enabled:
        return "off ([speculative] enabled = false)"
    meta = metadata(model)
    arch = meta.get("general.architecture", "")
    window = meta.get(f"{arch}.attention.sliding_window")
    if isinstance(window, int) and window > 0:
        return (f"off for this model: its sliding-window attention ({window} tokens) cannot be cut back to the "
                "guesses it accepted")
    if any(key.startswith((f"{arch}.ssm.", f"{arch}.wkv.", f"{arch}.rwkv")) for key in meta):
        return "off for this model: a recurrent state cannot be cut back to the guesses it accepted"
    lanes = ", ".join(sorted(draft_settings(cfg).lanes))
    model = f", else by the draft model {sp.draft_path}" if sp.draft_path else ""
    return (f"on for {lanes}: up to {sp.max_draft} tokens an answer a step, guessed from its prompt and answer"
            f"{model}, while they pay (learnt per member)")


MROPE_PROJECTORS = ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger", "qwen25o")  # M-RoPE positions


def _images(cfg: Config) -> str:
    """Whether images are understood: the projector (`[model] mmproj`) as its GGUF header says it."""
    if not cfg.model.mmproj:
        return "not understood (no [model] mmproj): images are refused with a 400"
    try:
        path = projector(cfg)
    except FileNotFoundError as e:
        return f"MISSING: {e}"
    meta = metadata(path)
    kind = meta.get("clip.projector_type") or meta.get("clip.vision.projector_type") or "unknown"
    if not meta.get("clip.has_vision_encoder", False):
        return f"NOT READ: {path} has no vision encoder (an audio projector?)"
    if kind in MROPE_PROJECTORS:
        return f"NOT READ: {path} ({kind}) places images with M-RoPE positions, which homeai does not read yet"
    size = meta.get("clip.vision.image_size", "?")
    return (f"understood, by {path} ({_size(path)}, a {kind} projector, images read at {size} px), "
            f"at most {cfg.limits.max_images} a request, {cfg.limits.max_image_bytes:,} bytes each")


def _threads(cfg: Config) -> str:
    if cfg.model.n_threads:
        return f"{cfg.model.n_threads} (config)"
    return threads.CoreWatch().describe()


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


def _tts_voice(cfg: Config) -> str:
    """Speech out's state: the voice it would load, or why there is none (chat serves either way)."""
    from homeai.speech.base import SpeechModelError, resolve_voice, tts_libraries_missing

    if not cfg.tts.enabled:
        return "OFF (tts.enabled = false)"
    missing = tts_libraries_missing()
    if missing is not None:
        return f"UNAVAILABLE: {missing}"
    try:
        voice = resolve_voice(cfg.tts)
    except SpeechModelError as e:
        return f"MISSING: {e}"
    return f"{voice} ({_size(voice)}, {cfg.tts.workers} worker(s) x {cfg.tts.threads or 'all'} thread(s))"


def render(info: dict) -> str:
    labels = {"homeai": "homeai version", "config": "config file", "backends": "llama.cpp backends",
              "gpu_offload": "GPU offload available", "n_gpu_layers": "layers offloaded",
              "cuda_graphs": "CUDA graphs", "plan_ahead": "planning ahead",
              "use_extra_bufts": "CPU extra buffer types", "cpu_features": "CPU features",
              "threads": "llama.cpp threads", "openmp_wait": "OpenMP wait policy",
              "model": "generation model", "chat_template": "chat template", "turn_formats": "turn formats built in",
              "kv_caches": "KV caches", "speculative": "drafted tokens", "images": "images",
              "embedding_model": "embedding model",
              "speech_model": "speech model", "tts_voice": "speech out (piper voice)", "data_dir": "data directory", "database": "database",
              "listen": "listens on", "connections": "HTTP connections", "memory": "model memory"}
    lines = []
    for key, label in labels.items():
        value = info[key]
        if isinstance(value, list):
            value = ", ".join(value)
        if isinstance(value, bool):
            value = "yes" if value else "no"
        lines.append(f"{label:28} {value}")
    lines += [f"warning: {w}" for w in info["warnings"]]
    if not info["gpu_offload"]:
        lines.append("hint: this llama.cpp build is CPU-only; for an NVIDIA GPU reinstall llama-cpp-python with "
                     "CMAKE_ARGS=\"-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=<arch>\" (see README)")
    return "\n".join(lines)
