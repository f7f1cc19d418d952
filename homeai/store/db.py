"""Database plumbing: engines, sessions and schema migrations for the household store.

`make_engine(url)` builds an engine for any SQLAlchemy URL (SQLite gets WAL, foreign keys
and a created parent directory); `make_sessionmaker(engine)` the sessions the queries take;
`migrate(url_or_engine)` brings the schema to the newest Alembic revision, with no
alembic.ini on disk. The server calls `migrate(cfg.database_url)` once on start.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def make_engine(url: str) -> Engine:
    """An engine for `url`; SQLite files get their directory, WAL and foreign keys."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(parsed, pool_pre_ping=True)
    _make_parent_dir(parsed.database)
    # The engine thread, the jobs and the request handlers share one file from several threads.
    engine = create_engine(parsed, connect_args={"check_same_thread": False})
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _make_parent_dir(database: str | None) -> None:
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)


def _sqlite_pragmas(dbapi_connection, _connection_record) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets readers (the web chat) proceed while a job or the engine writes.
    cursor.execute("PRAGMA journal_mode=WAL")
    # SQLite ignores ON DELETE CASCADE unless each connection asks for it.
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """Sessions whose objects stay readable after commit (routes return them after closing)."""
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config() -> AlembicConfig:
    """An Alembic config built in code: the migrations ship inside the package."""
    cfg = AlembicConfig()
    # ConfigParser would read a '%' in the install path as interpolation.
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    return cfg


def migrate(target: str | Engine, *, revision: str = "head") -> None:
    """Upgrade the database at `target` (a URL or an engine) to `revision`; a no-op when there."""
    _run(target, lambda cfg: command.upgrade(cfg, revision))


def downgrade(target: str | Engine, *, revision: str) -> None:
    """Downgrade the database at `target` to `revision` ("base" drops every table)."""
    _run(target, lambda cfg: command.downgrade(cfg, revision))


def _run(target: str | Engine, action) -> None:
    engine = make_engine(target) if isinstance(target, str) else target
    try:
        with engine.begin() as connection:
            cfg = alembic_config()
            cfg.attributes["connection"] = connection
            action(cfg)
    finally:
        if engine is not target:
            engine.dispose()


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at; None when it was never migrated."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str:
    """The newest revision this code knows (doctor compares it with `current_revision`)."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()
