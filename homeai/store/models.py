"""The household store's tables as SQLAlchemy 2.0 mapped classes.

Members and their API tokens; conversations, messages and the images sent with them; indexed documents and their
chunks; background job runs; per-request statistics. The schema is portable (SQLite and
PostgreSQL); the migrations in `migrations/versions/` create exactly these tables.
Timestamps are timezone-aware UTC in and out, whatever the backend stores.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    JSON, BigInteger, Boolean, CheckConstraint, DateTime, Float, ForeignKey, Index, Integer, LargeBinary,
    MetaData, String, Text, TypeDecorator, UniqueConstraint, false,
)
from sqlalchemy.ext.mutable import MutableList
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

ROLES = ("admin", "member")
DOCUMENT_STATUSES = ("indexed", "skipped", "pending")
JOB_STATUSES = ("running", "done", "failed", "interrupted")
IMAGE_MEDIA_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif", "image/bmp")  # what the model reads

# Deterministic constraint names, so later migrations can drop or alter them by name.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator):
    """A timezone-aware UTC datetime on every backend (SQLite drops the offset)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware one")
        return value.astimezone(timezone.utc)

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


def _one_of(column: str, values: tuple[str, ...]) -> CheckConstraint:
    allowed = ", ".join(f"'{v}'" for v in values)
    return CheckConstraint(f"{column} IN ({allowed})", name=column)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Member(Base):
    __tablename__ = "members"
    __table_args__ = (_one_of("role", ROLES),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16), default="member")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    tokens: Mapped[list[Token]] = relationship(
        back_populates="member", cascade="all, delete-orphan", passive_deletes=True, order_by="Token.id")
    settings: Mapped[MemberSettings | None] = relationship(cascade="all, delete-orphan", passive_deletes=True)

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def active_prefixes(self) -> list[str]:
        return [t.prefix for t in self.tokens if t.revoked_at is None]


class MemberSettings(Base):
    """A member's default lane, the lanes they may use and whether they are a trusted proxy, beside
    the row authentication reads (every member who is not an admin has a row)."""

    __tablename__ = "member_settings"

    member_id: Mapped[int] = mapped_column(ForeignKey("members.id", ondelete="CASCADE"), primary_key=True)
    default_lane: Mapped[str | None] = mapped_column(String(16))  # None: each endpoint's own default
    # The lanes the member may use, comma-separated ("chat,summaries,indexing,embeddings"); None for
    # an admin, who may use every lane (`homeai.store.members.allowed_lanes`).
    lanes: Mapped[str | None] = mapped_column(String(128))
    # A trusted proxy (Open WebUI): its users, named by `[clients] proxy_user_header`, are shared fairly
    # as keys of their own (`homeai.service.clients`); anyone else's header is ignored.
    proxy: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class Token(Base):
    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    member_id: Mapped[int] = mapped_column(ForeignKey("members.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    member: Mapped[Member] = relationship(back_populates="tokens")


class Conversation(Base):
    __tablename__ = "conversations"
    __table_args__ = (Index("ix_conversations_member_id_updated_at", "member_id", "updated_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    member_id: Mapped[int] = mapped_column(ForeignKey("members.id", ondelete="CASCADE"))
    title: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    messages: Mapped[list[Message]] = relationship(
        back_populates="conversation", cascade="all, delete-orphan", passive_deletes=True,
        order_by="Message.id")


class Message(Base):
    __tablename__ = "messages"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    conversation_id: Mapped[int] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    output_tokens: Mapped[int | None] = mapped_column(Integer)

    conversation: Mapped[Conversation] = relationship(back_populates="messages")
    # Loaded with the message (a second query, for all messages at once), without their bytes.
    images: Mapped[list[MessageImage]] = relationship(
        cascade="all, delete-orphan", passive_deletes=True, order_by="MessageImage.position", lazy="selectin")


class MessageImage(Base):
    """An image a member sent with a message (issue 53): the file as it came, read again each time
    the conversation is answered."""

    __tablename__ = "message_images"
    __table_args__ = (UniqueConstraint("message_id", "position"), _one_of("media_type", IMAGE_MEDIA_TYPES))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    message_id: Mapped[int] = mapped_column(ForeignKey("messages.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)  # its place among the message's images, from 0
    media_type: Mapped[str] = mapped_column(String(16))
    # Deferred: listing a conversation's images reads no file; answering it reads them (undefer).
    data: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)


class Document(Base):
    __tablename__ = "documents"
    __table_args__ = (_one_of("status", DOCUMENT_STATUSES),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    path: Mapped[str] = mapped_column(String(4096), unique=True)
    content_hash: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    mtime: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    skip_reason: Mapped[str | None] = mapped_column(Text)
    summary: Mapped[str | None] = mapped_column(Text)
    indexed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    chunks: Mapped[list[Chunk]] = relationship(
        back_populates="document", cascade="all, delete-orphan", passive_deletes=True,
        order_by="Chunk.ordinal")


class Chunk(Base):
    __tablename__ = "chunks"
    __table_args__ = (UniqueConstraint("document_id", "ordinal"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    document_id: Mapped[int] = mapped_column(ForeignKey("documents.id", ondelete="CASCADE"))
    ordinal: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    start_char: Mapped[int] = mapped_column(Integer)
    end_char: Mapped[int] = mapped_column(Integer)
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary)  # float32, native byte order

    document: Mapped[Document] = relationship(back_populates="chunks")


class JobRun(Base):
    __tablename__ = "job_runs"
    __table_args__ = (
        _one_of("status", JOB_STATUSES),
        Index("ix_job_runs_job_name_started_at", "job_name", "started_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_name: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="running")
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    items_done: Mapped[int] = mapped_column(Integer, default=0)
    items_total: Mapped[int | None] = mapped_column(Integer)
    current_item: Mapped[str | None] = mapped_column(Text)
    # MutableList so that `run.errors.append(...)` is noticed and written on flush.
    errors: Mapped[list] = mapped_column(MutableList.as_mutable(JSON), default=list)


class RequestStat(Base):
    __tablename__ = "request_stats"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    request_id: Mapped[str] = mapped_column(String(64))
    lane: Mapped[str] = mapped_column(String(16))
    # The member's name, not a foreign key: statistics outlive a removed member.
    member: Mapped[str | None] = mapped_column(String(64))
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    queue_ms: Mapped[float | None] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    e2e_ms: Mapped[float | None] = mapped_column(Float)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    outcome: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
