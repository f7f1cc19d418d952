"""Images in a prompt (`homeai.llama.vision`): a picture becomes placeholder tokens, its projector's
embeddings are read into the sequence's cells in chunks like any prompt, cached by content hash.

The projector has random weights (`homeai.bench.random_mmproj`, written for SmolLM2's 576-wide
embeddings): its embeddings mean nothing to the model, but they are real inputs, so reading them in one
step or in several, beside other sequences or alone, must give the same next-token distributions (as the
batching tests compare them), and another picture must give another one."""

from __future__ import annotations

import numpy as np
import pytest

from homeai.engine.errors import InvalidRequest
from homeai.engine.stream import FinishEvent, TokenEvent
from homeai.sched.request import SamplingParams
from homeai.service.images import Picture, decode
from homeai.config import LimitsConfig
from tests.conftest import _engines
from tests.engine.test_batching import compare, kl

pytest.importorskip("gguf")  # the random projector's writer (tests/conftest.py, `vision_runner`)


@pytest.fixture
def make_vision_engine(vision_runner):
    yield from _engines(vision_runner)


def picture(seed: int, size=(48, 40)) -> Picture:
    import io
    from PIL import Image

    rgb = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="PNG")
    return decode(out.getvalue(), LimitsConfig())


def image_prompt(runner, pictures, question="What is in this picture?"):
    from homeai.engine.prompt import image_mark
    import dataclasses

    marks = "".join(image_mark(i) + "\n" for i in range(len(pictures)))
    prompt = runner.apply_chat_template([{"role": "user", "content": marks + question}])
    return dataclasses.replace(prompt, images=tuple(pictures), holder=f"test-{id(pictures)}")


def released(runner, within_s: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + within_s
    while runner.vision._held and time.monotonic() < deadline:
        time.sleep(0.02)
    return not runner.vision._held


def first_logits(engine, prompt, member="alice", **params):
    events = list(engine.submit(prompt, lane="chat", member=member,
                                params=SamplingParams(temperature=0, max_tokens=4, record_logits=True, **params)))
    finish = events[-1]
    assert isinstance(finish, FinishEvent), finish
    tokens = [e.token for e in events if isinstance(e, TokenEvent)]
    return finish, tokens


def logits_of(engine, prompt, member="alice", n=4):
    """The answer's recorded logits rows (teacher forcing the greedy answer of the first run is not
    needed: the first row is the one the image decides)."""
    request = {}
    stream = engine.submit(prompt, lane="chat", member=member,
                           params=SamplingParams(temperature=0, max_tokens=n, record_logits=True))
    request["r"] = stream.request
    events = list(stream)
    assert isinstance(events[-1], FinishEvent)
    return [s.logits for s in request["r"].samples]


def test_an_image_is_placeholders_the_projector_fills_and_counts_as_prompt_tokens(vision_runner, make_vision_engine):
    tokens = vision_runner.tokenize(image_prompt(vision_runner, [picture(1)]))
    (start, end), = tokens.images
    assert end - start == 16 and all(t < 0 for t in tokens[start:end])  # 64x64 in 16-pixel patches
    assert all(t >= 0 for t in tokens[:start] + tokens[end:])
    vision_runner.release_images(tokens.holder)
    engine = make_vision_engine()
    finish, out = first_logits(engine, image_prompt(vision_runner, [picture(1)]))
    assert out and finish.stats.prompt_tokens == len(tokens)  # the image's tokens are prompt tokens (usage)
    assert released(vision_runner)  # the request ended: its hold on the embeddings went (at the next step)


def test_the_picture_decides_the_answer_and_the_same_picture_is_read_alike(vision_runner, make_vision_engine):
    engine = make_vision_engine()
    a = logits_of(engine, image_prompt(vision_runner, [picture(1)]))[0]
    b = logits_of(engine, image_prompt(vision_runner, [picture(2)]))[0]
    again = logits_of(engine, image_prompt(vision_runner, [picture(1)]))[0]
    assert kl(a, again) < 0.02
    assert kl(a, b) > 10 * max(kl(a, again), 1e-4), (kl(a, b), kl(a, again))


def test_an_image_read_in_chunks_beside_others_reads_as_it_does_whole_and_alone(vision_runner, make_vision_engine):
    prompt = image_prompt(vision_runner, [picture(3), picture(4)], "Compare the two pictures.")
    whole = logits_of(make_vision_engine(), prompt)
    # steps of 8 tokens: each image (16) in two chunks, the text around them cut anywhere
    chunked_engine = make_vision_engine(max_step_tokens=8)
    others = [chunked_engine.submit(vision_runner.tokenize(vision_runner.apply_chat_template(
        [{"role": "user", "content": f"Count to {n}."}])), lane="chat", member=f"m{n}",
        params=SamplingParams(temperature=0, max_tokens=12)) for n in (5, 7)]
    chunked = logits_of(chunked_engine, prompt)
    for stream in others:
        assert isinstance(list(stream)[-1], FinishEvent)
    mean_kl, agree = compare(whole, chunked)
    assert mean_kl < 0.05 and all(agree), (mean_kl, agree)


def test_an_image_read_a_token_a_step_reads_alike(vision_runner, make_vision_engine):
    prompt = image_prompt(vision_runner, [picture(7)])
    whole = logits_of(make_vision_engine(), prompt, n=2)
    one_by_one = logits_of(make_vision_engine(max_step_tokens=1, min_chunk=1), prompt, n=2)  # a chunk of one placeholder
    mean_kl, agree = compare(whole, one_by_one)
    assert mean_kl < 0.05 and all(agree), (mean_kl, agree)


def test_a_follow_up_about_the_same_picture_is_not_encoded_again_and_finds_its_cells(vision_runner,
                                                                                    make_vision_engine):
    vision = vision_runner.vision
    engine = make_vision_engine(prompt_cache=True)
    pic = picture(11)
    first_logits(engine, image_prompt(vision_runner, [pic]), member="bob")
    encodes = vision.encodes
    finish, _ = first_logits(engine, image_prompt(vision_runner, [pic], "And what colour is it?"), member="bob")
    assert vision.encodes == encodes  # kept by its content hash
    tokens = vision_runner.tokenize(image_prompt(vision_runner, [pic]))
    (_, end), = tokens.images
    vision_runner.release_images(tokens.holder)
    assert finish.stats.cached_tokens >= end  # the prompt cache held the image's cells
    # another member's request reads its own: never another's cells
    other, _ = first_logits(engine, image_prompt(vision_runner, [pic], "And what colour is it?"), member="carol")
    assert other.stats.cached_tokens < end


def test_a_refused_request_lets_its_images_go(vision_runner, make_vision_engine):
    engine = make_vision_engine()
    with pytest.raises(InvalidRequest):
        engine.submit(image_prompt(vision_runner, [picture(5)]), lane="chat", member="alice",
                      params=SamplingParams(max_tokens=0))
    assert not vision_runner.vision._held  # at once: it was never queued


def test_a_preempted_image_request_reads_its_picture_again_alike(vision_runner, make_vision_engine):
    prompt = image_prompt(vision_runner, [picture(6)])
    alone = logits_of(make_vision_engine(), prompt)
    engine = make_vision_engine(max_step_tokens=8)
    stream = engine.submit(prompt, lane="chat", member="alice",
                           params=SamplingParams(temperature=0, max_tokens=4, record_logits=True))
    request = stream.request
    with engine.lock:  # preempt it mid-read, once some of it is in the cache
        while request.num_computed_tokens < 12 and not request.output_tokens:
            engine.lock.wait(0.01)
        if not request.output_tokens:
            engine.scheduler._preempt(request, None)
    assert isinstance(list(stream)[-1], FinishEvent)
    mean_kl, agree = compare(alone, [s.logits for s in request.samples])
    assert mean_kl < 0.05 and all(agree), (mean_kl, agree)


def test_doctor_says_whether_images_are_understood(tmp_path):
    from homeai import doctor
    from homeai.bench.random_mmproj import write_for_model
    from homeai.config import from_dict
    from homeai.models import embedded_gguf

    assert "not understood" in doctor.facts(from_dict({}))["images"]
    proj = tmp_path / "mmproj.gguf"
    write_for_model(proj, embedded_gguf())
    said = doctor.facts(from_dict({"model": {"mmproj": str(proj)}}))["images"]
    assert said.startswith("understood") and "mlp projector" in said and "64 px" in said
    assert "images" in doctor.render(doctor.facts(from_dict({"model": {"mmproj": str(proj)}})))


def test_a_projector_for_another_model_stops_the_start(tmp_path):
    from homeai.bench.random_mmproj import write_mmproj
    from homeai.llama import RunnerError
    from homeai.app import load_runner
    from tests.conftest import small_config

    proj = tmp_path / "mmproj-64.gguf"
    write_mmproj(proj, 64)  # the tiny shape's width, not SmolLM2's 576
    with pytest.raises(RunnerError, match="could not load the projector"):
        load_runner(small_config(mmproj=str(proj)), embeddings=False, grammar=False)
