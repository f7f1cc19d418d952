"""A trusted proxy member (issue 27): a tool such as Open WebUI serves several people with one
member's token, and says which person asks in a header (`[clients] proxy_user_header`). For a
member marked as a proxy that header is the key its users are shared fairly by; every member
there is now is not one (`false`), so nobody's header counts until an admin says so
(`homeai members proxy NAME`).

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("member_settings", sa.Column("proxy", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("member_settings") as batch:
        batch.drop_column("proxy")
