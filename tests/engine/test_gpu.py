"""GPU offload and CUDA graphs as decided for a build (homeai.engine.gpu), and what this CPU-only
build does with the defaults: offload resolves to none, flash attention stays off, `homeai doctor`
says so; the two-context step pattern of issue 16 decodes the same tokens in both contexts.

Run: .venv/bin/python -m pytest tests/engine/test_gpu.py
"""

from __future__ import annotations

import re

import pytest

from homeai.config import ConfigError, ModelConfig, from_dict
from homeai.engine import gpu

TWO_CONTEXTS = ModelConfig()  # the defaults: every layer offloaded, an interactive cache of its own
ONE_CONTEXT = ModelConfig(interactive_n_ctx=0)


def test_the_defaults_offload_every_layer_on_a_gpu_build_and_none_on_a_cpu_only_one():
    assert ModelConfig().n_gpu_layers == -1 and ModelConfig().cuda_graphs == "auto"
    assert gpu.offloaded_layers(ModelConfig(), gpu_backend=True) == gpu.ALL_LAYERS
    assert gpu.offloaded_layers(ModelConfig(), gpu_backend=False) == 0
    assert gpu.offloaded_layers(ModelConfig(n_gpu_layers=12), gpu_backend=True) == 12
    assert gpu.offloaded_layers(ModelConfig(n_gpu_layers=12), gpu_backend=False) == 0
    assert gpu.describe_offload(ModelConfig(), True) == "all (model.n_gpu_layers = -1)"
    assert gpu.describe_offload(ModelConfig(), False).startswith("none: this llama.cpp build has no GPU backend")
    assert gpu.describe_offload(ModelConfig(n_gpu_layers=0), True).startswith("none: the model runs on the CPU")


def test_auto_turns_cuda_graphs_off_only_for_two_generation_contexts_on_a_gpu():
    off = gpu.cuda_graphs(TWO_CONTEXTS, True, {})
    assert not off.enabled and off.disable_env and "interactive_n_ctx" in off.reason
    on = gpu.cuda_graphs(ONE_CONTEXT, True, {})
    assert on.enabled and not on.disable_env
    # no GPU in use (a CPU-only build, or no layer offloaded): nothing to turn off
    for unused in (gpu.cuda_graphs(TWO_CONTEXTS, False, {}), gpu.cuda_graphs(ModelConfig(n_gpu_layers=0), True, {})):
        assert not unused.enabled and not unused.disable_env and unused.reason.startswith("not used")


def test_the_user_may_opt_in_or_out_and_the_environment_has_the_last_word():
    opted_in = gpu.cuda_graphs(ModelConfig(cuda_graphs="on"), True, {})
    assert opted_in.enabled and not opted_in.disable_env
    opted_out = gpu.cuda_graphs(ModelConfig(cuda_graphs="off", interactive_n_ctx=0), True, {})
    assert not opted_out.enabled and opted_out.disable_env
    by_env = gpu.cuda_graphs(ModelConfig(cuda_graphs="on"), True, {gpu.GRAPHS_ENV: "1"})
    assert not by_env.enabled and gpu.GRAPHS_ENV in by_env.reason


def test_apply_sets_the_variable_ggml_cuda_reads_only_when_graphs_must_go_off():
    environ: dict[str, str] = {}
    gpu.apply(gpu.cuda_graphs(ONE_CONTEXT, True, environ), environ)
    assert environ == {}
    gpu.apply(gpu.cuda_graphs(TWO_CONTEXTS, True, environ), environ)
    assert environ == {gpu.GRAPHS_ENV: "1"}


def test_cuda_graphs_takes_auto_on_or_off():
    assert from_dict({"model": {"cuda_graphs": "off"}}).model.cuda_graphs == "off"
    with pytest.raises(ConfigError, match="model.cuda_graphs must be auto, on or off"):
        from_dict({"model": {"cuda_graphs": "sometimes"}})


@pytest.mark.model
def test_on_this_cpu_only_build_the_defaults_keep_everything_on_the_cpu():
    from homeai.config import Config
    from homeai.doctor import facts, render
    from homeai.llama import model

    assert not model.ll.llama_supports_gpu_offload(), "this test describes a CPU-only build"
    # -1 would make llama.cpp's `auto` flash attention turn on, several times slower on a CPU
    assert model.flash_attn_type(ModelConfig()) == model.ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
    info = facts(Config())
    assert info["gpu_offload"] is False
    assert info["n_gpu_layers"] == "none: this llama.cpp build has no GPU backend (model.n_gpu_layers = -1)"
    assert info["cuda_graphs"] == "not used: no layers run on a GPU"
    assert info["plan_ahead"].startswith("off (auto: no layers run on a GPU")
    text = render(info)
    assert "layers offloaded" in text and "CUDA graphs" in text and "-DCMAKE_CUDA_ARCHITECTURES" in text
    assert re.search(r"planning ahead +off \(auto", text)


@pytest.mark.model
def test_both_generation_contexts_decode_the_same_tokens_back_to_back(runner):
    from homeai.bench.raw_loop import raw_two_context_decode

    assert runner.ictx is not None
    a = runner.tokenize("The kitchen lights are on and")
    b = runner.tokenize("Tomorrow we should buy bread, milk and")
    result = raw_two_context_decode(runner, [a, a, b, b], 12)  # a and b in main, a and b in interactive
    outputs = result["outputs"]
    assert result["tokens"] == 48 and all(len(o) == 12 for o in outputs)
    assert outputs[0] == outputs[1] and outputs[2] == outputs[3]
    assert outputs[0] != outputs[2]


def test_the_reproduction_refuses_a_single_cache(tmp_path, capsys):
    from homeai.bench.graphs_repro import main

    config = tmp_path / "one.toml"
    config.write_text("[model]\ninteractive_n_ctx = 0\n")
    assert main(["--config", str(config)]) == 2
    assert "interactive_n_ctx > 0" in capsys.readouterr().err
