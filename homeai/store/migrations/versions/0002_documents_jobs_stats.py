"""Indexed documents and their chunks, background job runs, per-request statistics.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "documents",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("path", sa.String(4096), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("mtime", sa.Float(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("skip_reason", sa.Text(), nullable=True),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.Column("indexed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_documents")),
        sa.UniqueConstraint("path", name=op.f("uq_documents_path")),
        sa.CheckConstraint("status IN ('indexed', 'skipped', 'pending')",
                           name=op.f("ck_documents_status")),
    )
    op.create_table(
        "chunks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("document_id", sa.Integer(), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("start_char", sa.Integer(), nullable=False),
        sa.Column("end_char", sa.Integer(), nullable=False),
        sa.Column("embedding", sa.LargeBinary(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_chunks")),
        sa.ForeignKeyConstraint(["document_id"], ["documents.id"], ondelete="CASCADE",
                                name=op.f("fk_chunks_document_id_documents")),
        sa.UniqueConstraint("document_id", "ordinal", name=op.f("uq_chunks_document_id_ordinal")),
    )
    op.create_table(
        "job_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_name", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("items_done", sa.Integer(), nullable=False),
        sa.Column("items_total", sa.Integer(), nullable=True),
        sa.Column("current_item", sa.Text(), nullable=True),
        sa.Column("errors", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_runs")),
        sa.CheckConstraint("status IN ('running', 'done', 'failed', 'interrupted')",
                           name=op.f("ck_job_runs_status")),
    )
    op.create_index(op.f("ix_job_runs_job_name_started_at"), "job_runs", ["job_name", "started_at"])
    op.create_table(
        "request_stats",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("lane", sa.String(16), nullable=False),
        sa.Column("member", sa.String(64), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("queue_ms", sa.Float(), nullable=True),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("e2e_ms", sa.Float(), nullable=True),
        sa.Column("preemptions", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_request_stats")),
    )
    op.create_index(op.f("ix_request_stats_created_at"), "request_stats", ["created_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_request_stats_created_at"), table_name="request_stats")
    op.drop_table("request_stats")
    op.drop_index(op.f("ix_job_runs_job_name_started_at"), table_name="job_runs")
    op.drop_table("job_runs")
    op.drop_table("chunks")
    op.drop_table("documents")
