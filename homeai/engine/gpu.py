"""What llama.cpp is told about the GPU: how many layers it offloads, and whether CUDA graphs run.

Pure: decided from the config and one fact of the build (`llama_supports_gpu_offload`, a GPU
backend compiled in), so the runner applies it and `homeai doctor` says it without a model.

* Offload: `model.n_gpu_layers = -1` (the default) offloads every layer when the build has a
  GPU backend, as llama-server and Ollama do; a CPU-only build offloads none, whatever is set.
* CUDA graphs: two generation contexts (`model.interactive_n_ctx` > 0) decoded back to back in
  one step over one offloaded model aborted homeai with CUDA graphs on ("an illegal instruction
  was encountered", on an H200, issue 16), and never with them off or with one cache. So
  `model.cuda_graphs = "auto"` (the default) turns them off exactly there; "on" keeps them on
  (the user's opt-in), "off" turns them off wherever a GPU is used. Off costs single-sequence
  decode speed: the raw loop ran 242 tok/s against 272-278 with graphs on (an 8B-shaped q4_0).
  ggml-cuda reads `GGML_CUDA_DISABLE_GRAPHS` once per process, at its first graph compute (the
  first decode on the GPU), so the runner sets it before it loads the model; set outside
  homeai, it turns graphs off whatever the config says.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from homeai.config import ModelConfig

GRAPHS_ENV = "GGML_CUDA_DISABLE_GRAPHS"
ALL_LAYERS = 2**31 - 1  # llama.cpp offloads min(this, the model's layers)


def offloaded_layers(cfg: ModelConfig, gpu_backend: bool) -> int:
    """The n_gpu_layers llama.cpp is given: 0 on a CPU-only build, ALL_LAYERS for -1."""
    if not gpu_backend:
        return 0
    return ALL_LAYERS if cfg.n_gpu_layers < 0 else cfg.n_gpu_layers


def plans_ahead(setting: str, cfg: ModelConfig, gpu_backend: bool) -> bool:
    """Whether the engine plans each step while the one before computes (`scheduler.plan_ahead`):
    auto: when layers are offloaded to a GPU, whose llama_decode returns before it computes; on a
    CPU it computes before returning, so nothing would overlap."""
    if setting == "auto":
        return offloaded_layers(cfg, gpu_backend) != 0
    return setting == "on"


def describe_plan_ahead(setting: str, cfg: ModelConfig, gpu_backend: bool) -> str:
    """`plans_ahead`'s answer and why, for `homeai doctor`."""
    on = plans_ahead(setting, cfg, gpu_backend)
    if setting != "auto":
        why = f"scheduler.plan_ahead = {setting}"
    elif on:
        why = "auto: layers run on a GPU, whose llama_decode returns before it computes"
    else:
        why = "auto: no layers run on a GPU, and on a CPU llama_decode computes before it returns"
    return f"{'on' if on else 'off'} ({why})"


def describe_offload(cfg: ModelConfig, gpu_backend: bool) -> str:
    layers = offloaded_layers(cfg, gpu_backend)
    setting = f"model.n_gpu_layers = {cfg.n_gpu_layers}"
    if not gpu_backend:
        return f"none: this llama.cpp build has no GPU backend ({setting})"
    if layers == ALL_LAYERS:
        return f"all ({setting})"
    return f"{layers} ({setting})" if layers else f"none: the model runs on the CPU ({setting})"


@dataclass(frozen=True)
class Graphs:
    enabled: bool
    reason: str
    disable_env: bool = False  # the runner must set GRAPHS_ENV before the model loads


def cuda_graphs(cfg: ModelConfig, gpu_backend: bool, environ: Mapping[str, str] = os.environ) -> Graphs:
    """Whether CUDA graphs run, and why."""
    if not gpu_backend or not offloaded_layers(cfg, gpu_backend):
        return Graphs(False, "not used: no layers run on a GPU")
    if GRAPHS_ENV in environ:
        return Graphs(False, f"off: {GRAPHS_ENV} is set in the environment")
    if cfg.cuda_graphs == "on":
        return Graphs(True, "on (model.cuda_graphs = on)")
    if cfg.cuda_graphs == "off":
        return Graphs(False, "off (model.cuda_graphs = off)", disable_env=True)
    if cfg.interactive_n_ctx:
        return Graphs(False, "off (model.cuda_graphs = auto): two generation contexts "
                      "(model.interactive_n_ctx > 0) aborted with CUDA graphs on; set it to on to opt in",
                      disable_env=True)
    return Graphs(True, "on (model.cuda_graphs = auto, one generation context)")


def apply(graphs: Graphs, environ: MutableMapping[str, str] = os.environ) -> None:
    """Turn CUDA graphs off for this process when `graphs` says so (before the first decode)."""
    if graphs.disable_env:
        environ[GRAPHS_ENV] = "1"
