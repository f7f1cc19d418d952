"""Conversations and messages, scoped so a member never reaches another's."""

from datetime import datetime, timezone

import pytest

from homeai.store import conversations as convs
from homeai.store import members


@pytest.fixture
def alice(session):
    return members.add_member(session, name="alice")[0].id


@pytest.fixture
def bob(session):
    return members.add_member(session, name="bob")[0].id


def test_create_list_get_rename_delete(session, alice):
    first = convs.create_conversation(session, member_id=alice, title="recipes")
    second = convs.create_conversation(session, member_id=alice, title="homework")
    assert first.created_at == first.updated_at
    assert [c.id for c in convs.list_conversations(session, member_id=alice)] == [second.id, first.id]

    renamed = convs.rename_conversation(session, member_id=alice, conversation_id=first.id, title="soups")
    assert renamed.title == "soups"
    assert convs.get_conversation(session, member_id=alice, conversation_id=first.id).title == "soups"

    assert convs.delete_conversation(session, member_id=alice, conversation_id=first.id) is True
    assert convs.get_conversation(session, member_id=alice, conversation_id=first.id) is None
    assert [c.id for c in convs.list_conversations(session, member_id=alice)] == [second.id]


def test_messages_come_back_in_order_with_token_counts(new_session, alice):
    with new_session() as s:
        conv = convs.create_conversation(s, member_id=alice, title="t")
        for i, role in enumerate(["system", "user", "assistant", "user"]):
            convs.add_message(s, member_id=alice, conversation_id=conv.id, role=role, content=f"m{i}",
                              prompt_tokens=10 * i, output_tokens=i)
    with new_session() as s:
        loaded = convs.get_conversation(s, member_id=alice, conversation_id=conv.id)
        assert [(m.role, m.content, m.prompt_tokens, m.output_tokens) for m in loaded.messages] == [
            ("system", "m0", 0, 0), ("user", "m1", 10, 1), ("assistant", "m2", 20, 2), ("user", "m3", 30, 3)]


def test_add_message_bumps_updated_at_and_reorders(session, alice):
    old = datetime(2020, 1, 1, tzinfo=timezone.utc)
    first = convs.create_conversation(session, member_id=alice, title="first")
    first.updated_at = old
    session.commit()
    convs.create_conversation(session, member_id=alice, title="second")
    message = convs.add_message(session, member_id=alice, conversation_id=first.id, role="user", content="hi")
    assert first.updated_at == message.created_at > old
    assert convs.list_conversations(session, member_id=alice)[0].id == first.id


def test_unknown_role_is_refused(session, alice):
    conv = convs.create_conversation(session, member_id=alice, title="t")
    with pytest.raises(ValueError, match="role"):
        convs.add_message(session, member_id=alice, conversation_id=conv.id, role="robot", content="x")


def test_titles_are_one_bounded_line(session, alice):
    conv = convs.create_conversation(session, member_id=alice, title="  what\nabout   " + "x" * 300)
    assert conv.title.startswith("what about xxx") and len(conv.title) == convs.MAX_TITLE_LEN
    assert convs.create_conversation(session, member_id=alice, title=" ").title == "New conversation"


def test_member_cannot_reach_another_members_conversation(session, alice, bob):
    conv = convs.create_conversation(session, member_id=alice, title="private")
    convs.add_message(session, member_id=alice, conversation_id=conv.id, role="user", content="secret")

    assert convs.list_conversations(session, member_id=bob) == []
    assert convs.get_conversation(session, member_id=bob, conversation_id=conv.id) is None
    assert convs.rename_conversation(session, member_id=bob, conversation_id=conv.id, title="mine") is None
    assert convs.delete_conversation(session, member_id=bob, conversation_id=conv.id) is False
    assert convs.add_message(session, member_id=bob, conversation_id=conv.id, role="user", content="hi") is None

    session.expire_all()
    kept = convs.get_conversation(session, member_id=alice, conversation_id=conv.id)
    assert kept.title == "private"
    assert [m.content for m in kept.messages] == ["secret"]


def test_missing_conversation_reads_as_missing(session, alice):
    assert convs.get_conversation(session, member_id=alice, conversation_id=12345) is None
    assert convs.delete_conversation(session, member_id=alice, conversation_id=12345) is False
    assert convs.add_message(session, member_id=alice, conversation_id=12345, role="user", content="x") is None
