"""Members' settings: for now a default lane, where their requests go when they name none
(Home Assistant's member on voice). A table of its own, not a column of `members`: the row
authentication reads stays as it was.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "member_settings",
        sa.Column("member_id", sa.Integer(), nullable=False),
        sa.Column("default_lane", sa.String(16), nullable=True),
        sa.PrimaryKeyConstraint("member_id", name=op.f("pk_member_settings")),
        sa.ForeignKeyConstraint(["member_id"], ["members.id"], ondelete="CASCADE",
                                name=op.f("fk_member_settings_member_id_members")),
    )


def downgrade() -> None:
    op.drop_table("member_settings")
