"""Migrations: a fresh database, an old schema moved forward, reversibility, portability."""

import secrets

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex, CreateTable

from homeai.store import conversations, members
from homeai.store.db import (
    alembic_config, current_revision, downgrade, head_revision, make_engine, make_sessionmaker, migrate,
)
from homeai.store.models import Base, Member, Token

TABLES_0001 = {"members", "tokens", "conversations", "messages"}
TABLES_0002 = {"documents", "chunks", "job_runs", "request_stats"}
# 0003 on SQLite: the FTS5 index over chunk text and its shadow tables (PostgreSQL gets a GIN index).
SEARCH_0003 = {"chunks_fts", "chunks_fts_config", "chunks_fts_data", "chunks_fts_docsize", "chunks_fts_idx"}
TABLES_0004 = {"member_settings"}
TABLES_0007 = {"message_images"}
HEAD = "0007"  # 0007: message_images, the images sent with household messages
TABLES_HEAD = TABLES_0001 | TABLES_0002 | SEARCH_0003 | TABLES_0004 | TABLES_0007


def table_names(engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names()) - {"alembic_version"}


def test_fresh_database_migrates_to_head(db_url, db_path):
    migrate(db_url)
    assert db_path.is_file()
    engine = make_engine(db_url)
    assert table_names(engine) == TABLES_HEAD
    assert current_revision(engine) == head_revision() == HEAD
    engine.dispose()


def test_never_migrated_database_has_no_revision(db_url):
    engine = make_engine(db_url)
    assert current_revision(engine) is None
    engine.dispose()


def test_migrate_accepts_an_engine(db_url):
    engine = make_engine(db_url)
    migrate(engine)
    assert current_revision(engine) == HEAD
    engine.dispose()


def old_member(s, name: str, *, admin: bool = False) -> tuple[Member, str]:
    """A member as revision 0001 stored one: a row and a token, no settings (the ORM writes only
    tables whose columns have not changed since)."""
    member = Member(name=name, role="admin" if admin else "member")
    token = members.TOKEN_MARK + secrets.token_urlsafe(32)
    member.tokens.append(Token(token_hash=members.hash_token(token), prefix=token[:members.PREFIX_LEN]))
    s.add(member)
    s.commit()
    return member, token


def fill_0001_schema(new_session) -> dict:
    with new_session() as s:
        alice, token = old_member(s, name="alice", admin=True)
        bob, _ = old_member(s, name="bob")
        members.add_token(s, name="bob")
        conv = conversations.create_conversation(s, member_id=alice.id, title="groceries")
        conversations.add_message(s, member_id=alice.id, conversation_id=conv.id, role="user", content="milk?")
        conversations.add_message(s, member_id=alice.id, conversation_id=conv.id, role="assistant",
                                  content="yes", prompt_tokens=5, output_tokens=1)
        return {"alice": alice.id, "bob": bob.id, "conv": conv.id, "token": token}


def count_rows(engine) -> dict[str, int]:
    with engine.connect() as c:
        return {t: c.scalar(sa.select(sa.func.count()).select_from(sa.table(t))) for t in sorted(TABLES_0001)}


def test_old_schema_migrates_forward_without_losing_rows(db_url):
    migrate(db_url, revision="0001")
    engine = make_engine(db_url)
    assert current_revision(engine) == "0001"
    assert table_names(engine) == TABLES_0001
    ids = fill_0001_schema(make_sessionmaker(engine))
    before = count_rows(engine)
    assert before == {"members": 2, "tokens": 3, "conversations": 1, "messages": 2}

    migrate(db_url)

    assert current_revision(engine) == HEAD
    assert table_names(engine) == TABLES_HEAD
    assert count_rows(engine) == before
    with make_sessionmaker(engine)() as s:
        assert members.authenticate(s, ids["token"]).id == ids["alice"]
        conv = conversations.get_conversation(s, member_id=ids["alice"], conversation_id=ids["conv"])
        assert [m.content for m in conv.messages] == ["milk?", "yes"]
    engine.dispose()


def test_members_keep_what_they_had_as_lanes(db_url):
    """0005: every lane stays open to admins, voice to a member whose default lane was voice;
    other members get chat and the background lanes."""
    migrate(db_url, revision="0004")
    engine = make_engine(db_url)
    with make_sessionmaker(engine)() as s:
        ids = {name: old_member(s, name, admin=name == "root")[0].id for name in ("root", "ha", "kid", "bob")}
    settings = sa.table("member_settings", sa.column("member_id"), sa.column("default_lane"))
    with engine.begin() as c:
        c.execute(settings.insert(), [{"member_id": ids["ha"], "default_lane": "voice"},
                                      {"member_id": ids["kid"], "default_lane": "summaries"}])

    migrate(db_url)

    defaults = ("chat", "summaries", "indexing", "embeddings")
    with make_sessionmaker(engine)() as s:
        lanes = {name: members.lanes_of(s, name=name) for name in ids}
        kid = next(m for m in members.list_members(s) if m.name == "kid")
        assert kid.settings.default_lane == "summaries"  # a default lane is kept
    assert lanes == {"root": members.ALL_LANES, "ha": ("voice", *defaults), "kid": defaults, "bob": defaults}
    with engine.connect() as c:  # stored, not inferred: every member who is not an admin has a row
        stored = dict(c.execute(sa.text("SELECT member_id, lanes FROM member_settings")).all())
    assert stored == {ids["ha"]: "voice," + ",".join(defaults), ids["kid"]: ",".join(defaults),
                      ids["bob"]: ",".join(defaults)}
    engine.dispose()


def sqlite_schema(engine) -> list[tuple]:
    with engine.connect() as c:
        return c.exec_driver_sql("SELECT type, name, sql FROM sqlite_master ORDER BY name").all()


def test_migrate_twice_is_a_no_op(db_url):
    migrate(db_url)
    engine = make_engine(db_url)
    ids = fill_0001_schema(make_sessionmaker(engine))
    schema_before = sqlite_schema(engine)
    rows_before = count_rows(engine)

    migrate(db_url)

    assert current_revision(engine) == HEAD
    with engine.connect() as c:
        assert c.scalar(sa.text("SELECT count(*) FROM alembic_version")) == 1
    assert sqlite_schema(engine) == schema_before
    assert count_rows(engine) == rows_before
    with make_sessionmaker(engine)() as s:
        assert members.authenticate(s, ids["token"]) is not None
    engine.dispose()


def test_downgrades_are_reversible(db_url):
    migrate(db_url)
    engine = make_engine(db_url)
    fill_0001_schema(make_sessionmaker(engine))

    downgrade(db_url, revision="0001")
    assert current_revision(engine) == "0001"
    assert table_names(engine) == TABLES_0001
    assert count_rows(engine)["members"] == 2

    downgrade(db_url, revision="base")
    assert table_names(engine) == set()

    migrate(db_url)
    assert table_names(engine) == TABLES_HEAD
    engine.dispose()


def test_migrations_create_exactly_the_models(engine):
    with engine.connect() as c:
        # The full-text index is a virtual table the models do not (and cannot) declare.
        context = MigrationContext.configure(c, opts={
            "compare_type": True, "include_name": lambda name, kind, _: name not in SEARCH_0003})
        assert compare_metadata(context, Base.metadata) == []


def test_migrations_render_for_postgresql(capsys):
    cfg = alembic_config()
    cfg.set_main_option("sqlalchemy.url", "postgresql://")
    command.upgrade(cfg, "head", sql=True)
    sql = capsys.readouterr().out
    for table in TABLES_0001 | TABLES_0002:
        assert f"CREATE TABLE {table} (" in sql
    assert "TIMESTAMP WITH TIME ZONE" in sql
    assert "BYTEA" in sql
    assert "ON DELETE CASCADE" in sql
    assert "USING gin (to_tsvector('simple', text))" in sql
    assert "sqlite" not in sql.lower()


def test_models_compile_for_postgresql():
    dialect = postgresql.dialect()
    for table in Base.metadata.sorted_tables:
        assert str(CreateTable(table).compile(dialect=dialect)).startswith(f"\nCREATE TABLE {table.name}")
        for index in table.indexes:
            CreateIndex(index).compile(dialect=dialect)
