"""A member's chat conversations, their messages and the images sent with them.

Every query is scoped by `member_id`: a conversation that is not the member's reads as
missing (None or False), never as someone else's. Every write commits.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload, undefer

from homeai.store.models import Conversation, Message, MessageImage, utcnow

MESSAGE_ROLES = ("system", "user", "assistant", "tool")
MAX_TITLE_LEN = 200


def list_conversations(session: Session, *, member_id: int) -> list[Conversation]:
    """The member's conversations, most recently updated first (messages not loaded)."""
    query = (select(Conversation).where(Conversation.member_id == member_id)
             .order_by(Conversation.updated_at.desc(), Conversation.id.desc()))
    return list(session.scalars(query))


def create_conversation(session: Session, *, member_id: int, title: str) -> Conversation:
    now = utcnow()
    conversation = Conversation(member_id=member_id, title=_clean_title(title),
                                created_at=now, updated_at=now)
    session.add(conversation)
    session.commit()
    return conversation


def get_conversation(session: Session, *, member_id: int, conversation_id: int) -> Conversation | None:
    """The conversation with its messages in order, or None when it is not the member's."""
    return _owned(session, member_id, conversation_id, with_messages=True)


def rename_conversation(session: Session, *, member_id: int, conversation_id: int,
                        title: str) -> Conversation | None:
    conversation = _owned(session, member_id, conversation_id)
    if conversation is None:
        return None
    conversation.title = _clean_title(title)
    conversation.updated_at = utcnow()
    session.commit()
    return conversation


def delete_conversation(session: Session, *, member_id: int, conversation_id: int) -> bool:
    conversation = _owned(session, member_id, conversation_id)
    if conversation is None:
        return False
    session.delete(conversation)
    session.commit()
    return True


def add_message(session: Session, *, member_id: int, conversation_id: int, role: str, content: str,
                prompt_tokens: int | None = None, output_tokens: int | None = None,
                images: Sequence[tuple[str, bytes]] = ()) -> Message | None:
    """Append a message (with its images, (media type, file) each) and bump the conversation's
    updated_at; None when not the member's."""
    if role not in MESSAGE_ROLES:
        raise ValueError(f"message role must be one of {', '.join(MESSAGE_ROLES)}, got {role!r}")
    conversation = _owned(session, member_id, conversation_id)
    if conversation is None:
        return None
    now = utcnow()
    message = Message(conversation=conversation, role=role, content=content, created_at=now,
                      prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                      images=[MessageImage(position=i, media_type=t, data=d) for i, (t, d) in enumerate(images)])
    session.add(message)
    conversation.updated_at = now
    session.commit()
    return message


def get_image(session: Session, *, member_id: int, conversation_id: int, message_id: int,
              position: int) -> MessageImage | None:
    """One image of a message, its bytes loaded; None when it is not in the member's conversation."""
    query = (select(MessageImage).join(Message).join(Conversation).options(undefer(MessageImage.data))
             .where(MessageImage.message_id == message_id, MessageImage.position == position,
                    Message.conversation_id == conversation_id, Conversation.member_id == member_id))
    return session.scalar(query)


def image_files(session: Session, messages: Sequence[Message], *, latest: int | None = None) -> dict[int, list[bytes]]:
    """The files of the images of `messages` (the member's, read through `get_conversation`), by
    message id, each message's in order; only the `latest` images of them all when given."""
    ids = [m.id for m in messages if m.images]
    if not ids or latest == 0:
        return {}
    query = (select(MessageImage.message_id, MessageImage.data).where(MessageImage.message_id.in_(ids))
             .order_by(MessageImage.message_id.desc(), MessageImage.position.desc()).limit(latest))
    files: dict[int, list[bytes]] = {}
    for message_id, data in reversed(session.execute(query).all()):
        files.setdefault(message_id, []).append(data)
    return files


def _owned(session: Session, member_id: int, conversation_id: int,
           with_messages: bool = False) -> Conversation | None:
    query = select(Conversation).where(Conversation.id == conversation_id,
                                       Conversation.member_id == member_id)
    if with_messages:
        query = query.options(selectinload(Conversation.messages))
    return session.scalar(query)


def _clean_title(title: str) -> str:
    # Titles are often the first words of a message: keep them one line and bounded.
    return " ".join(title.split())[:MAX_TITLE_LEN] or "New conversation"
