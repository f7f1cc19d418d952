"""Lane names and proxy users, the rules alone (issue 27); the real clients are tests/api/test_lane_names.py.

Run: .venv/bin/python -m pytest tests/service/test_names.py
"""

from __future__ import annotations

import pytest

from homeai.service import ServiceError
from homeai.service.clients import as_user
from homeai.service.names import asked_lane, listed, split
from homeai.service.rights import Caller

LANES = ("voice", "chat", "summaries", "indexing", "embeddings")
MODEL = "SmolLM2-135M-Instruct.Q4_1"


def test_a_lane_suffix_is_split_off_and_nothing_else():
    assert split(f"{MODEL}:summaries", LANES) == (MODEL, "summaries")
    assert split(f"{MODEL}:latest", LANES) == (f"{MODEL}:latest", None)  # a tag, not a lane
    assert split(f"{MODEL}:nowhere", LANES) == (f"{MODEL}:nowhere", None)  # names no model: a 404
    assert split("hf.co/org/repo:Q4_K_M:chat", LANES) == ("hf.co/org/repo:Q4_K_M", "chat")
    assert split(":chat", LANES) == (":chat", None)
    assert split(None, LANES) == (None, None) and split("", LANES) == ("", None)


def test_a_member_is_listed_the_lanes_they_may_use_but_embeddings():
    assert listed(MODEL, LANES, LANES) == [f"{MODEL}:{lane}" for lane in ("voice", "chat", "summaries", "indexing")]
    assert listed(MODEL, LANES, ("chat", "summaries", "embeddings")) == [f"{MODEL}:chat", f"{MODEL}:summaries"]


def test_the_names_lane_is_the_requests_own():
    assert asked_lane("summaries", None, "chat") == "summaries"  # wins over the connection's header
    assert asked_lane("summaries", "summaries", None) == "summaries"
    assert asked_lane(None, "voice", "chat") == "voice" and asked_lane(None, None, "chat") == "chat"
    assert asked_lane(None, None, None) is None
    with pytest.raises(ServiceError) as refused:
        asked_lane("summaries", "chat", None)
    assert refused.value.status_code == 400 and refused.value.code == "lane_conflict"


HEADER = "X-OpenWebUI-User-Id"
OWUI = Caller("owui", False, 3, ("chat", "summaries"), proxy=True)
BOB = Caller("bob", False, 4, ("chat",))


def test_a_proxys_users_are_keys_of_their_own_and_others_headers_are_ignored():
    alice = as_user(OWUI, HEADER, "8c1f3a52-7d0e-4b8e-9a51-2f6c0d9e1b27")
    assert alice.key == "owui/8c1f3a52-7d0e-4b8e-9a51-2f6c0d9e1b27" and alice.lanes == OWUI.lanes
    assert alice.name == "owui"  # rights and messages stay the member's
    assert as_user(OWUI, HEADER, "carol@example.org").key == "owui/carol@example.org"
    assert as_user(OWUI, HEADER, None).key == "owui"  # no header: the member, as before
    assert as_user(OWUI, "", "alice") is OWUI  # the header switched off
    assert as_user(BOB, HEADER, "alice").key == "bob"  # not a proxy: ignored, whatever it says
    assert as_user(BOB, HEADER, "x" * 500).key == "bob"


@pytest.mark.parametrize("value", ["", "x" * 65, "alice bob", "../admin", "alice\u00e9", "a/b", "secret=1"])
def test_a_proxys_bad_user_is_a_400_naming_the_header_not_the_value(value):
    with pytest.raises(ServiceError) as refused:
        as_user(OWUI, HEADER, value)
    error = refused.value
    assert error.status_code == 400 and error.code == "invalid_proxy_user" and error.param == HEADER
    assert HEADER in error.message and (not value or value not in error.message)


def test_the_header_is_configurable_and_checked():
    from homeai.config import ConfigError, from_dict

    assert from_dict({}).clients.proxy_user_header == HEADER
    assert from_dict({"clients": {"proxy_user_header": "X-Forwarded-User"}}).clients.proxy_user_header == "X-Forwarded-User"
    assert from_dict({"clients": {"proxy_user_header": ""}}).clients.proxy_user_header == ""  # nobody's counts
    with pytest.raises(ConfigError, match="clients.proxy_user_header"):
        from_dict({"clients": {"proxy_user_header": "X-User: admin"}})
