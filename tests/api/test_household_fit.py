"""A household conversation is answered from its latest turns: however many messages it holds,
no message count refuses it (the OpenAI route's `server.max_messages` is for one request's body).

Run: .venv/bin/python -m pytest tests/api/test_household_fit.py
"""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import select

from homeai.store.conversations import add_message, create_conversation
from homeai.store.db import make_engine, make_sessionmaker
from homeai.store.members import DEFAULT_MEMBER
from homeai.store.models import Member
from tests.api.conftest import TIMEOUT, api_config

pytestmark = pytest.mark.model

MAX_MESSAGES = 4


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, server={"max_messages": MAX_MESSAGES})


def conversation_of(cfg, num_messages: int) -> int:
    engine = make_engine(cfg.database_url)
    try:
        with make_sessionmaker(engine)() as session:
            member_id = session.scalar(select(Member.id).where(Member.name == DEFAULT_MEMBER))
            cid = create_conversation(session, member_id=member_id, title="notes").id
            for i in range(num_messages):
                add_message(session, member_id=member_id, conversation_id=cid, role=("user", "assistant")[i % 2],
                            content=f"The blue box is on shelf {i}.")
            return cid
    finally:
        engine.dispose()


def test_more_messages_than_a_request_may_hold_are_answered(cfg, server):
    cid = conversation_of(cfg, 3 * MAX_MESSAGES)
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        with http.stream("POST", f"/api/conversations/{cid}/messages",
                         json={"content": "Where is the blue box?", "max_tokens": 8, "temperature": 0}) as r:
            assert r.status_code == 200, r.read()
            events = [json.loads(line.removeprefix("data: ")) for line in r.iter_lines() if line]
        # The OpenAI route refuses the same number of messages in one body.
        messages = [{"role": "user", "content": "hi"}] * (3 * MAX_MESSAGES + 2)
        refused = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    done = events[-1]
    assert done["type"] == "response.done" and done["finish_reason"] in ("stop", "length"), done
    assert done["usage"]["prompt_tokens"] > 3 * MAX_MESSAGES * 8  # the turns were in the prompt
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "too_many_messages"
