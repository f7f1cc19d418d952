"""Images stored with messages (issue 53): kept in order with their media type, read only by the
member whose conversation holds them, listed without their bytes, gone with their message."""

import sqlalchemy as sa
from sqlalchemy import inspect

from homeai.store import conversations as convs
from homeai.store import members
from homeai.store.models import MessageImage

PNG, JPEG = b"\x89PNG\r\n\x1a\n-png-", b"\xff\xd8\xff-jpeg-"


def stored(new_session):
    with new_session() as s:
        alice = members.add_member(s, name="alice")[0].id
        bob = members.add_member(s, name="bob")[0].id
        conv = convs.create_conversation(s, member_id=alice, title="porch")
        message = convs.add_message(s, member_id=alice, conversation_id=conv.id, role="user", content="who?",
                                    images=[("image/png", PNG), ("image/jpeg", JPEG)])
        plain = convs.add_message(s, member_id=alice, conversation_id=conv.id, role="assistant", content="a cat")
        assert [(i.position, i.media_type) for i in message.images] == [(0, "image/png"), (1, "image/jpeg")]
        assert plain.images == []
        return alice, bob, conv.id, message.id


def test_images_come_back_in_order_for_their_member_only(new_session):
    alice, bob, conv, message = stored(new_session)
    with new_session() as s:
        got = convs.get_conversation(s, member_id=alice, conversation_id=conv)
        listed = got.messages[0].images
        assert [i.media_type for i in listed] == ["image/png", "image/jpeg"]
        assert all("data" in inspect(i).unloaded for i in listed)  # listing reads no file
        assert convs.image_files(s, got.messages) == {message: [PNG, JPEG]}
        assert convs.image_files(s, got.messages, latest=1) == {message: [JPEG]}
        assert convs.image_files(s, got.messages, latest=0) == {}
        image = convs.get_image(s, member_id=alice, conversation_id=conv, message_id=message, position=1)
        assert (image.media_type, image.data) == ("image/jpeg", JPEG)
        assert convs.get_image(s, member_id=alice, conversation_id=conv, message_id=message, position=2) is None
        assert convs.get_image(s, member_id=alice, conversation_id=conv + 1, message_id=message, position=0) is None
        assert convs.get_image(s, member_id=bob, conversation_id=conv, message_id=message, position=0) is None


def test_images_go_with_their_conversation(new_session, engine):
    alice, _, conv, _ = stored(new_session)
    with new_session() as s:
        assert convs.delete_conversation(s, member_id=alice, conversation_id=conv)
    with engine.connect() as c:
        assert c.scalar(sa.select(sa.func.count()).select_from(MessageImage)) == 0
