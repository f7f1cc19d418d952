"""Cache sizes from the model: the training context within the memory budget, a configured size as given."""

from __future__ import annotations

import pytest

from homeai.config import from_dict
from homeai.engine import kvsize

# SmolLM2-135M: 30 layers, 9 heads, 3 KV heads of 64: 23,040 bytes of K and V a cell.
SMOL = kvsize.Shape(n_ctx_train=8192, n_layer=30, n_head=9, n_embd_k=192, n_embd_v=192, n_batch=512,
                    flash_attn=False)
GIB = 2**30


def test_a_cell_costs_k_and_v_in_every_layer_and_on_the_cpu_a_row_of_scores_per_step_token():
    assert SMOL.kv_bytes == 23_040  # llama.cpp: 90 MiB for 4,096 cells
    assert SMOL.scratch_bytes == 512 * 9 * 4
    assert kvsize.Shape(**{**SMOL.__dict__, "flash_attn": True}).cell_bytes == SMOL.kv_bytes


def test_with_room_both_caches_hold_the_training_context():
    sizes = kvsize.plan(SMOL, n_ctx=0, interactive_n_ctx=-1, free_bytes=8 * GIB, share=0.25)
    assert (sizes.main, sizes.interactive) == (8192, 8192)
    assert "training context (8192 tokens)" in sizes.note
    described = sizes.describe()
    assert described["interactive"] == "8192 cells, KV 180 MiB + attention scratch 144 MiB"


def test_past_the_budget_the_caches_share_it_in_whole_steps_never_below_one_step():
    sizes = kvsize.plan(SMOL, n_ctx=0, interactive_n_ctx=-1, free_bytes=1 * GIB, share=0.25)
    assert sizes.main == sizes.interactive < 8192
    assert sizes.main % kvsize.ROUND == 0
    assert 2 * sizes.main * SMOL.cell_bytes <= GIB // 4
    assert "less than the model's training context" in sizes.note
    tiny = kvsize.plan(SMOL, n_ctx=0, interactive_n_ctx=-1, free_bytes=1_000_000, share=0.25)
    assert (tiny.main, tiny.interactive) == (512, 512)  # one step's tokens


def test_a_configured_size_is_taken_as_given_and_counts_against_the_budget():
    given = kvsize.plan(SMOL, n_ctx=2048, interactive_n_ctx=0, free_bytes=10**6, share=0.25)
    assert (given.main, given.interactive, given.note) == (2048, 0, "as configured")
    mixed = kvsize.plan(SMOL, n_ctx=0, interactive_n_ctx=4096, free_bytes=8 * GIB, share=0.25)
    assert (mixed.main, mixed.interactive) == (8192, 4096)
    one_cache = kvsize.plan(SMOL, n_ctx=0, interactive_n_ctx=0, free_bytes=8 * GIB, share=0.25)
    assert (one_cache.main, one_cache.interactive) == (8192, 0)


def test_a_long_trained_model_on_a_small_box_is_held_to_the_budget():
    llama8b = kvsize.Shape(n_ctx_train=131072, n_layer=32, n_head=32, n_embd_k=1024, n_embd_v=1024, n_batch=512,
                           flash_attn=True)
    sizes = kvsize.plan(llama8b, n_ctx=0, interactive_n_ctx=-1, free_bytes=16 * GIB, share=0.25)
    assert sizes.main == sizes.interactive == 16384  # a quarter of 16 GiB at 128 KiB a cell, halved


def test_a_simulation_sizes_from_the_embedded_model():
    assert kvsize.without_model(0, -1) == (8192, 8192)
    assert kvsize.without_model(2048, 0) == (2048, 0)


@pytest.mark.parametrize("model, message", [
    ({"n_ctx": 100}, "model.n_ctx must be at least 256 (or 0: from the model)"),
    ({"interactive_n_ctx": -2}, "model.interactive_n_ctx must be -1 (from the model), 0 (one cache)"),
    ({"kv_memory_share": 0.0}, "model.kv_memory_share must be in (0, 1]"),
    ({"n_ctx": 512, "n_batch": 1024}, "model.n_batch must be between"),
])
def test_bad_sizes_are_refused_at_load(model, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        from_dict({"model": model})
