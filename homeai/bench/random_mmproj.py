"""A vision projector with random weights (an "mmproj" GGUF for llama.cpp's libmtmd), so the
whole image path (an image tokenized by mtmd, encoded, its embeddings read into the text model)
runs in tests and benchmarks without a download.

It is LLaVA 1.5's kind (`clip.projector_type = "mlp"`): a small CLIP ViT (class token,
position embeddings, pre-norm blocks of attention and a quick-GELU MLP), then two linear layers
`mm.0` and `mm.2` with a GELU between, out to the text model's embedding size. The tower is tiny
(2 layers, 64 wide: 0.3 MB, plus `mm.2`'s square of the text width, 1 MB for SmolLM2-135M) and an
encode takes well under a millisecond on a CPU. clip.cpp resizes any image to a square of
`image_size` pixels, so one image becomes `(image_size // patch_size) ** 2` image tokens (16 at
the defaults: 64 / 16 = 4 patches a side); their rows are noise. Writing it needs the `gguf`
package (`pip install 'homeai[bench]'`).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from homeai import gguf_header


class VisionShape(NamedTuple):
    layers: int
    hidden: int
    ffn: int  # not equal to hidden: clip.cpp swaps ffn up and down when ffn_down's input width is hidden
    heads: int


VISION = VisionShape(2, 64, 256, 4)
# Real towers' shapes, for what an encode costs (`homeai bench images`): CLIP ViT-B/16 at 224 px (196
# tokens), and ViT-L/14 at 336 px, LLaVA 1.5's (576 tokens)
TOWERS = {"tiny": (VISION, 64, 16), "vit-b": (VisionShape(12, 768, 3072, 12), 224, 16),
          "vit-l": (VisionShape(24, 1024, 4096, 16), 336, 14)}
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # CLIP's pixel normalisation, as LLaVA 1.5 ships it
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def n_image_tokens(image_size: int = 64, patch_size: int = 16) -> int:
    """Tokens one image becomes, whatever its own size: one per patch of the resized square."""
    return (image_size // patch_size) ** 2


def embedding_length(model_gguf: Path) -> int:
    """The text model's embedding size, from its GGUF header (`<arch>.embedding_length`)."""
    meta = gguf_header.metadata(model_gguf)
    n_embd = meta.get(f"{meta.get('general.architecture')}.embedding_length")
    if not n_embd:
        raise ValueError(f"{model_gguf} is not a GGUF text model with an embedding length")
    return int(n_embd)


def write_for_model(out: Path, model_gguf: Path, seed: int = 0) -> int:
    """Write a projector whose rows fit `model_gguf`'s embeddings; returns its size in bytes."""
    return write_mmproj(out, embedding_length(model_gguf), seed)


def write_mmproj(out: Path, n_embd: int, seed: int = 0, image_size: int = 64, patch_size: int = 16,
                 tower: VisionShape = VISION) -> int:
    """Write the projector to `out`, its rows `n_embd` wide (`tower`: the vision transformer's shape);
    returns its size in bytes."""
    gguf = _gguf()
    if image_size <= 0 or patch_size <= 0 or image_size % patch_size:
        raise ValueError(f"the image size ({image_size}) must be a positive multiple of the patch size ({patch_size})")
    s = tower
    rng = np.random.default_rng(seed)
    n_pos = n_image_tokens(image_size, patch_size) + 1  # the patches and the class token

    w = gguf.GGUFWriter(out, "clip")
    w.add_name("random weights, LLaVA 1.5 projector shape")
    w.add_string("general.type", "mmproj")
    w.add_bool("clip.has_vision_encoder", True)  # without it clip.cpp loads no vision tower at all
    w.add_string("clip.projector_type", "mlp")
    w.add_uint32("clip.vision.image_size", image_size)
    w.add_uint32("clip.vision.patch_size", patch_size)
    w.add_uint32("clip.vision.embedding_length", s.hidden)
    w.add_uint32("clip.vision.feed_forward_length", s.ffn)
    w.add_uint32("clip.vision.block_count", s.layers)
    w.add_uint32("clip.vision.attention.head_count", s.heads)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    w.add_uint32("clip.vision.projection_dim", n_embd)  # required by the loader, unused by the mlp graph
    # LLaVA's graph stops one layer short unless told which layer it reads: read the last, so both run
    w.add_array("clip.vision.feature_layer", [s.layers])
    w.add_array("clip.vision.image_mean", list(_CLIP_MEAN))
    w.add_array("clip.vision.image_std", list(_CLIP_STD))

    def matrix(name: str, rows: int, *cols: int) -> None:  # f16, as converted projectors store them
        # (rows past the first 64 repeat them: a large tower is written in seconds; values do not matter)
        block = (rng.standard_normal((min(rows, 64), *cols), dtype=np.float32) * 0.02).astype(np.float16)
        w.add_tensor(name, np.resize(block, (rows, *cols)))

    def vector(name: str, n: int, value: float = 0.0) -> None:
        w.add_tensor(name, np.full(n, value, dtype=np.float32))

    def norm(prefix: str) -> None:
        vector(prefix + ".weight", s.hidden, 1.0)
        vector(prefix + ".bias", s.hidden)

    def linear(prefix: str, rows: int, cols: int) -> None:
        matrix(prefix + ".weight", rows, cols)
        vector(prefix + ".bias", rows)

    matrix("v.patch_embd.weight", s.hidden, 3, patch_size, patch_size)  # a conv, stride one patch
    w.add_tensor("v.class_embd", rng.standard_normal(s.hidden, dtype=np.float32) * 0.02)
    w.add_tensor("v.position_embd.weight", rng.standard_normal((n_pos, s.hidden), dtype=np.float32) * 0.02)
    norm("v.pre_ln")  # no v.post_ln: LLaVA reads the hidden states before CLIP's last norm
    for i in range(s.layers):
        p = f"v.blk.{i}."
        norm(p + "ln1")
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            linear(p + name, s.hidden, s.hidden)
        norm(p + "ln2")
        linear(p + "ffn_up", s.ffn, s.hidden)
        linear(p + "ffn_down", s.hidden, s.ffn)
    linear("mm.0", n_embd, s.hidden)
    linear("mm.2", n_embd, n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out.stat().st_size


def _gguf():
    try:
        import gguf
    except ImportError as e:
        raise RuntimeError("making a random projector needs the gguf package: pip install 'homeai[bench]'") from e
    return gguf
