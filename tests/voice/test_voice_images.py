"""An image with a spoken question on the voice socket (issue 53): `input_image` (a data URL) is read and
checked at once (`image.ready`, or an `error` naming it), then asked about with the next utterance, and kept
with the stored question. Real speech in (espeak-ng), SmolLM2 with a random-weight projector
(`vision_runner`: the answer is noise, its prompt really holds the picture's 16 tokens).

Run: .venv/bin/python -m pytest tests/voice/test_voice_images.py
"""

from __future__ import annotations

import base64

import pytest
from sqlalchemy import select

from homeai.store.conversations import create_conversation, get_conversation
from homeai.store.db import make_engine, make_sessionmaker
from homeai.store.members import DEFAULT_MEMBER
from homeai.store.models import Member
from tests.api.conftest import api_config
from tests.api.test_vision import IMAGE_TOKENS, png
from tests.voice.conftest import poll, serve, voice_client

pytestmark = [pytest.mark.model, pytest.mark.anyio]


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, lanes={"voice": {"max_tokens": 8}})


@pytest.fixture(scope="module")
def server(cfg, vision_runner, stt):
    with serve(cfg, vision_runner, stt) as running:
        yield running


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


async def test_a_snapshot_with_a_spoken_question_is_read_and_kept(cfg, server, utterance):
    engine = make_engine(cfg.database_url)
    sessions = make_sessionmaker(engine)
    try:
        with sessions() as session:
            member_id = session.scalar(select(Member.id).where(Member.name == DEFAULT_MEMBER))
            with_image = create_conversation(session, member_id=member_id, title="porch").id
            without = create_conversation(session, member_id=member_id, title="kitchen").id
        async with voice_client(server) as client:
            await client.start(conversation_id=with_image)
            await client.send(type="input_image", image=data_url(png(21)))
            assert await client.event() == {"type": "image.ready", "images": 1}
            events = await client.ask(utterance.raw_16k)
            assert events[-1]["type"] == "response.done", events[-2:]
            await client.start(conversation_id=without)
            assert (await client.ask(utterance.raw_16k))[-1]["type"] == "response.done"

        def stored(conversation_id):
            with sessions() as session:
                return [(m.role, m.prompt_tokens, len(m.images)) for m in get_conversation(
                    session, member_id=member_id, conversation_id=conversation_id).messages]
        assert await poll(lambda: len(stored(with_image)) == 2 and len(stored(without)) == 2)
        (_, _, kept), (_, seen, _) = stored(with_image)
        (_, _, _), (_, heard_only, _) = stored(without)
        assert kept == 1  # the picture is kept with the stored question
        assert seen - heard_only in (IMAGE_TOKENS + 1, IMAGE_TOKENS + 2)  # its tokens and its newline
    finally:
        engine.dispose()


async def test_a_bad_image_is_an_error_at_once_and_the_socket_goes_on(server, utterance):
    async with voice_client(server) as client:
        await client.start()
        await client.send(type="input_image", image="https://example.com/porch.jpg")
        error = await client.error("invalid_image")
        assert "not fetched" in error["message"] and error["param"] == "image"
        await client.send(type="input_image", image=data_url(b"GIF89a broken"))
        await client.error("invalid_image")
        await client.send(type="input_image")
        await client.error("invalid_image")
        for i in range(4):
            await client.send(type="input_image", image=data_url(png(30 + i)))
            assert (await client.event())["images"] == i + 1
        await client.send(type="input_image", image=data_url(png(40)))
        assert "max_images" in (await client.error("too_many_images"))["message"]
        assert (await client.ask(utterance.raw_16k))[-1]["type"] == "response.done"


async def test_a_model_without_a_projector_refuses_an_image_on_the_socket(runner, stt, module_tmp, utterance):
    (module_tmp / "blind").mkdir(exist_ok=True)
    with serve(api_config(module_tmp / "blind"), runner, stt) as blind:
        async with voice_client(blind) as client:
            await client.start()
            await client.send(type="input_image", image=data_url(png(1)))
            assert "cannot read images" in (await client.error("images_unsupported"))["message"]
