"""The lanes a member may use (issue 26): until now any member could pick any lane, so one
member's streams on the voice lane could hold everyone's chat back for minutes.

Members who are not admins get a settings row (if they had none) holding what they may use
from now on: chat and the background lanes (summaries, indexing, embeddings), and their
default lane when it is another one (Home Assistant's member on voice keeps voice). Admins
keep every lane (their `lanes` stays empty: `homeai.store.members.allowed_lanes`).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Frozen here: the defaults when this revision was written, whatever they become later. A
# default lane is one of the five lanes, and only voice is not among the defaults.
DEFAULTS = "chat,summaries,indexing,embeddings"
WITH_VOICE = "voice," + DEFAULTS

members = sa.table("members", sa.column("id", sa.Integer), sa.column("role", sa.String))
settings = sa.table("member_settings", sa.column("member_id", sa.Integer), sa.column("default_lane", sa.String),
                    sa.column("lanes", sa.String))


def upgrade() -> None:
    op.add_column("member_settings", sa.Column("lanes", sa.String(128), nullable=True))
    not_admins = sa.select(members.c.id).where(members.c.role != "admin")
    # Plain statements, no rows read here: the migration also renders as SQL (offline).
    op.execute(settings.insert().from_select(
        ["member_id", "lanes"],
        sa.select(members.c.id, sa.literal(DEFAULTS)).where(
            members.c.role != "admin", members.c.id.not_in(sa.select(settings.c.member_id)))))
    op.execute(settings.update().where(settings.c.member_id.in_(not_admins)).values(
        lanes=sa.case((settings.c.default_lane == "voice", WITH_VOICE), else_=DEFAULTS)))


def downgrade() -> None:
    with op.batch_alter_table("member_settings") as batch:
        batch.drop_column("lanes")
