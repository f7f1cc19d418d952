"""A random-weight vision projector: libmtmd loads it beside a text model, tokenizes an image into its
image tokens and encodes them into rows as wide as the model's embeddings, all offline."""

from __future__ import annotations

import ctypes
from contextlib import contextmanager
from pathlib import Path

import llama_cpp as ll
import llama_cpp.mtmd_cpp as mtmd
import numpy as np
import pytest

from homeai.bench import random_model
from homeai.bench.random_mmproj import embedding_length, n_image_tokens, write_for_model, write_mmproj
from homeai.config import ModelConfig
from homeai.llama.model import init_backend, load_model
from tests.test_cli import homeai

pytest.importorskip("gguf")  # the writers import it when called


def init(mmproj: Path, model):
    params = mtmd.mtmd_context_params_default()
    params.use_gpu = False
    params.n_threads = 2
    params.print_timings = False
    return mtmd.mtmd_init_from_file(str(mmproj).encode(), model, params)


@contextmanager
def vision(mmproj: Path, model):
    ctx = init(mmproj, model)
    assert ctx, "libmtmd refused the projector (its reason is on stderr)"
    try:
        yield ctx
    finally:
        mtmd.mtmd_free(ctx)


@contextmanager
def chunks_of(ctx, text: bytes, width: int = 40, height: int = 30):
    """`text`'s chunks, its media marker standing for one RGB image of random bytes."""
    pixels = np.random.default_rng(0).integers(0, 256, width * height * 3, dtype=np.uint8)
    bitmap = mtmd.mtmd_bitmap_init(width, height, pixels.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
    chunks = mtmd.mtmd_input_chunks_init()
    try:
        inp = mtmd.mtmd_input_text(text=text, text_len=len(text), add_special=False, parse_special=True)
        assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
        yield [mtmd.mtmd_input_chunks_get(chunks, i) for i in range(mtmd.mtmd_input_chunks_size(chunks))]
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bitmap)


def encoded(ctx, chunk, n_embd: int) -> np.ndarray:
    assert mtmd.mtmd_encode_chunk(ctx, chunk) == 0
    n = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
    return np.ctypeslib.as_array(mtmd.mtmd_get_output_embd(ctx), shape=(n, n_embd)).copy()


@contextmanager
def loaded(path: Path):
    init_backend()
    model = load_model(path, ModelConfig())
    try:
        yield model
    finally:
        ll.llama_model_free(model)


@pytest.fixture(scope="module")
def tiny(module_tmp):
    """The tiny random text model (64-wide embeddings) and its projector, as `homeai bench model` writes
    them; the model loaded."""
    path, mmproj = module_tmp / "m.gguf", module_tmp / "mmproj.gguf"
    out = homeai("bench", "model", str(path), "--shape", "tiny", "--type", "f16", "--mmproj", str(mmproj),
                 tmp_path=module_tmp)
    assert out.returncode == 0, out.stderr
    assert f"{mmproj}: 0.3 MB, a random LLaVA-style vision projector for it (16 tokens an image)" in out.stdout
    with loaded(path) as model:
        yield model, mmproj


def test_an_image_becomes_smollm2_wide_rows_through_libmtmd(tmp_path):
    smollm2, mmproj = random_model._tokenizer_source(), tmp_path / "mmproj.gguf"
    assert write_for_model(mmproj, smollm2) < 2_000_000  # its width read from SmolLM2's header
    with loaded(smollm2) as model, vision(mmproj, model) as ctx:
        assert mtmd.mtmd_support_vision(ctx) and not mtmd.mtmd_decode_use_mrope(ctx)
        marker = mtmd.mtmd_get_marker(ctx)
        with chunks_of(ctx, b"What is in " + marker + b"? Say it briefly.") as chunks:
            types = [mtmd.mtmd_input_chunk_get_type(c) for c in chunks]
            assert types == [mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT, mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE,
                             mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT]
            image = chunks[1]
            assert mtmd.mtmd_input_chunk_get_n_tokens(image) == n_image_tokens() == 16  # 40x30 resized to 64x64
            assert not mtmd.mtmd_decode_use_non_causal(ctx, image)
            rows = encoded(ctx, image, 576)
    assert rows.shape == (16, 576) and np.isfinite(rows).all() and np.abs(rows).max() > 0


def test_the_projector_bench_model_writes_fits_its_model(tiny, module_tmp, tmp_path):
    model, mmproj = tiny
    assert embedding_length(module_tmp / "m.gguf") == random_model.SHAPES["tiny"].hidden == 64
    smaller = tmp_path / "mmproj-32.gguf"
    write_mmproj(smaller, random_model.SHAPES["tiny"].hidden, image_size=32)
    for path, n_tokens in ((mmproj, 16), (smaller, 4)):
        with vision(path, model) as ctx, chunks_of(ctx, mtmd.mtmd_get_marker(ctx), 8, 8) as chunks:
            assert len(chunks) == 1 and mtmd.mtmd_input_chunk_get_n_tokens(chunks[0]) == n_tokens
            rows = encoded(ctx, chunks[0], 64)
        assert rows.shape == (n_tokens, 64) and np.isfinite(rows).all() and np.abs(rows).max() > 0
    assert n_image_tokens(32) == 4


def test_a_projector_for_another_width_is_refused(tiny, tmp_path):
    write_mmproj(tmp_path / "mmproj.gguf", 576)
    assert not init(tmp_path / "mmproj.gguf", tiny[0])  # "mismatch between text model (n_embd = 64) and mmproj ..."


def test_the_image_must_split_into_whole_patches_and_the_model_be_a_gguf(tmp_path):
    with pytest.raises(ValueError, match="multiple of the patch size"):
        write_mmproj(tmp_path / "x.gguf", 64, image_size=40)
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ValueError, match="not a GGUF text model"):
        write_for_model(tmp_path / "x.gguf", tmp_path / "notes.txt")
