"""A full-text index over chunk text, for hybrid search.

On SQLite: an FTS5 table `chunks_fts` over `chunks.text` (external content, so the text is
stored once), kept in step with `chunks` by triggers. Because the triggers fire inside
the statement that writes a chunk (a foreign-key cascade from `documents` included), the
index can never disagree with the chunks it covers, even after a crash mid-transaction.
On PostgreSQL: a GIN index on `to_tsvector('simple', text)`. Other backends get nothing
(search falls back to a plain LIKE scan there).

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

SQLITE_UP = [
    # porter: "lanterns" finds "lantern"; remove_diacritics: "ete" finds "été".
    "CREATE VIRTUAL TABLE chunks_fts USING fts5(text, content='chunks', content_rowid='id', "
    "tokenize='porter unicode61 remove_diacritics 2')",
    "CREATE TRIGGER chunks_fts_insert AFTER INSERT ON chunks BEGIN "
    "INSERT INTO chunks_fts(rowid, text) VALUES (new.id, new.text); END",
    "CREATE TRIGGER chunks_fts_delete AFTER DELETE ON chunks BEGIN "
    "INSERT INTO chunks_fts(chunks_fts, rowid, text) VALUES ('delete', old.id, old.text); END",
    "CREATE TRIGGER chunks_fts_update AFTER UPDATE OF text ON chunks BEGIN "
    "INSERT INTO chunks_fts(chunks_fts, rowid, text) VALUES ('delete', old.id, old.text); "
    "INSERT INTO chunks_fts(rowid, text) VALUES (new.id, new.text); END",
    "INSERT INTO chunks_fts(chunks_fts) VALUES ('rebuild')",  # chunks written before this revision
]
SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS chunks_fts_update",
    "DROP TRIGGER IF EXISTS chunks_fts_delete",
    "DROP TRIGGER IF EXISTS chunks_fts_insert",
    "DROP TABLE IF EXISTS chunks_fts",
]
POSTGRES_UP = ["CREATE INDEX ix_chunks_text_tsv ON chunks USING gin (to_tsvector('simple', text))"]
POSTGRES_DOWN = ["DROP INDEX IF EXISTS ix_chunks_text_tsv"]


def _dialect() -> str:
    return op.get_context().dialect.name  # works offline (--sql) as well as online


def upgrade() -> None:
    for statement in {"sqlite": SQLITE_UP, "postgresql": POSTGRES_UP}.get(_dialect(), []):
        op.execute(statement)


def downgrade() -> None:
    for statement in {"sqlite": SQLITE_DOWN, "postgresql": POSTGRES_DOWN}.get(_dialect(), []):
        op.execute(statement)
