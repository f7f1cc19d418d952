"""Images in, as the household's clients send them (issue 53): the `ollama` package's `images` (what
Home Assistant's AI Task sends a camera snapshot with), OpenAI `image_url` data URLs, and every refusal
a clear 400 that harms nothing else. The projector has random weights (`vision_runner`): the answers
mean nothing, the path is real (the image's 16 tokens are read, counted and cached)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
import ollama
import openai
import pytest

from tests.api.conftest import TIMEOUT, add_token, api_config, serve

pytest.importorskip("gguf")
IMAGE_TOKENS = 16  # the random projector's: 64x64 in 16-pixel patches


def png(seed: int, size=(40, 30)) -> bytes:
    from PIL import Image

    rgb = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def server(cfg, vision_runner):
    with serve(cfg, vision_runner) as running:
        yield running


@pytest.fixture(scope="module")
def token(cfg):
    return add_token(cfg, "alice")


@pytest.fixture(scope="module")
def olla(server, token):
    return ollama.Client(host=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def oai(server, token):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=token, timeout=TIMEOUT, max_retries=0) as c:
        yield c


QUESTION = "Is someone at the door?"
SHORT = {"temperature": 0, "num_predict": 6}


def test_the_ollama_client_sends_a_snapshot_and_its_tokens_are_counted(olla):
    seen = olla.chat(model="homeai", messages=[{"role": "user", "content": QUESTION, "images": [png(1)]}], options=SHORT)
    text = olla.chat(model="homeai", messages=[{"role": "user", "content": QUESTION}], options=SHORT)
    assert seen.message.content and seen.done
    # the image's tokens, and the newline after its place (Ollama puts images before the text)
    assert seen.prompt_eval_count - text.prompt_eval_count in (IMAGE_TOKENS + 1, IMAGE_TOKENS + 2)
    generated = olla.generate(model="homeai", prompt=QUESTION, images=[png(1)], options=SHORT)
    assert generated.response and generated.prompt_eval_count == seen.prompt_eval_count


def test_show_says_vision_and_v1_models_says_images(olla, server, token):
    assert "vision" in olla.show("homeai").capabilities
    models = httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT).json()
    generating = [m for m in models["data"] if "modalities" in m]
    assert generating and all(m["modalities"]["vision"] for m in generating)


def test_an_openai_image_url_is_read_and_a_follow_up_finds_it_cached(oai):
    ask = [{"role": "user", "content": [{"type": "text", "text": "Describe this photo."},
                                        {"type": "image_url", "image_url": {"url": data_url(png(2))}}]}]
    first = oai.chat.completions.create(model="homeai", messages=ask, temperature=0, max_tokens=6)
    follow = ask + [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "What colour is it mostly?"}]
    second = oai.chat.completions.create(model="homeai", messages=follow, temperature=0, max_tokens=6)
    assert first.choices[0].message.content
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 8  # the image's cells kept
    plain = oai.chat.completions.create(model="homeai", messages=[{"role": "user", "content": "Describe this photo."}],
                                        temperature=0, max_tokens=1)
    assert first.usage.prompt_tokens - plain.usage.prompt_tokens in (IMAGE_TOKENS + 1, IMAGE_TOKENS + 2)


@pytest.mark.parametrize("url, words", [
    ("https://example.com/porch.jpg", "remote image URLs are not fetched"),
    ("data:image/png;base64," + base64.b64encode(b"not a picture at all").decode(), "not an image"),
    ("data:image/png;base64,@@@", "base64"),
    ("data:image/png;base64," + base64.b64encode(png(3)[:60]).decode(), "corrupt"),
])
def test_a_bad_image_is_a_clear_400(oai, url, words):
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model="homeai", temperature=0, max_tokens=2, messages=[
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}]}])
    assert words in str(refused.value) and "messages.0.content.1.image_url" in str(refused.value)


def test_too_many_images_and_a_bomb_are_refused_and_the_server_goes_on(olla, oai):
    with pytest.raises(ollama.ResponseError) as many:
        olla.chat(model="homeai", messages=[{"role": "user", "content": "hi", "images": [png(i) for i in range(5)]}],
                  options=SHORT)
    assert many.value.status_code == 400 and "max_images" in str(many.value)
    from tests.service.test_images import png_declaring

    with pytest.raises(ollama.ResponseError) as bomb:
        olla.chat(model="homeai", messages=[{"role": "user", "content": "hi",
                                             "images": [png_declaring(100_000, 100_000, num_rows=4)]}], options=SHORT)
    assert bomb.value.status_code == 400 and "decompression bomb" in str(bomb.value)
    assert olla.chat(model="homeai", messages=[{"role": "user", "content": "hi", "images": [png(9)]}],
                     options=SHORT).done


def test_a_model_without_a_projector_refuses_images_saying_so(runner, module_tmp):
    (module_tmp / "blind").mkdir(exist_ok=True)
    cfg = api_config(module_tmp / "blind")
    with serve(cfg, runner) as server:
        client = ollama.Client(host=server.url, headers={"Authorization": f"Bearer {add_token(cfg, 'bob')}"},
                               timeout=TIMEOUT)
        assert "vision" not in client.show("homeai").capabilities
        with pytest.raises(ollama.ResponseError) as refused:
            client.chat(model="homeai", messages=[{"role": "user", "content": QUESTION, "images": [png(1)]}])
        assert refused.value.status_code == 400 and "cannot read images" in str(refused.value)
        assert client.chat(model="homeai", messages=[{"role": "user", "content": QUESTION}], options=SHORT).done


def open_webui(name: str) -> dict:
    """Open WebUI's image chat as its page sends it (tests/fixtures/open_webui/make_image_fixtures.py),
    its 36 tools left out: their 6,600-token prompt outgrows the vision runner's cache (test_open_webui.py
    reads them)."""
    chat = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "open_webui" / name).read_text())
    chat.pop("tools")
    chat["model"] = "homeai"
    return chat


def test_open_webuis_image_messages_are_read_on_both_connections(server, token):
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=TIMEOUT) as http:
        ollama_body = open_webui("ollama_image_chat.json")
        assert ollama_body["messages"][-1]["images"]  # Open WebUI's own conversion: base64 in `images`
        with http.stream("POST", "/api/chat", json=ollama_body) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line]
        last = json.loads(lines[-1])
        text_only = {**ollama_body, "messages": [{k: v for k, v in ollama_body["messages"][-1].items() if k != "images"}],
                     "stream": False}
        plain = http.post("/api/chat", json=text_only).json()
        assert last["done"] and last["prompt_eval_count"] - plain["prompt_eval_count"] in (IMAGE_TOKENS + 1,
                                                                                           IMAGE_TOKENS + 2)
        openai_body = open_webui("openai_image_chat.json")
        assert openai_body["messages"][-1]["content"][1]["type"] == "image_url"
        with http.stream("POST", "/v1/chat/completions", json=openai_body) as r:
            assert r.status_code == 200
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) > 2


def test_the_ollama_clients_recorded_snapshot_body_is_read(server, token):
    """The body the `ollama` package sends with a snapshot, as recorded (tests/fixtures/ollama_client)."""
    recorded = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "ollama_client" / "image_chat.json")
                          .read_text())
    assert isinstance(recorded["messages"][0]["images"][0], str)  # base64, no data: prefix
    r = httpx.post(f"{server.url}/api/chat", json={**recorded, "options": SHORT},
                   headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["done"] and r.json()["prompt_eval_count"] > IMAGE_TOKENS
