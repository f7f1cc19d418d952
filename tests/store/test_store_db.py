"""Engine settings on SQLite (WAL, foreign keys, cascades) and UTC timestamps."""

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, StatementError

from homeai.store import conversations, members
from homeai.store.models import Chunk, Conversation, Document, Member, Message, Token


def test_sqlite_uses_wal_and_foreign_keys(engine):
    with engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert c.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_every_pooled_connection_has_foreign_keys(engine):
    with engine.connect() as a, engine.connect() as b:
        assert a.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert b.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def add_member_with_history(session) -> int:
    member, _ = members.add_member(session, name="alice")
    conv = conversations.create_conversation(session, member_id=member.id, title="t")
    conversations.add_message(session, member_id=member.id, conversation_id=conv.id, role="user", content="hi")
    return member.id


def counts(session) -> dict[str, int]:
    return {m.__tablename__: session.scalar(sa.select(sa.func.count()).select_from(m))
            for m in (Member, Token, Conversation, Message)}


def test_deleting_a_member_in_sql_cascades(session):
    member_id = add_member_with_history(session)
    assert counts(session) == {"members": 1, "tokens": 1, "conversations": 1, "messages": 1}
    session.execute(sa.delete(Member).where(Member.id == member_id))
    session.commit()
    assert counts(session) == {"members": 0, "tokens": 0, "conversations": 0, "messages": 0}


def test_remove_member_cascades(session):
    add_member_with_history(session)
    members.remove_member(session, name="alice")
    assert counts(session) == {"members": 0, "tokens": 0, "conversations": 0, "messages": 0}


def test_foreign_keys_reject_orphans(session):
    session.add(Token(member_id=999, token_hash="0" * 64, prefix="hai_x"))
    with pytest.raises(IntegrityError):
        session.commit()


def test_deleting_a_document_cascades_to_chunks(session):
    doc = Document(path="/a.txt", content_hash="h", size=1, mtime=1.0, status="indexed",
                   chunks=[Chunk(ordinal=0, text="a", start_char=0, end_char=1)])
    session.add(doc)
    session.commit()
    session.execute(sa.delete(Document))
    session.commit()
    assert session.scalar(sa.select(sa.func.count()).select_from(Chunk)) == 0


def test_timestamps_come_back_aware_in_utc(new_session):
    paris = timezone(timedelta(hours=2))
    with new_session() as s:
        member, _ = members.add_member(s, name="alice")
        member.created_at = datetime(2025, 6, 1, 12, 0, tzinfo=paris)
        s.commit()
    with new_session() as s:
        loaded = s.scalar(sa.select(Member))
        assert loaded.created_at == datetime(2025, 6, 1, 10, 0, tzinfo=timezone.utc)
        assert loaded.created_at.utcoffset() == timedelta(0)
        assert loaded.tokens[0].created_at.tzinfo is not None


def test_naive_timestamps_are_refused(session):
    member, _ = members.add_member(session, name="alice")
    member.created_at = datetime(2025, 6, 1, 12, 0)
    with pytest.raises(StatementError, match="naive datetime"):
        session.commit()
