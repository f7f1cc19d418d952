"""Images in the household chat (issue 53): a member sends a picture with a message, the conversation
keeps it (stored, served back to its member only), and a follow-up question still sees it; a bad
image, too many and a model without a projector are 400s that store nothing. The projector has random
weights (`vision_runner`): the answers mean nothing, the image's 16 tokens are real.

Run: .venv/bin/python -m pytest tests/api/test_household_images.py
"""

from __future__ import annotations

import base64

import httpx
import pytest
from sqlalchemy import func, select

from homeai.store import conversations as convs
from homeai.store.db import make_engine, make_sessionmaker
from homeai.store.models import Member, MessageImage
from tests.api.conftest import TIMEOUT, add_token, api_config, serve
from tests.api.test_household import answer, bearer, new_conversation
from tests.api.test_vision import IMAGE_TOKENS, data_url, png

pytestmark = pytest.mark.model
pytest.importorskip("gguf")

SHORT = {"max_tokens": 6, "temperature": 0}
QUESTION = "Who is at the door?"
FOLLOW_UP = {"content": "What colour is their coat?", **SHORT}


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, auth={"required": True})


@pytest.fixture(scope="module")
def server(cfg, vision_runner):
    with serve(cfg, vision_runner) as running:
        yield running


@pytest.fixture(scope="module")
def alice(cfg, server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers=bearer(add_token(cfg, "alice"))) as client:
        yield client


@pytest.fixture(scope="module")
def bob(cfg, server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers=bearer(add_token(cfg, "bob"))) as client:
        yield client


@pytest.fixture(scope="module")
def store(cfg, server):
    engine = make_engine(cfg.database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def send(client, cid: int, body: dict) -> list[dict]:
    return answer(client, f"/api/conversations/{cid}/messages", body)


def num_images(store) -> int:
    with store() as session:
        return session.scalar(select(func.count()).select_from(MessageImage))


def test_a_picture_is_answered_stored_and_served_to_its_member_only(alice, bob):
    cid = new_conversation(alice)
    picture = png(1)
    events = send(alice, cid, {"content": QUESTION, "images": [data_url(picture)], **SHORT})
    assert events[0]["type"] == "message.user" and events[-1]["type"] == "response.done"
    assert [i["media_type"] for i in events[0]["message"]["images"]] == ["image/png"]

    messages = alice.get(f"/api/conversations/{cid}").json()["messages"]
    assert len(messages[0]["images"]) == 1 and not any(m["images"] for m in messages[1:])  # the answer has none
    url = messages[0]["images"][0]["url"]
    assert url == f"/api/conversations/{cid}/messages/{messages[0]['id']}/images/0"
    served = alice.get(url)
    assert served.status_code == 200 and served.content == picture
    assert served.headers["content-type"] == "image/png"
    assert served.headers["cache-control"] == "private" and served.headers["x-content-type-options"] == "nosniff"

    assert bob.get(url).status_code == 404
    assert alice.get(url.removesuffix("/0") + "/1").status_code == 404
    assert alice.get(f"/api/conversations/{cid + 1000}/messages/{messages[0]['id']}/images/0").status_code == 404


def test_a_follow_up_still_sees_the_picture(alice, store):
    seen = new_conversation(alice)
    first = send(alice, seen, {"content": QUESTION, "images": [data_url(png(2))], **SHORT})[-1]
    again = answer(alice, f"/api/conversations/{seen}/regenerate", SHORT)[-1]
    assert again["type"] == "response.done"
    assert again["usage"]["prompt_tokens"] == first["usage"]["prompt_tokens"]  # regenerated with the picture

    # the same turns without the picture, written straight into the store
    blind = new_conversation(alice)
    kept = alice.get(f"/api/conversations/{seen}").json()["messages"]
    with store() as session:
        member_id = session.scalar(select(Member.id).where(Member.name == "alice"))
        for m in kept:
            convs.add_message(session, member_id=member_id, conversation_id=blind, role=m["role"], content=m["content"])

    with_picture = send(alice, seen, FOLLOW_UP)[-1]
    without = send(alice, blind, FOLLOW_UP)[-1]
    assert with_picture["type"] == without["type"] == "response.done"
    difference = with_picture["usage"]["prompt_tokens"] - without["usage"]["prompt_tokens"]
    assert difference in (IMAGE_TOKENS + 1, IMAGE_TOKENS + 2)  # the image's tokens, and the newline after its place


def b64(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.mark.parametrize("images, param, words", [
    (["data:image/png;base64,@@@"], "images.0", "base64"),
    ([data_url(png(3)), b64(b"not a picture at all")], "images.1", "not an image"),
    ([b64(png(3)[:60])], "images.0", "corrupt"),
    (["https://example.com/porch.jpg"], "images.0", "remote image URLs are not fetched"),
    ([data_url(png(i)) for i in range(5)], "images", "max_images"),
])
def test_a_bad_image_is_a_400_and_nothing_is_stored(alice, store, images, param, words):
    cid = new_conversation(alice, None)
    before = num_images(store)
    refused = alice.post(f"/api/conversations/{cid}/messages", json={"content": QUESTION, "images": images, **SHORT})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == param and words in error["message"]
    conversation = alice.get(f"/api/conversations/{cid}").json()
    assert conversation["messages"] == [] and conversation["title"] == "New conversation"
    assert num_images(store) == before
    assert alice.post(f"/api/conversations/{cid}/stop").json() == {"stopped": False}  # no answer started


def test_a_model_without_a_projector_refuses_the_picture_and_stores_nothing(runner, module_tmp):
    (module_tmp / "blind").mkdir(exist_ok=True)
    cfg = api_config(module_tmp / "blind")
    with serve(cfg, runner) as server, httpx.Client(base_url=server.url, timeout=TIMEOUT) as client:
        cid = new_conversation(client)
        refused = client.post(f"/api/conversations/{cid}/messages",
                              json={"content": QUESTION, "images": [data_url(png(1))], **SHORT})
        assert refused.status_code == 400 and "cannot read images" in refused.json()["error"]["message"]
        assert client.get(f"/api/conversations/{cid}").json()["messages"] == []
        assert send(client, cid, {"content": QUESTION, **SHORT})[-1]["type"] == "response.done"
