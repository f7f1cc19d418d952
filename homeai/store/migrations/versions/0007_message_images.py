"""Images sent with household messages (issue 53): each file as it came, with its media type and its
place among the message's images; deleted with its message.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

MEDIA_TYPES = ", ".join(f"'{t}'" for t in ("image/png", "image/jpeg", "image/webp", "image/gif", "image/bmp"))


def upgrade() -> None:
    op.create_table(
        "message_images",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("message_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("media_type", sa.String(16), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_message_images")),
        sa.ForeignKeyConstraint(["message_id"], ["messages.id"], ondelete="CASCADE",
                                name=op.f("fk_message_images_message_id_messages")),
        sa.UniqueConstraint("message_id", "position", name=op.f("uq_message_images_message_id_position")),
        sa.CheckConstraint(f"media_type IN ({MEDIA_TYPES})", name=op.f("ck_message_images_media_type")),
    )


def downgrade() -> None:
    op.drop_table("message_images")
